package recovery

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// TestRecoverRefusals: each check that fails refuses the conversation with a message
// that says what and why, and leaves the file system exactly as it was.
func TestRecoverRefusals(t *testing.T) {
	goldenInput := func(name string) string { return filepath.Join("testdata", "golden", name, "input.jsonl") }
	type setup struct {
		lines [][]byte
		m     mirrortest.Mirrored
		head  mirror.Head
		root  string // the recorded root
		local string // the recorded file's path
	}
	cases := []struct {
		name    string
		input   string
		blobs   int
		opts    Options
		prepare func(t *testing.T, s *setup)                        // edit what is mirrored and what is on disk
		damage  func(t *testing.T, tm *mirrortest.Mirror, s *setup) // edit the mirror after it is written
		want    []string                                            // substrings of the reason
	}{
		{name: "existing file", input: "missing_middle",
			prepare: func(t *testing.T, s *setup) { mirrortest.WriteFile(t, s.local, mirrortest.JoinLines(s.lines[:4])) },
			want:    []string{"exists and differs", "--force overwrites it"}},
		{name: "local file holds lines the mirror lacks", input: "missing_middle", opts: Options{Force: true},
			prepare: func(t *testing.T, s *setup) {
				extra := []byte(`{"type":"message","id":"e0000008","parentId":"e0000007","timestamp":"2026-11-01T09:00:08.000Z","message":{"role":"user","content":[]}}`)
				mirrortest.WriteFile(t, s.local, mirrortest.JoinLines(append(append([][]byte{}, s.lines...), extra)))
			},
			want: []string{"holds what the mirror lacks", "line 9 (entry e0000008)", "--force does not override"}},
		{name: "local file with a torn tail", input: "missing_middle", opts: Options{Force: true},
			prepare: func(t *testing.T, s *setup) {
				mirrortest.WriteFile(t, s.local, append(mirrortest.JoinLines(s.lines), `{"type":"mess`...))
			},
			want: []string{"holds what the mirror lacks", "a torn last line of 13 bytes"}},
		{name: "head mismatch", input: "missing_middle",
			prepare: func(t *testing.T, s *setup) { s.head.Head = "e0000003" },
			want:    []string{`head mismatch`, `"e0000007"`, `"e0000003"`, "--force writes it anyway"}},
		{name: "digest mismatch", input: "missing_middle",
			prepare: func(t *testing.T, s *setup) { s.m.Msgs[5].SHA256 = session.Digest([]byte("something else")) },
			want:    []string{"digest mismatch", "line 6 (ordinal 5)"}},
		{name: "blob digest mismatch", input: "blob", blobs: 400,
			prepare: func(t *testing.T, s *setup) {},
			// The writer refuses to store bytes under another digest's name, so the damage
			// is done behind its back, as a bucket edited by hand or a disk fault would.
			damage: func(t *testing.T, tm *mirrortest.Mirror, s *setup) {
				for sha, b := range s.m.Blobs {
					tm.PlantBlob(t, sha, bytes.Replace(b, []byte("x"), []byte("y"), 1))
					break
				}
			},
			want: []string{"digest mismatch", "blob"}},
		{name: "source path leaving the root", input: "missing_middle",
			prepare: func(t *testing.T, s *setup) { s.head.Source = "../../elsewhere/x.jsonl" },
			want:    []string{"unsafe output path", "leaves the root"}},
		{name: "absolute source path", input: "missing_middle",
			prepare: func(t *testing.T, s *setup) { s.head.Source = "/etc/x.jsonl" },
			want:    []string{"unsafe output path"}},
		{name: "relative root", input: "missing_middle",
			prepare: func(t *testing.T, s *setup) { s.head.Root = "sessions" },
			want:    []string{"unsafe output path", "not absolute", "--out"}},
		{name: "root outside the configured roots", input: "missing_middle", opts: Options{Force: true},
			prepare: func(t *testing.T, s *setup) { s.head.Root = filepath.Join(filepath.Dir(s.root), "elsewhere") },
			want:    []string{"outside the roots", "elsewhere", "--root", "--out"}},
		{name: "root climbing out of a configured one", input: "missing_middle",
			prepare: func(t *testing.T, s *setup) { s.head.Root = s.root + "/../../.." },
			want:    []string{"outside the roots"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tm := newTestMirror(t)
			base := t.TempDir()
			s := &setup{lines: mirrortest.ReadLines(t, goldenInput(tc.input)), root: filepath.Join(base, "sessions")}
			s.m = mirrortest.MirrorFile(t, s.lines, 1, tc.blobs)
			s.head = mirrortest.DaemonHead(s.lines, s.m, 1)
			s.head.Root = s.root
			s.local = filepath.Join(s.root, filepath.FromSlash(s.head.Source))
			tc.prepare(t, s)
			tm.Publish(t, s.m, s.m.Msgs, &s.head)
			if tc.damage != nil {
				tc.damage(t, tm, s)
			}
			before := snapshot(t, base)

			opts := tc.opts
			opts.Roots = []string{s.root}
			rep := New(tm.Reader, opts).One(mirrortest.Ctx(t), s.m.Conv)
			if rep.Result != Refused {
				t.Fatalf("result %s (%s), want refused", rep.Result, rep.Reason)
			}
			for _, w := range tc.want {
				if !strings.Contains(rep.Reason, w) {
					t.Errorf("reason %q lacks %q", rep.Reason, w)
				}
			}
			if after := snapshot(t, base); !sameSnapshot(before, after) {
				t.Errorf("the file system changed:\nbefore %v\nafter  %v", keys(before), keys(after))
			}
		})
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestRecoverOutcomes covers the outcomes that are not refusals: forced overwrite,
// unchanged, dry run, not found, and the modes of what is written.
func TestRecoverOutcomes(t *testing.T) {
	tm := newTestMirror(t)
	root := filepath.Join(t.TempDir(), "new", "sessions")
	lines, m, head := tm.MirrorInput(t, filepath.Join("testdata", "golden", "complete", "input.jsonl"), 1, 0, root)
	ctx := mirrortest.Ctx(t)
	path := filepath.Join(root, filepath.FromSlash(head.Source))

	rep := New(tm.Reader, Options{DryRun: true, Roots: []string{root}}).One(ctx, m.Conv)
	if rep.Result != DryRun || rep.Output != path {
		t.Fatalf("dry run: %s %s: %s", rep.Result, rep.Output, rep.Reason)
	}
	if _, err := os.Stat(filepath.Dir(root)); !os.IsNotExist(err) {
		t.Fatalf("the dry run created %s", filepath.Dir(root))
	}

	rep = New(tm.Reader, Options{Roots: []string{root}}).One(ctx, m.Conv)
	if rep.Result != Written {
		t.Fatalf("%s: %s", rep.Result, rep.Reason)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700, root: 0o700, filepath.Dir(root): 0o700} {
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Mode().Perm(); got&^want != 0 {
			t.Errorf("%s: mode %v, want at most %v", p, got, want)
		}
	}

	rep = New(tm.Reader, Options{Roots: []string{root}}).One(ctx, m.Conv)
	if rep.Result != Unchanged {
		t.Fatalf("second run: %s: %s", rep.Result, rep.Reason)
	}

	mirrortest.WriteFile(t, path, mirrortest.JoinLines(lines[:3])) // an older, shorter copy: every line is mirrored
	rep = New(tm.Reader, Options{Force: true, Roots: []string{root}}).One(ctx, m.Conv)
	if rep.Result != Written || !rep.Forced {
		t.Fatalf("forced: %s (forced %v): %s", rep.Result, rep.Forced, rep.Reason)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, mirrortest.JoinLines(lines)) {
		t.Fatal("forced overwrite: not the mirrored file")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}

	for _, key := range []string{"no-such-conversation"} {
		rep := New(tm.Reader, Options{Roots: []string{root}}).One(ctx, key)
		if rep.Result != Failed || !strings.Contains(rep.Reason, "not found") {
			t.Errorf("%s: %s %s", key, rep.Result, rep.Reason)
		}
	}
}

// TestRecoverIsolation: a conversation of another owner is "not found", never listed.
func TestRecoverIsolation(t *testing.T) {
	alice := newTestMirror(t)
	lines := mirrortest.ReadLines(t, filepath.Join("testdata", "golden", "missing_first", "input.jsonl"))
	m := mirrortest.MirrorFile(t, lines, 1, 0)
	head := mirrortest.DaemonHead(lines, m, 1)
	alice.Publish(t, m, m.Msgs, &head)

	url := alice.JS.Conn().ConnectedUrl()
	for _, other := range [][2]string{{"t1", "bob"}, {"t2", "alice"}} {
		tm := mirrortest.For(t, url, other[0], other[1])
		rep := New(tm.Reader, Options{Out: t.TempDir()}).One(mirrortest.Ctx(t), m.Conv)
		if rep.Result != Failed || !strings.Contains(rep.Reason, "not found") {
			t.Errorf("%v: %s %s", other, rep.Result, rep.Reason)
		}
		sel, err := Select(mirrortest.Ctx(t), tm.Reader, nil, true)
		if err != nil || len(sel.Keys) != 0 {
			t.Errorf("%v sees %v (%v)", other, sel.Keys, err)
		}
	}
	sel, err := Select(mirrortest.Ctx(t), alice.Reader, nil, true)
	if err != nil || len(sel.Keys) != 1 || sel.Keys[0] != m.Conv {
		t.Errorf("alice sees %v (%v)", sel.Keys, err)
	}
}

// TestRecoverOutConfinement: with --out, an id that would name a path outside the output
// directory refuses, and a symbolic link in the tree cannot lead a write out of it.
func TestRecoverOutConfinement(t *testing.T) {
	tm := newTestMirror(t)
	lines := mirrortest.ReadLines(t, filepath.Join("testdata", "golden", "missing_first", "input.jsonl"))
	lines[0] = bytes.Replace(lines[0], []byte(`"id":"0192f0a4-5e1c-7a3b-9c2d-000000000003"`), []byte(`"id":"x/../../../escape"`), 1)
	m := mirrortest.MirrorFile(t, lines, 1, 0)
	head := mirrortest.DaemonHead(lines, m, 1)
	tm.Publish(t, m, m.Msgs, &head)
	base := t.TempDir()
	out := filepath.Join(base, "out")
	rep := New(tm.Reader, Options{Out: out}).One(mirrortest.Ctx(t), m.Conv)
	if rep.Result != Refused || !strings.Contains(rep.Reason, "unsafe output path") {
		t.Fatalf("%s: %s", rep.Result, rep.Reason)
	}

	// A symbolic link where the session directory goes, pointing outside.
	lines2 := mirrortest.ReadLines(t, filepath.Join("testdata", "golden", "missing_middle", "input.jsonl"))
	m2 := mirrortest.MirrorFile(t, lines2, 1, 0)
	head2 := mirrortest.DaemonHead(lines2, m2, 1)
	tm.Publish(t, m2, m2.Msgs, &head2)
	outside := filepath.Join(base, "outside")
	if err := os.MkdirAll(outside, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(out, "--home-dev-alpha--")); err != nil {
		t.Fatal(err)
	}
	rep = New(tm.Reader, Options{Out: out}).One(mirrortest.Ctx(t), m2.Conv)
	if rep.Result.OK() {
		t.Fatalf("written through a symbolic link leading out: %s", rep.Output)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("files written outside the output directory: %v", entries)
	}
}
