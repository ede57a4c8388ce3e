package checkpoint

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/sysmem"
)

// TestReleasePages: the pages of the database the process has read leave its resident
// memory, and every record reads the same afterwards.
func TestReleasePages(t *testing.T) {
	dir := t.TempDir()
	s, _, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 2000
	for i := range n {
		s.Put(Record{Dev: 1, Ino: uint64(i), Root: "/home/someone/.pi/agent/sessions",
			Rel:     fmt.Sprintf("--home-someone-project--/2026-12-02T04-25-16-000Z_%08d.jsonl", i),
			LastSHA: strings.Repeat("ab", 32), Offset: int64(i)})
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.All(); err != nil { // reads every page through the mapping
		t.Fatal(err)
	}
	path := filepath.Join(dir, "checkpoints.db")
	before, err := sysmem.Resident(path)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip("resident memory of a mapping not known on this system")
	}
	if err != nil {
		t.Fatal(err)
	}
	if before < 64<<10 {
		t.Fatalf("%d bytes of the database resident after reading it all: the test reads nothing", before)
	}
	if err := s.ReleasePages(sysmem.Unmap); err != nil {
		t.Fatal(err)
	}
	if after, err := sysmem.Resident(path); err != nil || after != 0 {
		t.Errorf("%d bytes of the database resident after ReleasePages (%d before), want 0 (%v)", after, before, err)
	}
	for i := range n {
		if r, ok := s.Get(Key(1, uint64(i))); !ok || r.Offset != int64(i) {
			t.Fatalf("record %d after ReleasePages: %+v, %v", i, r, ok)
		}
	}
}
