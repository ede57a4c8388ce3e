package store

import (
	"testing"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// TestApplyLeaf: a conversation's head follows Pi's leaf rule (session.Leaf) over its
// lines in file order: an entry moves it to its id, a leaf record to its target (null
// included), while a raw line, a v1 entry and a line stored out of order leave it; each
// entry remembers the head right after it, for a retried append's reply.
func TestApplyLeaf(t *testing.T) {
	entry := func(ord int64, id, typ string) scanned {
		return scanned{Line: mirror.Line{Kind: mirror.KindEntry, EntryID: id, EntryType: typ, Ordinal: ord, Format: string(session.FormatV3)}, seq: uint64(ord + 1)}
	}
	leaf := func(ord int64, id, target string) scanned {
		s := entry(ord, id, "leaf")
		s.targetID = target
		return s
	}
	raw := func(ord int64) scanned {
		return scanned{Line: mirror.Line{Kind: mirror.KindRaw, EntryID: mirror.OrdinalID(ord), Ordinal: ord, Format: string(session.FormatV3)}, seq: uint64(ord + 1)}
	}
	v1 := func(ord int64) scanned {
		s := entry(ord, mirror.OrdinalID(ord), "message")
		s.Format = string(session.FormatV1)
		return s
	}
	for _, tc := range []struct {
		name  string
		lines []scanned
		head  string
		after map[string]string // entry id → the head right after it
	}{
		{name: "no entries", head: ""},
		{name: "entries", lines: []scanned{entry(1, "a1", "message"), entry(2, "b2", "message")}, head: "b2",
			after: map[string]string{"a1": "a1", "b2": "b2"}},
		{name: "a leaf record moves it back", lines: []scanned{entry(1, "a1", "message"), entry(2, "b2", "message"), leaf(3, "c3", "a1")},
			head: "a1", after: map[string]string{"c3": "a1"}},
		{name: "a leaf record to null", lines: []scanned{entry(1, "a1", "message"), leaf(2, "c3", "")}, head: "", after: map[string]string{"c3": ""}},
		{name: "a raw line leaves it", lines: []scanned{entry(1, "a1", "message"), raw(2)}, head: "a1"},
		{name: "a v1 entry leaves it", lines: []scanned{entry(1, "a1", "message"), v1(2)}, head: "a1",
			after: map[string]string{mirror.OrdinalID(2): "a1"}},
		{name: "an entry without an id leaves it, as the daemon's head does", lines: []scanned{entry(1, "a1", "message"), entry(2, mirror.OrdinalID(2), "message")},
			head: "a1", after: map[string]string{mirror.OrdinalID(2): "a1"}},
		{name: "a line stored out of order does not move it", lines: []scanned{entry(2, "b2", "message"), entry(1, "a1", "message")},
			head: "b2", after: map[string]string{"a1": "a1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &conv{lastOrdinal: 0, ids: map[string]entryRef{}}
			for _, m := range tc.lines {
				c.apply(m)
			}
			if got := c.leaf.ID(); got != tc.head {
				t.Errorf("head %q, want %q", got, tc.head)
			}
			for id, want := range tc.after {
				if got := c.ids[id].head; got != want {
					t.Errorf("head after %s: %q, want %q", id, got, want)
				}
			}
		})
	}
}
