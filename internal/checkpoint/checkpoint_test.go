package checkpoint

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPutCommitReopen(t *testing.T) {
	dir := t.TempDir()
	s, rebuilt, err := Open(dir, nil)
	if err != nil || rebuilt {
		t.Fatalf("open: %v rebuilt=%v", err, rebuilt)
	}
	a := Record{Dev: 1, Ino: 10, Conversation: "c1", Offset: 100, Ordinal: 3, StreamSeq: 7, LastSHA: "x"}
	b := Record{Dev: 1, Ino: 11, Conversation: "c2", Offset: 5}
	s.Put(a)
	s.Put(b)
	if got, ok := s.Get(a.Key()); !ok || got.Offset != 100 {
		t.Fatalf("staged record not visible: %+v %v", got, ok)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	b.Offset = 50
	s.Put(b)
	s.Delete(a.Key())
	if err := s.Close(); err != nil { // Close commits what is staged
		t.Fatal(err)
	}
	s, _, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.Get(a.Key()); ok {
		t.Error("deleted record came back")
	}
	if got, ok := s.Get(b.Key()); !ok || got.Offset != 50 {
		t.Errorf("record b = %+v, %v; want offset 50", got, ok)
	}
	all, err := s.All()
	if err != nil || len(all) != 1 {
		t.Errorf("All = %d records, %v", len(all), err)
	}
	c := Record{Dev: 2, Ino: 12}
	s.Put(c) // staged: listed too
	keys, err := s.Keys()
	if err != nil || !slices.Equal(slices.Sorted(slices.Values(keys)), []string{b.Key(), c.Key()}) {
		t.Errorf("Keys = %v, %v; want %s and %s", keys, err, b.Key(), c.Key())
	}
	offsets := map[string]int64{}
	if err := s.Each(func(r Record) error { offsets[r.Key()] = r.Offset; return nil }); err != nil || len(offsets) != 2 ||
		offsets[b.Key()] != 50 || offsets[c.Key()] != 0 {
		t.Errorf("Each = %v, %v; want %s at 50 and the staged %s", offsets, err, b.Key(), c.Key())
	}
}

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		key      string
		dev, ino uint64
		ok       bool
	}{
		{Key(66306, 1234567), 66306, 1234567, true},
		{Key(0, 0), 0, 0, true},
		{Key(1<<64-1, 1<<64-1), 1<<64 - 1, 1<<64 - 1, true},
		{"12", 0, 0, false},
		{"a:1", 0, 0, false},
		{"1:", 0, 0, false},
		{"1:2:3", 0, 0, false},
	} {
		dev, ino, err := ParseKey(tc.key)
		if (err == nil) != tc.ok || dev != tc.dev || ino != tc.ino {
			t.Errorf("ParseKey(%q) = %d, %d, %v", tc.key, dev, ino, err)
		}
	}
}

// TestCorruptStoreIsReplaced: a store that is not a database is moved aside and
// replaced; the caller learns it must rebuild from the mirror.
func TestCorruptStoreIsReplaced(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "checkpoints.db"), []byte("this is not bbolt"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(nil)
	s, rebuilt, err := Open(dir, m)
	if err != nil || !rebuilt {
		t.Fatalf("open corrupt store: %v rebuilt=%v", err, rebuilt)
	}
	defer s.Close()
	if n := testutil.ToFloat64(m.errors.WithLabelValues("corrupt")); n != 1 {
		t.Errorf("corrupt counter = %v", n)
	}
	aside, _ := filepath.Glob(filepath.Join(dir, "checkpoints.db.corrupt-*"))
	if len(aside) != 1 {
		t.Errorf("corrupt store not kept aside: %v", aside)
	}
	s.Put(Record{Dev: 2, Ino: 3})
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestCommitCostIndependentOfFileCount pins the O(1)-per-commit property: a commit after
// one change writes one record, however many files the store holds.
func TestCommitCostIndependentOfFileCount(t *testing.T) {
	s, _, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 5000 {
		s.Put(Record{Dev: 1, Ino: uint64(i)})
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	before := testutil.ToFloat64(s.metrics.records)
	s.Put(Record{Dev: 1, Ino: 42, Offset: 9})
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(s.metrics.records) - before; n != 1 {
		t.Errorf("commit of one change wrote %v records", n)
	}
}

func TestMissingDirectoryIsCreatedPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	s, _, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state directory mode %v, %v", fi.Mode().Perm(), err)
	}
}
