package verify

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// TestVerify compares local files with one mirrored conversation and checks each kind of
// drift, and that what is only pending or torn is not drift.
func TestVerify(t *testing.T) {
	tm := mirrortest.New(t)
	lines := mirrortest.ReadLines(t, filepath.Join("testdata", "sessions", "missing_middle", "input.jsonl"))
	m := mirrortest.MirrorFile(t, lines, 1, 400)
	head := mirrortest.DaemonHead(lines, m, 1)
	tm.Publish(t, m, m.Msgs, &head)
	newLine := []byte(`{"type":"message","id":"e00000aa","parentId":"e0000007","timestamp":"2026-11-01T09:00:09.000Z","message":{"role":"user","content":[]}}`)
	edit := func(f func(ls [][]byte) [][]byte) []byte {
		return mirrortest.JoinLines(f(append([][]byte(nil), lines...)))
	}
	cases := []struct {
		name    string
		content []byte
		want    string // kind@line/mirrorLine, comma-separated
		pending int64
		torn    int64
	}{
		{name: "identical", content: mirrortest.JoinLines(lines)},
		{name: "pending line", content: edit(func(ls [][]byte) [][]byte { return append(ls, newLine) }), pending: 1},
		{name: "torn tail", content: append(mirrortest.JoinLines(lines), `{"type":`...), torn: 8},
		{name: "changed", content: edit(func(ls [][]byte) [][]byte {
			ls[3] = []byte(strings.Replace(string(ls[3]), "three", "four", 1))
			return ls
		}), want: "changed@4/4"},
		{name: "deleted", content: edit(func(ls [][]byte) [][]byte { return append(ls[:4], ls[5:]...) }), want: "missing@0/5"},
		{name: "inserted", content: edit(func(ls [][]byte) [][]byte {
			return append(ls[:3], append([][]byte{newLine}, ls[3:]...)...)
		}), want: "extra@4/0"},
		{name: "swapped", content: edit(func(ls [][]byte) [][]byte { ls[5], ls[6] = ls[6], ls[5]; return ls }), want: "order@7/6"},
		{name: "truncated", content: mirrortest.JoinLines(lines[:6]), want: "missing@0/7,missing@0/8"},
	}
	dir := t.TempDir()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".jsonl")
			mirrortest.WriteFile(t, path, tc.content)
			d, err := Verify(mirrortest.Ctx(t), tm.Reader, path, head)
			if err != nil {
				t.Fatal(err)
			}
			if got := driftString(d); got != tc.want {
				t.Errorf("drift %q, want %q", got, tc.want)
			}
			if d.PendingLines != tc.pending || d.TornBytes != tc.torn {
				t.Errorf("pending %d, torn %d; want %d, %d", d.PendingLines, d.TornBytes, tc.pending, tc.torn)
			}
			if d.Drifted() != (tc.want != "") {
				t.Errorf("Drifted() = %v", d.Drifted())
			}
		})
	}

	t.Run("hole in the mirror", func(t *testing.T) {
		lines := mirrortest.ReadLines(t, filepath.Join("testdata", "sessions", "missing_first", "input.jsonl"))
		m := mirrortest.MirrorFile(t, lines, 1, 0)
		head := mirrortest.DaemonHead(lines, m, 1)
		tm.Publish(t, m, mirrortest.Without(m.Msgs, []int64{4}), &head)
		path := filepath.Join(dir, "hole.jsonl")
		mirrortest.WriteFile(t, path, mirrortest.JoinLines(lines))
		d, err := Verify(mirrortest.Ctx(t), tm.Reader, path, head)
		if err != nil {
			t.Fatal(err)
		}
		if got := driftString(d); got != "extra@5/0" {
			t.Errorf("drift %q", got)
		}
	})
	t.Run("not mirrored", func(t *testing.T) {
		_, err := Verify(mirrortest.Ctx(t), tm.Reader, filepath.Join(dir, "identical.jsonl"), mirror.Head{Key: "nobody"})
		if !errors.Is(err, mirror.ErrNotFound) {
			t.Errorf("error %v, want not found", err)
		}
	})
}

func driftString(d Drift) string {
	var parts []string
	for _, it := range d.Items {
		parts = append(parts, fmt.Sprintf("%s@%d/%d", it.Kind, it.Line, it.MirrorLine))
	}
	return strings.Join(parts, ",")
}

func otherHost(h *mirror.Head) *mirror.Head {
	h.Host = "h2"
	return h
}

// TestStatusDiverged: a conversation whose copies on two hosts both went on past their
// shared lines is diverged on either host, the detail naming both hosts and keys; a
// copy not synced yet keeps its state.
func TestStatusDiverged(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	conv := mirror.Head{Conversation: "c", Key: "c", Host: "hb", Root: "/b", Source: "x.jsonl", Generation: 1, Bytes: 100, UpdatedAt: now}
	copyA := mirror.Head{Conversation: "c", Key: "c~0a0b0c0d", Host: "ha", Root: "/a", Source: "x.jsonl", Generation: 1, Bytes: 120, UpdatedAt: now,
		DivergedFrom: &mirror.Divergence{Key: "c", Generation: 1, Ordinal: 3, Host: "hb"}}
	other := mirror.Head{Conversation: "d", Key: "d", Host: "hb", Root: "/b", Source: "y.jsonl", Generation: 1, Bytes: 50, UpdatedAt: now}
	file := func(path string, size int64) *LocalFile {
		return &LocalFile{Path: path, Size: size, HeaderOK: true, ModTime: now}
	}
	o, _ := mirror.NewOwner("t1", "alice")
	heads := []mirror.Head{conv, copyA, other}
	for _, tc := range []struct {
		name   string
		host   string
		pair   Pair
		state  State
		detail []string
	}{
		{"the copy mirrored apart", "ha", Pair{File: file("/a/x.jsonl", 120), Head: &copyA}, StateDiverged,
			[]string{"(ha's)", "hb's continues", "after line 3", "c~0a0b0c0d", "pisync recover --conversation c~0a0b0c0d"}},
		{"the copy mirrored apart, lines pending", "ha", Pair{File: file("/a/x.jsonl", 150), Head: &copyA}, StatePending, nil},
		{"the copy going on under the conversation's key", "hb", Pair{File: file("/b/x.jsonl", 100), Head: &conv}, StateDiverged,
			[]string{"(hb's) continues", "ha's copy", "c~0a0b0c0d"}},
		{"another conversation", "hb", Pair{File: file("/b/y.jsonl", 50), Head: &other}, StateSynced, nil},
	} {
		rep := Status(Surveyed{Pairs: []Pair{tc.pair}, Heads: heads}, o, tc.host, now)
		s := rep.Sessions[0]
		if s.State != tc.state {
			t.Errorf("%s: state %s (%s), want %s", tc.name, s.State, s.Detail, tc.state)
		}
		for _, w := range tc.detail {
			if !strings.Contains(s.Detail, w) {
				t.Errorf("%s: detail %q lacks %q", tc.name, s.Detail, w)
			}
		}
		if rep.Mirror.Diverged != 1 || rep.Mirror.Conversations != 3 {
			t.Errorf("%s: mirror totals %+v", tc.name, rep.Mirror)
		}
	}
}

// TestStatusStates checks the state of each kind of session and the totals.
func TestStatusStates(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	hour := now.Add(-time.Hour)
	head := func(bytes int64) *mirror.Head {
		return &mirror.Head{Conversation: "c", Key: "c", Host: "h1", Generation: 2, Bytes: bytes, Entries: 3, UpdatedAt: hour}
	}
	storeHead := func(bytes int64, local *mirror.LocalCopy) *mirror.Head {
		h := head(bytes)
		h.Writer, h.Local = mirror.WriterStore, local
		return h
	}
	shrunkHead := func(bytes int64) *mirror.Head {
		h := head(bytes)
		h.Shrunk = &mirror.Shrink{From: 1, Missing: 40, Reason: mirror.ShrinkHeaderOnly}
		return h
	}
	file := func(size, torn int64) *LocalFile {
		return &LocalFile{Path: "/r/x.jsonl", Size: size, Torn: torn, HeaderOK: true, ModTime: now.Add(-time.Minute)}
	}
	cases := []struct {
		name  string
		pair  Pair
		state State
		lag   float64
		pct   float64
	}{
		{"synced", Pair{File: file(100, 0), Head: head(100)}, StateSynced, 0, 100},
		{"pending", Pair{File: file(150, 0), Head: head(100)}, StatePending, 3600, 100 * 100.0 / 150},
		{"torn", Pair{File: file(120, 20), Head: head(100)}, StateTorn, 3600, 100 * 100.0 / 120},
		{"pending and torn", Pair{File: file(170, 20), Head: head(100)}, StatePending, 3600, 100 * 100.0 / 170},
		{"shorter than the mirror", Pair{File: file(80, 0), Head: head(100)}, StateError, 0, 100},
		{"unreadable", Pair{File: &LocalFile{Path: "/r/y.jsonl", Err: os.ErrPermission}, Head: nil}, StateError, 0, 0},
		{"not mirrored", Pair{File: file(100, 0), Head: nil}, StateNotMirrored, 60, 0},
		{"first line torn", Pair{File: &LocalFile{Path: "/r/z.jsonl", Size: 10, Torn: 10, ModTime: now}, Head: nil}, StateTorn, 0, 0},
		{"local file missing", Pair{File: nil, Head: head(100)}, StateMissing, 0, 100},
		// DESIGN §8: the session store writes the conversation since the cut-over.
		{"store writes, file unchanged", Pair{File: file(100, 0), Head: storeHead(100, nil)}, StateSynced, 0, 100},
		{"store writes, file appended to", Pair{File: file(150, 0), Head: storeHead(100, nil)}, StateDrift, 0, 100 * 100.0 / 150},
		{"store writes, appends mirrored apart", Pair{File: file(150, 0), Head: storeHead(100, &mirror.LocalCopy{Generation: 3, Bytes: 150})}, StateDrift, 0, 100},
		// A fresh header written over the session: every line of it is mirrored, and
		// the session is not safe.
		{"shrunk", Pair{File: file(100, 0), Head: shrunkHead(100)}, StateShrunk, 0, 100},
		// Failover: another host's copy of the conversation went on past this file.
		{"behind another host's copy", Pair{File: file(80, 0), Head: otherHost(head(100))}, StateBehind, 0, 100},
		{"another host's copy, this file longer", Pair{File: file(150, 0), Head: otherHost(head(100))}, StatePending, 3600, 100 * 100.0 / 150},
	}
	var pairs []Pair
	for _, tc := range cases {
		s := sessionStatus(tc.pair, "h1", now)
		if s.State != tc.state || s.LagSeconds != tc.lag || fmt.Sprintf("%.3f", s.Percent) != fmt.Sprintf("%.3f", tc.pct) {
			t.Errorf("%s: state %s lag %v percent %.1f; want %s %v %.1f (%s)", tc.name, s.State, s.LagSeconds, s.Percent, tc.state, tc.lag, tc.pct, s.Detail)
		}
		pairs = append(pairs, tc.pair)
	}
	o, _ := mirror.NewOwner("t1", "alice")
	rep := Status(Surveyed{Pairs: pairs, Heads: []mirror.Head{*head(100), {Host: "h2", Bytes: 50, Entries: 2, LocalDeleted: true}}}, o, "h1", now)
	if rep.Local.Sessions != len(cases) || rep.Local.States[StateError] != 2 || rep.Local.MaxLagSeconds != 3600 {
		t.Errorf("host totals %+v", rep.Local)
	}
	if m := rep.Mirror; m.Conversations != 2 || m.Hosts != 2 || m.Bytes != 150 || m.Entries != 5 || m.LocalDeleted != 1 {
		t.Errorf("mirror totals %+v", m)
	}
}

// TestSurvey pairs local files with heads: by host, root and path; by conversation id
// for a file recorded elsewhere; and heads whose file is gone.
func TestSurvey(t *testing.T) {
	tm := mirrortest.New(t)
	root := t.TempDir()
	var heads []mirror.Head
	for _, name := range []string{"missing_middle", "missing_first", "three_consecutive_missing", "v1"} {
		lines := mirrortest.ReadLines(t, filepath.Join("testdata", "sessions", name, "input.jsonl"))
		m := mirrortest.MirrorFile(t, lines, 1, 0)
		h := mirrortest.DaemonHead(lines, m, 1)
		h.Root = root
		switch name {
		case "missing_first":
			h.Source = "--moved--/" + filepath.Base(h.Source) // recorded before a move
		case "three_consecutive_missing":
			h.Host = "otherhost"
		}
		tm.Publish(t, m, m.Msgs, &h)
		heads = append(heads, h)
		if name != "v1" { // v1 is deleted locally
			mirrortest.WriteFile(t, filepath.Join(root, filepath.FromSlash(m.Source)), mirrortest.JoinLines(lines))
		}
	}
	// The first file's copy diverged after another host continued its conversation: it
	// is mirrored whole under a key of its own, while its conversation's head still
	// names it (the other host's head not written yet).
	lines := mirrortest.ReadLines(t, filepath.Join("testdata", "sessions", "missing_middle", "input.jsonl"))
	dm := mirrortest.MirrorFile(t, lines, 1, 0)
	dm.Conv = heads[0].Key + "~0a0b0c0d"
	dh := heads[0]
	dh.Key, dh.DivergedFrom = dm.Conv, &mirror.Divergence{Key: heads[0].Key, Generation: 1, Ordinal: 2, Host: "otherhost"}
	tm.Publish(t, dm, dm.Msgs, &dh)
	mirrortest.WriteFile(t, filepath.Join(root, "notes.jsonl"), []byte("{\"hello\":1}\n")) // not a session
	mirrortest.WriteFile(t, filepath.Join(root, "--new--", "fresh.jsonl"), []byte(`{"type":"session","version":3,"id":"fresh","timestamp":"t","cwd":"/new"}`+"\n"))

	sv, err := Survey(mirrortest.Ctx(t), tm.Reader, []string{root}, "testhost")
	if err != nil {
		t.Fatal(err)
	}
	pairs, all := sv.Pairs, sv.Heads
	if len(all) != 5 {
		t.Fatalf("%d heads", len(all))
	}
	got := map[string]string{}
	for _, p := range pairs {
		switch {
		case p.File == nil:
			got["missing:"+p.Head.Key] = p.Head.Source
		case p.File.Skipped != "":
			got["skipped:"+p.File.Skipped] = p.File.Rel
		case p.Head == nil:
			got["unmirrored:"+p.File.Header.ID] = p.File.Rel
		default:
			got["paired:"+p.Head.Key] = p.File.Rel
		}
	}
	want := map[string]string{
		"paired:" + dh.Key:        heads[0].Source,
		"paired:" + heads[1].Key:  "--home-dev-alpha--/" + filepath.Base(heads[1].Source),
		"paired:" + heads[2].Key:  heads[2].Source,
		"missing:" + heads[3].Key: heads[3].Source,
		"unmirrored:fresh":        "--new--/fresh.jsonl",
		"skipped:not_entries":     "notes.jsonl", // listed, never invisible
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("survey\n got %v\nwant %v", got, want)
	}
}
