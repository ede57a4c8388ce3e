package recovery

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// planBytes is the rebuilt file of a plan without blobs.
func planBytes(t testing.TB, p *Plan) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, l := range p.Lines {
		if l.Data == nil {
			t.Fatalf("line %d is a blob; this test does not stream blobs", l.Ordinal+1)
		}
		b.Write(l.Data)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func linesOf(msgs []mirror.Msg) []Line {
	out := make([]Line, len(msgs))
	for i, m := range msgs {
		out[i] = LineFromMsg(m)
	}
	return out
}

// TestRebuildGolden rebuilds each testdata/golden case from its input file with the
// given ordinals removed from the mirror, and compares the file and the report with the
// golden ones (go test ./recovery -run TestRebuildGolden -update rewrites them).
func TestRebuildGolden(t *testing.T) {
	cases := []struct {
		name         string
		drop         []int64 // ordinals the mirror lost
		dropRaw      bool
		noHead       bool
		identical    bool // the rebuilt file must be the input, byte for byte
		placeholders []string
		synthesized  bool
		conflicts    []ConflictKind
	}{
		{name: "complete", identical: true, conflicts: nil},
		{name: "missing_middle", drop: []int64{4}, placeholders: []string{"e0000004"}},
		{name: "missing_first", drop: []int64{1}, placeholders: []string{"e0000001"}},
		{name: "missing_leaf_target", drop: []int64{3, 4}, placeholders: []string{"b0000003"}},
		{name: "two_children_missing_parent", drop: []int64{2}, placeholders: []string{"f0000002"}},
		{name: "three_consecutive_missing", drop: []int64{3, 4, 5}, placeholders: []string{"e0000005"}},
		{name: "missing_header", drop: []int64{0}, synthesized: true},
		{name: "missing_header_no_head", drop: []int64{0}, noHead: true, synthesized: true},
		{name: "raw_lines", identical: true},
		{name: "raw_dropped", dropRaw: true},
		{name: "dangling_complete", identical: true, conflicts: []ConflictKind{ConflictDangling}},
		{name: "conflicts", identical: true, conflicts: []ConflictKind{ConflictDuplicateID, ConflictForward, ConflictCycle}},
		{name: "v1", identical: true},
		{name: "v1_missing_header", drop: []int64{0}, synthesized: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join("testdata", "golden", tc.name)
			input := mirrortest.ReadLines(t, filepath.Join(dir, "input.jsonl"))
			m := mirrortest.MirrorFile(t, input, 1, 0)
			head := mirrortest.DaemonHead(input, m, 1)
			in := Input{Key: m.Conv, Generation: 1, Generations: []int{1}, Head: &head, DropRaw: tc.dropRaw,
				Lines: linesOf(mirrortest.Without(m.Msgs, tc.drop))}
			if tc.noHead {
				in.Head = nil
			}
			p, err := Rebuild(in)
			if err != nil {
				t.Fatal(err)
			}
			got := planBytes(t, p)
			checkGolden(t, filepath.Join(dir, "output.jsonl"), got)
			checkGolden(t, filepath.Join(dir, "report.json"), reportJSON(t, p.Report, ""))

			if tc.identical && !bytes.Equal(got, mirrortest.JoinLines(input)) {
				t.Errorf("a complete mirror must rebuild the file byte for byte")
			}
			if p.HeadMismatch {
				t.Errorf("head check: %s", p.Report.HeadCheck)
			}
			var ids []string
			for _, ph := range p.Report.Placeholders {
				ids = append(ids, ph.ID)
			}
			if strings.Join(ids, ",") != strings.Join(tc.placeholders, ",") {
				t.Errorf("placeholders %v, want %v", ids, tc.placeholders)
			}
			if p.Report.HeaderSynthesized != tc.synthesized {
				t.Errorf("header synthesized: %v, want %v", p.Report.HeaderSynthesized, tc.synthesized)
			}
			var kinds []ConflictKind
			for _, c := range p.Report.Conflicts {
				kinds = append(kinds, c.Kind)
			}
			if !sameSet(kinds, tc.conflicts) {
				t.Errorf("conflicts %v, want %v", kinds, tc.conflicts)
			}
			if len(tc.drop) > 0 {
				checkTree(t, session.SplitLines(got), p)
			}
		})
	}
}

// checkTree checks what a gap-filled file must be for Pi: a header Pi accepts, every line
// an entry, every parentId and leaf target naming an entry of the file, each placeholder
// just before the first line that names it, and no entry id twice.
func checkTree(t *testing.T, lines [][]byte, p *Plan) {
	t.Helper()
	if _, err := session.ParseHeader(lines[0]); err != nil {
		t.Fatalf("line 1: %v", err)
	}
	ids := map[string]int{}
	var envs []session.Envelope
	for i, l := range lines[1:] {
		env, err := session.ScanEntry(l)
		if err != nil {
			t.Fatalf("line %d: %v", i+2, err)
		}
		envs = append(envs, env)
		if env.ID != "" {
			if _, dup := ids[env.ID]; dup {
				t.Fatalf("line %d: id %s twice", i+2, env.ID)
			}
			ids[env.ID] = i + 2
		}
	}
	for i, env := range envs {
		refs := []string{env.ParentID}
		if env.Type == "leaf" {
			refs = append(refs, env.TargetID)
		}
		for _, ref := range refs {
			if _, ok := ids[ref]; ref != "" && !ok {
				t.Errorf("line %d names %s, which is not in the rebuilt file", i+2, ref)
			}
		}
	}
	for _, ph := range p.Report.Placeholders {
		if ids[ph.ID] != ph.Line {
			t.Errorf("placeholder %s reported at line %d, found at %d", ph.ID, ph.Line, ids[ph.ID])
		}
		next := envs[ph.Line-1] // the line after the placeholder (envs[k] is line k+2)
		if next.ParentID != ph.ID && next.TargetID != ph.ID {
			t.Errorf("placeholder %s is not just before a line naming it", ph.ID)
		}
		if !strings.Contains(string(lines[ph.Line-1]), `"customType":"`+PlaceholderType+`"`) {
			t.Errorf("placeholder %s: %s", ph.ID, lines[ph.Line-1])
		}
	}
}

// TestRebuildOrderOfArrival: whatever order the messages are stored in, the file comes
// back in ordinal order (DESIGN §3.3).
func TestRebuildOrderOfArrival(t *testing.T) {
	input := mirrortest.ReadLines(t, filepath.Join("testdata", "golden", "complete", "input.jsonl"))
	m := mirrortest.MirrorFile(t, input, 1, 0)
	head := mirrortest.DaemonHead(input, m, 1)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		lines := linesOf(m.Msgs)
		rng.Shuffle(len(lines), func(i, j int) { lines[i], lines[j] = lines[j], lines[i] })
		p, err := Rebuild(Input{Key: m.Conv, Generation: 1, Lines: lines, Head: &head})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(planBytes(t, p), mirrortest.JoinLines(input)) {
			t.Fatal("shuffled messages rebuilt another file")
		}
	}
}

// TestRebuildChecks covers the failures and findings that are not golden cases.
func TestRebuildChecks(t *testing.T) {
	input := mirrortest.ReadLines(t, filepath.Join("testdata", "golden", "missing_middle", "input.jsonl"))
	m := mirrortest.MirrorFile(t, input, 1, 0)
	base := mirrortest.DaemonHead(input, m, 1)
	cases := []struct {
		name  string
		edit  func(lines []Line, h *mirror.Head) []Line
		err   error
		check func(t *testing.T, p *Plan)
	}{
		{name: "digest mismatch refuses", err: ErrDigest, edit: func(ls []Line, _ *mirror.Head) []Line {
			ls[3].Data = bytes.Replace(ls[3].Data, []byte("three"), []byte("THREE"), 1)
			return ls
		}},
		{name: "head mismatch", edit: func(ls []Line, h *mirror.Head) []Line { h.Head = "e0000003"; return ls },
			check: func(t *testing.T, p *Plan) {
				if !p.HeadMismatch || !strings.HasPrefix(p.Report.HeadCheck, "mismatch") {
					t.Errorf("head check %q", p.Report.HeadCheck)
				}
			}},
		{name: "head behind the mirror is checked at its ordinal", edit: func(ls []Line, h *mirror.Head) []Line {
			h.LastOrdinal, h.Head = 5, "e0000005"
			return ls
		}, check: func(t *testing.T, p *Plan) {
			if p.HeadMismatch || !p.Report.Complete {
				t.Errorf("head check %q, complete %v", p.Report.HeadCheck, p.Report.Complete)
			}
		}},
		{name: "lost tail", edit: func(ls []Line, h *mirror.Head) []Line { return ls[:6] },
			check: func(t *testing.T, p *Plan) {
				if p.Report.Complete || !hasConflict(p.Report, ConflictMissingTail) || !p.HeadMismatch {
					t.Errorf("complete %v, conflicts %+v, head check %q", p.Report.Complete, p.Report.Conflicts, p.Report.HeadCheck)
				}
			}},
		{name: "same ordinal twice, other bytes", edit: func(ls []Line, _ *mirror.Head) []Line {
			dup := ls[2]
			dup.Seq, dup.SHA256 = 100, strings.Repeat("0", 64)
			return append(ls, dup)
		}, check: func(t *testing.T, p *Plan) {
			if !hasConflict(p.Report, ConflictOrdinal) || !bytes.Equal(planBytes(t, p), mirrortest.JoinLines(input)) {
				t.Errorf("conflicts %+v", p.Report.Conflicts)
			}
		}},
		{name: "same ordinal twice, same bytes", edit: func(ls []Line, _ *mirror.Head) []Line {
			dup := ls[2]
			dup.Seq = 100
			return append(ls, dup)
		}, check: func(t *testing.T, p *Plan) {
			if p.Report.Duplicates != 1 || len(p.Report.Conflicts) != 0 {
				t.Errorf("duplicates %d, conflicts %+v", p.Report.Duplicates, p.Report.Conflicts)
			}
		}},
		{name: "no lines", err: errors.New("no lines"), edit: func([]Line, *mirror.Head) []Line { return nil }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			head := base
			lines := tc.edit(linesOf(m.Msgs), &head)
			p, err := Rebuild(Input{Key: m.Conv, Generation: 1, Lines: lines, Head: &head})
			switch {
			case tc.err != nil && err == nil:
				t.Fatalf("no error, want %v", tc.err)
			case tc.err != nil && !errors.Is(err, tc.err) && !strings.Contains(err.Error(), tc.err.Error()):
				t.Fatalf("error %v, want %v", err, tc.err)
			case tc.err == nil && err != nil:
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, p)
			}
		})
	}
}

func hasConflict(r Report, k ConflictKind) bool {
	for _, c := range r.Conflicts {
		if c.Kind == k {
			return true
		}
	}
	return false
}

// TestRebuildRandomHoles: over generated sessions (leaf records included) with random
// lines lost, the rebuilt file is a tree Pi can load, and its leaf is the leaf of the
// mirrored lines alone: placeholders never move it, so the head check agrees with the
// daemon's rule.
func TestRebuildRandomHoles(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 200 {
		f := sessiontest.New(rng, "/unused", "/home/dev/p", sessiontest.HarnessV3)
		lines := [][]byte{f.HeaderLine("/home/dev/p")}
		for range 5 + rng.IntN(40) {
			lines = append(lines, f.Entry(200))
		}
		m := mirrortest.MirrorFile(t, lines, 1, 0)
		var drop []int64
		for o := 1; o < len(lines); o++ {
			if rng.IntN(4) == 0 {
				drop = append(drop, int64(o))
			}
		}
		kept := mirrortest.Without(m.Msgs, drop)
		var mirroredLeaf session.Leaf
		for _, msg := range kept[1:] {
			env, _ := session.ScanEntry(msg.Data)
			mirroredLeaf.Apply(env)
		}
		p, err := Rebuild(Input{Key: m.Conv, Generation: 1, Lines: linesOf(kept)})
		if err != nil {
			t.Fatal(err)
		}
		if p.Report.Leaf != mirroredLeaf.ID() {
			t.Fatalf("session %d: rebuilt leaf %q, mirrored lines' leaf %q", i, p.Report.Leaf, mirroredLeaf.ID())
		}
		if len(drop) > 0 {
			checkTree(t, session.SplitLines(planBytes(t, p)), p)
		} else if !bytes.Equal(planBytes(t, p), mirrortest.JoinLines(lines)) {
			t.Fatalf("session %d: complete mirror, other bytes", i)
		}
	}
}

// BenchmarkRebuild measures the pure rebuild of a 500-entry session, with and without
// holes (the full recovery benchmark, mirror reads and writes included, is in bench/).
func BenchmarkRebuild(b *testing.B) {
	rng := rand.New(rand.NewPCG(11, 12))
	f := sessiontest.New(rng, "/unused", "/home/dev/bench", sessiontest.HarnessV3)
	lines := [][]byte{f.HeaderLine("/home/dev/bench")}
	for range 500 {
		lines = append(lines, f.Entry(400))
	}
	m := mirrortest.MirrorFile(b, lines, 1, 0)
	head := mirrortest.DaemonHead(lines, m, 1)
	for _, bc := range []struct {
		name string
		drop []int64
	}{{"complete", nil}, {"holes", []int64{10, 11, 200, 499}}} {
		in := Input{Key: m.Conv, Generation: 1, Lines: linesOf(mirrortest.Without(m.Msgs, bc.drop)), Head: &head}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Rebuild(in); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(in.Lines))/b.Elapsed().Seconds(), "entries/s")
		})
	}
}
