package mirror_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/pisync/pisync/mirror"
)

// gen describes the lines of one generation for TestHistory: "H" a header, "R" a raw
// line, "L" an entry without an id of its own, anything else an entry with that id. The
// digest of a line is its description, so that equal descriptions are equal lines.
type gen []string

func msgsOf(n int, lines gen, at time.Time) []mirror.Msg {
	var out []mirror.Msg
	for i, d := range lines {
		l := mirror.Line{Kind: mirror.KindEntry, EntryID: d, Ordinal: int64(i), Generation: n, SHA256: d}
		switch d {
		case "H":
			l.Kind, l.EntryID = mirror.KindHeader, mirror.HeaderEntryType
		case "R":
			l.Kind, l.EntryID = mirror.KindRaw, mirror.OrdinalID(int64(i))
		case "L":
			l.EntryID = mirror.OrdinalID(int64(i))
		}
		out = append(out, mirror.Msg{Line: l, Time: at.Add(time.Duration(i) * time.Second), Size: int64(len(d))})
	}
	return out
}

func TestHistory(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 14, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		gens []gen
		skip int // generation left out of the comparisons (the store's)
		want []*mirror.Shrink
	}{
		{"one generation", []gen{{"H", "a", "b"}}, 0, []*mirror.Shrink{nil}},
		{"appended to", []gen{{"H", "a"}, {"H", "a", "b"}}, 0, []*mirror.Shrink{nil, nil}},
		{"header-only overwrite", []gen{{"H", "a", "b", "c"}, {"H"}}, 0,
			[]*mirror.Shrink{nil, {From: 1, Missing: 3, Reason: mirror.ShrinkHeaderOnly}}},
		{"truncated to a prefix", []gen{{"H", "a", "b", "c"}, {"H", "a"}}, 0,
			[]*mirror.Shrink{nil, {From: 1, Missing: 2, Reason: mirror.ShrinkTruncated}}},
		{"a middle entry dropped", []gen{{"H", "a", "b", "c"}, {"H", "a", "c", "d"}}, 0,
			[]*mirror.Shrink{nil, {From: 1, Missing: 1, Reason: mirror.ShrinkDropped}}},
		{"rewrite keeping every entry, reordered, a raw line repaired away",
			[]gen{{"H", "a", "R", "b"}, {"H", "b", "a", "leaf1"}}, 0, []*mirror.Shrink{nil, nil}},
		{"v1 migrated to v3: new ids for every entry", []gen{{"H", "L", "L"}, {"H", "x1", "x2"}}, 0,
			[]*mirror.Shrink{nil, nil}},
		{"v1 migrated, one entry lost", []gen{{"H", "L", "L", "L"}, {"H", "x1", "x2"}}, 0,
			[]*mirror.Shrink{nil, {From: 1, Missing: 1, Reason: mirror.ShrinkDropped}}},
		{"compared with the generation before, not the first", []gen{{"H", "a"}, {"H", "a", "b"}, {"H", "a"}}, 0,
			[]*mirror.Shrink{nil, nil, {From: 2, Missing: 1, Reason: mirror.ShrinkTruncated}}},
		{"overwritten, then appended to and rewritten: still lacks what it lost", []gen{{"H", "a", "b"}, {"H"}, {"H", "c"}}, 0,
			[]*mirror.Shrink{nil, {From: 1, Missing: 2, Reason: mirror.ShrinkHeaderOnly}, {From: 1, Missing: 2, Reason: mirror.ShrinkDropped}}},
		{"a migration seen half done, then whole", []gen{{"H", "L", "L"}, {"H", "x1"}, {"H", "x1", "x2"}}, 0,
			[]*mirror.Shrink{nil, {From: 1, Missing: 1, Reason: mirror.ShrinkDropped}, nil}},
		{"restored after the damage", []gen{{"H", "a", "b"}, {"H"}, {"H", "a", "b"}}, 0,
			[]*mirror.Shrink{nil, {From: 1, Missing: 2, Reason: mirror.ShrinkHeaderOnly}, nil}},
		{"the store's generation is left out", []gen{{"H", "a"}, {"H", "a", "s1", "s2"}, {"H", "a", "b"}}, 2,
			[]*mirror.Shrink{nil, nil, nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h mirror.History
			if tc.skip != 0 {
				h.Skip = func(g int) bool { return g == tc.skip }
			}
			// Newest first, and every message twice: order and copies must not matter.
			for i := len(tc.gens) - 1; i >= 0; i-- {
				for _, m := range msgsOf(i+1, tc.gens[i], t0.Add(time.Duration(i)*time.Hour)) {
					h.Add(m)
					h.Add(m)
				}
			}
			got := h.Generations()
			if len(got) != len(tc.want) {
				t.Fatalf("%d generations, want %d", len(got), len(tc.want))
			}
			for i, g := range got {
				if g.Number != i+1 {
					t.Errorf("generation %d numbered %d", i+1, g.Number)
				}
				if !reflect.DeepEqual(g.Shrunk, tc.want[i]) {
					t.Errorf("generation %d: shrunk %+v, want %+v", g.Number, g.Shrunk, tc.want[i])
				}
				lines := tc.gens[i]
				var entries, bytes int64
				for _, d := range lines {
					if d != "H" && d != "R" {
						entries++
					}
					bytes += int64(len(d)) + 1
				}
				if g.Lines != int64(len(lines)) || g.Entries != entries || g.Bytes != bytes {
					t.Errorf("generation %d: %d lines, %d entries, %d bytes; want %d, %d, %d",
						g.Number, g.Lines, g.Entries, g.Bytes, len(lines), entries, bytes)
				}
				if len(lines) > 0 {
					first := t0.Add(time.Duration(i) * time.Hour)
					if !g.First.Equal(first) || !g.Last.Equal(first.Add(time.Duration(len(lines)-1)*time.Second)) {
						t.Errorf("generation %d stored %v to %v", g.Number, g.First, g.Last)
					}
				}
			}
		})
	}
}
