package recovery

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

// appendLine appends one whole line at path, as Pi does (open for append, one write,
// close).
func appendLine(t testing.TB, path string, line []byte) {
	t.Helper()
	if err := sessiontest.AppendBytes(path, append(append([]byte(nil), line...), '\n')); err != nil {
		t.Fatal(err)
	}
}

// extraLine is an entry the mirror does not have.
func extraLine(n int) []byte {
	return []byte(`{"type":"message","id":"f000000` + string(rune('0'+n)) + `","parentId":null,"timestamp":"2026-11-02T09:00:00.000Z","message":{"role":"user","content":[]}}`)
}

// appendingMirror appends a line to a file the first time a blob is read: a writer at
// work while recovery streams the rebuilt file, after it inspected the target.
type appendingMirror struct {
	Mirror
	once sync.Once
	path string
	line []byte
	t    testing.TB
}

func (m *appendingMirror) Blob(ctx context.Context, sha string) (io.ReadCloser, error) {
	m.once.Do(func() { appendLine(m.t, m.path, m.line) })
	return m.Mirror.Blob(ctx, sha)
}

// TestRecoverKeepsLinesAppendedAfterInspection: a line appended to the target after
// recovery inspected it (an older copy, which --force may replace) and before the
// rename is not lost: the target is checked again at the rename, and the conversation
// refused, the file left with its new line. Before the check, the rename replaced the
// file and the line was gone.
func TestRecoverKeepsLinesAppendedAfterInspection(t *testing.T) {
	tm := newTestMirror(t)
	root := t.TempDir()
	lines, m, head := tm.MirrorInput(t, filepath.Join("testdata", "golden", "blob", "input.jsonl"), 1, 400, root)
	path := filepath.Join(root, filepath.FromSlash(head.Source))
	older := mirrortest.JoinLines(lines[:3])
	mirrortest.WriteFile(t, path, older)
	am := &appendingMirror{Mirror: tm.Reader, path: path, line: extraLine(1), t: t}

	rep := New(am, Options{Force: true, Roots: []string{root}}).One(mirrortest.Ctx(t), m.Conv)
	if rep.Result != Refused || !strings.Contains(rep.Reason, "since it was inspected") {
		t.Errorf("%s (%s), want refused: written to since it was inspected", rep.Result, rep.Reason)
	}
	want := append(older, append(extraLine(1), '\n')...)
	if got, _ := os.ReadFile(path); !bytes.Equal(got, want) {
		t.Errorf("the file is not the older copy with the line appended:\n%s", got)
	}
	checkOnly(t, filepath.Dir(path), filepath.Base(path))
}

// checkOnly fails unless dir holds exactly the named files: no temporary file, no
// second name of a replaced file left behind.
func checkOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if !sameSet(got, names) {
		t.Errorf("%s holds %q, want %q", dir, got, names)
	}
}

// TestReplaceWindows writes to the target in each window of its commit: between the
// inspection and the check at the rename, between the check and the rename, through a
// descriptor opened before the rename and written after it, and after the directory is
// synced. Whatever was written stays at the path (the replaced file is put back) or,
// when the rebuilt file was written to as well, in a copy the report names. Nothing is
// left behind.
func TestReplaceWindows(t *testing.T) {
	type env struct {
		t       *testing.T
		path    string
		fd      *os.File // opened by a step, written by a later one
		written [][]byte // lines written to the file replaced
	}
	open := func(e *env) {
		f, err := os.OpenFile(e.path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			e.t.Fatal(err)
		}
		e.fd = f
	}
	writeFd := func(e *env) {
		if _, err := e.fd.Write(append(extraLine(2), '\n')); err != nil {
			e.t.Fatal(err)
		}
		e.fd.Close()
		e.written = append(e.written, extraLine(2))
	}
	appendNow := func(e *env) {
		appendLine(e.t, e.path, extraLine(1))
		e.written = append(e.written, extraLine(1))
	}
	cases := []struct {
		name     string
		noTarget bool // no file at the target when it is inspected
		steps    map[string]func(*env)
		result   Result
		reason   []string
		keptCopy bool // the rebuilt file, written to, is kept beside the target
	}{
		{name: "nothing written", result: Written},
		{name: "appended before the check", result: Refused, reason: []string{"since it was inspected"},
			steps: map[string]func(*env){"commit": appendNow}},
		{name: "appended between the check and the rename", result: Refused, reason: []string{"back as it was", "recover it again"},
			steps: map[string]func(*env){"checked": appendNow}},
		{name: "written across the rename", result: Refused, reason: []string{"back as it was"},
			steps: map[string]func(*env){"checked": open, "renamed": writeFd}},
		{name: "written after the directory sync", result: Refused, reason: []string{"back as it was"},
			steps: map[string]func(*env){"checked": open, "settle": writeFd}},
		{name: "written to both files", result: Failed, reason: []string{"merge them by hand", "-rebuilt"}, keptCopy: true,
			steps: map[string]func(*env){"checked": open, "renamed": func(e *env) {
				writeFd(e)
				appendLine(e.t, e.path, extraLine(3)) // into the rebuilt file, now at the path
			}}},
		{name: "replaced before the check", result: Refused, reason: []string{"was replaced since it was inspected"},
			steps: map[string]func(*env){"commit": func(e *env) {
				other := e.path + ".new"
				if err := os.WriteFile(other, append(extraLine(4), '\n'), 0o600); err != nil {
					e.t.Fatal(err)
				}
				if err := os.Rename(other, e.path); err != nil {
					e.t.Fatal(err)
				}
				e.written = [][]byte{extraLine(4)}
			}}},
		{name: "created after the inspection", noTarget: true, result: Refused, reason: []string{"a file is there now"},
			steps: map[string]func(*env){"commit": func(e *env) {
				appendLine(e.t, e.path, extraLine(5))
				e.written = [][]byte{extraLine(5)}
			}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tm := newTestMirror(t)
			root := t.TempDir()
			lines, m, head := tm.MirrorInput(t, filepath.Join("testdata", "golden", "complete", "input.jsonl"), 1, 0, root)
			path := filepath.Join(root, filepath.FromSlash(head.Source))
			var older []byte
			if !tc.noTarget {
				older = mirrortest.JoinLines(lines[:4])
				mirrortest.WriteFile(t, path, older)
			} else if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			e := &env{t: t, path: path}
			testHook = func(step string, tg target) {
				if f := tc.steps[step]; f != nil && tg.path() == path {
					f(e)
				}
			}
			t.Cleanup(func() { testHook = nil })

			rep := New(tm.Reader, Options{Force: true, Roots: []string{root}}).One(mirrortest.Ctx(t), m.Conv)
			if rep.Result != tc.result {
				t.Fatalf("%s (%s), want %s", rep.Result, rep.Reason, tc.result)
			}
			for _, w := range tc.reason {
				if !strings.Contains(rep.Reason, w) {
					t.Errorf("reason %q lacks %q", rep.Reason, w)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			want := mirrortest.JoinLines(lines)
			if tc.result != Written {
				want = older
				if tc.name == "replaced before the check" || tc.noTarget {
					want = nil
				}
				want = append(want, mirrortest.JoinLines(e.written)...)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the file at the target:\n%s\nwant:\n%s", got, want)
			}
			names := []string{filepath.Base(path)}
			if tc.keptCopy {
				entries, _ := os.ReadDir(filepath.Dir(path))
				for _, en := range entries {
					if strings.HasSuffix(en.Name(), "-rebuilt") {
						names = append(names, en.Name())
						kept, _ := os.ReadFile(filepath.Join(filepath.Dir(path), en.Name()))
						if wantKept := append(mirrortest.JoinLines(lines), append(extraLine(3), '\n')...); !bytes.Equal(kept, wantKept) {
							t.Errorf("the kept copy is not the rebuilt file with the line written to it:\n%s", kept)
						}
						if !strings.Contains(rep.Reason, en.Name()) {
							t.Errorf("the reason does not name the kept copy %s: %s", en.Name(), rep.Reason)
						}
					}
				}
			}
			checkOnly(t, filepath.Dir(path), names...)
		})
	}
}

// TestRecoverAllForceWhileAppending recovers every conversation with --force over older
// copies while writers append to them, Pi's way: some files all along, at random; some in
// a given window of the commit (between the check and the rename, across the rename,
// after the directory sync); some not at all. No appended line is ever lost: each is in
// the file at its path, or in a copy a report names. Files nobody writes to are
// recovered; nothing is left behind.
func TestRecoverAllForceWhileAppending(t *testing.T) {
	const nFiles = 48
	rng := rand.New(rand.NewPCG(3, 4))
	tm := newTestMirror(t)
	root := t.TempDir()
	type file struct {
		path     string
		mirrored []byte // the whole conversation
		older    []byte // the local copy recovery finds
	}
	files := make([]file, nFiles)
	index := map[string]int{}
	for i := range files {
		cwd := fmt.Sprintf("/home/dev/p%d", i%6)
		f := sessiontest.New(rng, root, cwd, sessiontest.Format(i%4))
		lines := [][]byte{f.HeaderLine(cwd)}
		for range 20 {
			lines = append(lines, f.Entry(300+rng.IntN(2000)))
		}
		m := mirrortest.MirrorFile(t, lines, 1, 1500)
		head := mirrortest.DaemonHead(lines, m, 1)
		head.Root = root
		tm.Publish(t, m, m.Msgs, &head)
		if err := f.Append(lines[:10]...); err != nil {
			t.Fatal(err)
		}
		files[i] = file{path: f.Path, mirrored: mirrortest.JoinLines(lines), older: mirrortest.JoinLines(lines[:10])}
		index[f.Path] = i
	}

	var mu sync.Mutex
	appended := make([][][]byte, nFiles)
	fds := map[int]*os.File{}
	seq := 0
	next := func(i int) []byte { // under mu
		seq++
		line := []byte(fmt.Sprintf(`{"type":"custom","id":"a%07d","parentId":null,"timestamp":"2026-11-03T09:00:00.000Z","customType":"appended","data":{"file":%d}}`, seq, i))
		appended[i] = append(appended[i], line)
		return append(line, '\n')
	}
	appendTo := func(i int) {
		mu.Lock()
		defer mu.Unlock()
		if err := sessiontest.AppendBytes(files[i].path, next(i)); err != nil {
			t.Error(err)
		}
	}
	// Files i%8 < 4 get random appends all along; i%4 selects the window a hook writes in.
	testHook = func(step string, tg target) {
		i, ok := index[tg.path()]
		if !ok {
			return
		}
		switch {
		case step == "checked" && i%4 == 0:
			appendTo(i)
		case step == "checked" && (i%4 == 1 || i%4 == 2):
			f, err := os.OpenFile(files[i].path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			fds[i] = f
			mu.Unlock()
		case (step == "renamed" && i%4 == 1) || (step == "settle" && i%4 == 2):
			mu.Lock()
			defer mu.Unlock()
			if f := fds[i]; f != nil {
				if _, err := f.Write(next(i)); err != nil {
					t.Error(err)
				}
				f.Close()
				delete(fds, i)
			}
		}
	}
	t.Cleanup(func() { testHook = nil })

	ctx := mirrortest.Ctx(t)
	stop := make(chan struct{})
	var writers sync.WaitGroup
	for w := range 3 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if i := r.IntN(nFiles); i%8 < 4 {
					appendTo(i)
				}
				time.Sleep(time.Duration(r.IntN(500)) * time.Microsecond) // pacing, not synchronization
			}
		}()
	}
	sel, err := Select(ctx, tm.Reader, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	reports := New(tm.Reader, Options{Force: true, Roots: []string{root}, Parallel: 4}).Run(ctx, sel)
	close(stop)
	writers.Wait()

	results := map[Result]int{}
	putBack := 0
	for _, rep := range reports {
		results[rep.Result]++
		if strings.Contains(rep.Reason, "back as it was") {
			putBack++
		}
		i := index[rep.Output]
		switch {
		case rep.Result == Written:
		case rep.Result == Refused && i%8 == 7:
			t.Errorf("%s: refused, yet nothing writes to it: %s", rep.Output, rep.Reason)
		case rep.Result == Failed && strings.Contains(rep.Reason, "-rebuilt"): // the rebuilt file was written to as well
		case rep.Result != Refused:
			t.Errorf("%s: %s (%s)", rep.Output, rep.Result, rep.Reason)
		}
	}
	t.Logf("results %v, %d put back after a write in the window", results, putBack)
	if results[Written] < nFiles/8 || putBack == 0 {
		t.Errorf("results %v, %d put back: the test did not exercise what it should", results, putBack)
	}
	for i, f := range files {
		got, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(got, f.older) && !bytes.HasPrefix(got, f.mirrored) {
			t.Errorf("%s: neither the older copy nor the recovered file", f.path)
		}
		dir := filepath.Dir(f.path)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			name := e.Name()
			switch {
			case strings.HasSuffix(name, "-rebuilt") && strings.HasPrefix(name, filepath.Base(f.path)):
				b, _ := os.ReadFile(filepath.Join(dir, name))
				got = append(got, b...)
			case !strings.HasSuffix(name, ".jsonl") && !strings.HasSuffix(name, "-rebuilt"):
				t.Errorf("left behind: %s", filepath.Join(dir, name))
			}
		}
		for _, l := range appended[i] {
			if !bytes.Contains(got, l) {
				t.Errorf("%s: the appended line %s is lost", f.path, l)
			}
		}
	}
}
