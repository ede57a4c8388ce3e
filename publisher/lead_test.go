package publisher

import (
	"errors"
	"testing"

	"github.com/pisync/pisync/watcher"
)

// TestLeadHolds: a line among the first ones must agree with where Open found the
// header; otherwise the file changed since Open looked at it, and is opened again. A
// title-first file overwritten by a fresh header between Open and the read of its lines
// mirrored the header as a raw line, and recovery then wrote a second header before it
// (torture seed 20261201).
func TestLeadHolds(t *testing.T) {
	const (
		hdr   = `{"type":"session","version":3,"id":"c1","timestamp":"t","cwd":"/w"}`
		other = `{"type":"session","version":3,"id":"c2","timestamp":"t","cwd":"/w"}`
		title = `{"type":"title","v":1,"title":"t"}`
		entry = `{"type":"message","id":"a1","parentId":null}`
	)
	for _, tc := range []struct {
		name     string
		headerAt int
		ordinal  int64
		line     string
		reopen   bool
	}{
		{"Pi's header at 0", 0, 0, hdr, false},
		{"an entry after it", 0, 1, entry, false},
		{"a header of another session at 0: still the header (the next run sees it changed)", 0, 0, other, false},
		{"no header at 0 any more", 0, 0, entry, true},
		{"the title before a header at 1", 1, 0, title, false},
		{"the header at 1", 1, 1, hdr, false},
		{"a fresh header where the title was", 1, 0, hdr, true},
		{"an entry where the header was", 1, 1, entry, true},
		{"a headerless file's entry", -1, 0, entry, false},
		{"a header in a file opened without one", -1, 2, hdr, true},
		{"past the first lines", -1, 40, hdr, false},
	} {
		st := &fileState{id: "c1", headerAt: tc.headerAt}
		err := leadHolds(st, watcher.Line{Ordinal: tc.ordinal, Data: []byte(tc.line)})
		if got := errors.Is(err, watcher.ErrReopen); got != tc.reopen {
			t.Errorf("%s: reopen %v (%v), want %v", tc.name, got, err, tc.reopen)
		}
	}
}
