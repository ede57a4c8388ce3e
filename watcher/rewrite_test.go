package watcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

// TestCopyTruncate covers a file rewritten in place (as Pi's migration of a v1 file
// does) to a shorter, same-size or larger content: each is one Open(Truncated) and the
// new content delivered from the start. The same-size case is the one a size check
// alone misses.
func TestCopyTruncate(t *testing.T) {
	old := session("rewrite-old", 5)
	cases := []struct {
		name  string
		lines []string
	}{
		{"smaller", session("rewrite-old", 2)},
		{"same size, other ids", func() []string {
			l := slices.Clone(old)
			l[5] = strings.Replace(l[5], "rewr0005", "REWR0005", 1)
			return l
		}()},
		{"larger, new header", session("rewrite-new", 9)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			p := filepath.Join(root, "s.jsonl")
			writeFile(t, p, joinLines(old...))
			h := start(t, newRecSink(), []string{root}, nil)
			h.ready(t)
			waitLines(t, h.sink, p, old...)
			if err := os.WriteFile(p, []byte(joinLines(c.lines...)), 0o644); err != nil {
				t.Fatal(err)
			}
			waitLines(t, h.sink, p, append(slices.Clone(old), c.lines...)...)
			if r := h.sink.reasons(p); len(r) != 2 || r[1] != Truncated {
				t.Fatalf("opens %v", r)
			}
			h.noGone(t)
		})
	}
}

func TestAtomicReplace(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	old := session("replace-a", 3)
	writeFile(t, p, joinLines(old...))
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	waitLines(t, h.sink, p, old...)
	oldID := h.sink.find("open", p)[0].f.ID

	repl := session("replace-a", 4) // a repair rewrites everything, with one more line
	tmp := filepath.Join(root, ".s.jsonl.tmp")
	writeFile(t, tmp, joinLines(repl...))
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	waitLines(t, h.sink, p, append(slices.Clone(old), repl...)...)
	opens := h.sink.find("open", p)
	if len(opens) != 2 || opens[1].why != Replaced || opens[1].f.ID == oldID {
		t.Fatalf("opens %+v", opens)
	}
	appendFile(t, p, "{\"after\":1}\n")
	waitLines(t, h.sink, p, append(append(slices.Clone(old), repl...), `{"after":1}`)...)
	h.noGone(t)
}

func TestRenameWithinRootIsMoved(t *testing.T) {
	root := t.TempDir()
	a := filepath.Join(root, "--w--", "a.jsonl")
	b := filepath.Join(root, "--elsewhere--", "b.jsonl")
	lines := session("moved-aa", 3)
	writeFile(t, a, joinLines(lines...))
	if err := os.MkdirAll(filepath.Dir(b), 0o755); err != nil {
		t.Fatal(err)
	}
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	waitLines(t, h.sink, a, lines...)
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Moved", func() bool { return len(h.sink.find("open", b)) == 1 })
	if c := h.sink.find("open", b)[0]; c.why != Moved || c.f.Rel != "--elsewhere--/b.jsonl" {
		t.Fatalf("open %v %q", c.why, c.f.Rel)
	}
	appendFile(t, b, "{\"next\":4}\n")
	waitLines(t, h.sink, b, `{"next":4}`)
	if l := h.sink.find("line", b)[0].line; l.Ord != 4 {
		t.Fatalf("ordinal after move %d", l.Ord)
	}
	h.noGone(t)
	// The directory renamed: its file is Moved again, its watches follow.
	renameDir := filepath.Join(root, "--renamed--")
	if err := os.Rename(filepath.Dir(b), renameDir); err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(renameDir, "b.jsonl")
	waitFor(t, "Moved with its directory", func() bool { return len(h.sink.find("open", c)) == 1 })
	appendFile(t, c, "{\"next\":5}\n")
	waitLines(t, h.sink, c, `{"next":5}`)
	h.noGone(t)
	if n := len(h.sink.find("line", "")); n != len(lines)+2 {
		t.Fatalf("%d lines delivered in all", n)
	}
}

func TestDeleteIsGone(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	writeFile(t, p, joinLines(session("deleted-x", 1)...))
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Gone", func() bool { return len(h.sink.find("gone", p)) == 1 })
	waitFor(t, "forgotten", func() bool { return h.w.Stats().Files == 0 })
}

func TestDirDeletedAndRecreated(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "--w--", "sub")
	p1, p2 := filepath.Join(dir, "one.jsonl"), filepath.Join(dir, "two.jsonl")
	writeFile(t, p1, joinLines(session("dir-one", 1)...))
	writeFile(t, p2, joinLines(session("dir-two", 1)...))
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	if err := os.RemoveAll(filepath.Dir(dir)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both Gone", func() bool { return len(h.sink.find("gone", "")) == 2 })
	waitFor(t, "watches dropped", func() bool { return h.w.Stats().Dirs == 1 })
	p3 := filepath.Join(dir, "three.jsonl")
	writeFile(t, p3, joinLines(session("dir-three", 2)...))
	waitLines(t, h.sink, p3, session("dir-three", 2)...)
	appendFile(t, p3, "{}\n")
	waitLines(t, h.sink, p3, append(session("dir-three", 2), "{}")...)
}

func TestRootDeletedAndRecreated(t *testing.T) {
	root := filepath.Join(t.TempDir(), "sessions")
	p := filepath.Join(root, "--w--", "s.jsonl")
	writeFile(t, p, joinLines(session("root-gone", 1)...))
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Gone", func() bool { return len(h.sink.find("gone", p)) == 1 })
	waitFor(t, "root waited for", func() bool { return h.w.Stats().WaitingRoots == 1 })
	writeFile(t, p, joinLines(session("root-back", 2)...))
	waitLines(t, h.sink, p, append(session("root-gone", 1), session("root-back", 2)...)...)
	appendFile(t, p, "{}\n")
	waitLines(t, h.sink, p, append(append(session("root-gone", 1), session("root-back", 2)...), "{}")...)
}

func TestNestedDirRenamed(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "a", "b", "s.jsonl")
	lines := session("nested-rename", 2)
	writeFile(t, p, joinLines(lines...))
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	if err := os.Rename(filepath.Join(root, "a"), filepath.Join(root, "z")); err != nil {
		t.Fatal(err)
	}
	q := filepath.Join(root, "z", "b", "s.jsonl")
	waitFor(t, "Moved", func() bool { return len(h.sink.find("open", q)) == 1 })
	// Events of the renamed subdirectory now carry its new path.
	appendFile(t, q, "{}\n")
	waitLines(t, h.sink, q, "{}")
	r := filepath.Join(root, "z", "b", "new.jsonl")
	writeFile(t, r, joinLines(session("nested-new", 1)...))
	waitLines(t, h.sink, r, session("nested-new", 1)...)
	if st := h.w.Stats(); st.Dirs != 3 {
		t.Fatalf("stats %+v", st)
	}
	h.noGone(t)
}

// TestRewriteDuringRead pins issue 13 item 1: a file rewritten in place (same inode,
// same header, Pi's open-truncate-write) while the watcher reads it in small chunks.
// Every delivered line must be a whole line of one content at its ordinal (never the
// start of one content glued to the end of the other), the rewrite must be a Truncated
// open, and the lines after that open must equal the new content.
func TestRewriteDuringRead(t *testing.T) {
	for _, at := range []int64{1, 2, 4} {
		t.Run(fmt.Sprintf("rewrite at line %d", at), func(t *testing.T) {
			root := t.TempDir()
			p := filepath.Join(root, "s.jsonl")
			old := session("glue-old", 6)
			// Same header, other entries of other lengths: line boundaries move.
			repl := []string{old[0]}
			for i := 1; i <= 7; i++ {
				repl = append(repl, fmt.Sprintf(`{"type":"message","id":"new%05d","parentId":null,"message":{"role":"assistant","content":"%s"}}`, i, strings.Repeat("x", 10*i)))
			}
			writeFile(t, p, joinLines(old...))
			sink := newRecSink()
			var once sync.Once
			sink.line = func(f File, l Line) error {
				if l.Ordinal == at {
					once.Do(func() { rewriteLines(t, p, repl) })
				}
				return nil
			}
			h := start(t, sink, []string{root}, func(o *Options) { o.ReadBuffer = 64 })
			h.ready(t)
			waitFor(t, "the new content after a Truncated open", func() bool {
				opens := sink.find("open", p)
				if len(opens) < 2 || opens[len(opens)-1].why != Truncated {
					return false
				}
				return len(sinceLastOpen(sink, p)) == len(repl)
			})
			if got := sinceLastOpen(sink, p); strings.Join(got, "\n") != strings.Join(repl, "\n") {
				t.Fatalf("after the reopen: %q", got)
			}
			for _, c := range sink.find("line", p) {
				o := c.line.Ord
				if !(o < int64(len(old)) && c.line.Data == old[o]) && !(o < int64(len(repl)) && c.line.Data == repl[o]) {
					t.Errorf("line %d is of neither content: %q", o, c.line.Data)
				}
			}
		})
	}
}

// rewriteLines rewrites path in place as Pi does (sessiontest.Rewrite). It may run on a
// watcher goroutine (a sink hook): it reports with t.Error, not t.Fatal.
func rewriteLines(t *testing.T, path string, lines []string) {
	b := make([][]byte, len(lines))
	for i, s := range lines {
		b[i] = []byte(s)
	}
	if err := sessiontest.Rewrite(path, b); err != nil {
		t.Error(err)
	}
}

// overwrite writes content over path from its start without truncating it: the file is
// never shorter than before, so no run sees a rewrite half done as a truncation.
func overwrite(t *testing.T, path, content string) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt([]byte(content), 0); err != nil {
		t.Fatal(err)
	}
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
}

// sinceLastOpen returns the lines delivered for path after its last Open.
func sinceLastOpen(s *recSink, path string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.calls {
		if c.f.Path != path {
			continue
		}
		switch c.op {
		case "open":
			out = nil
		case "line":
			out = append(out, c.line.Data)
		}
	}
	return out
}

// TestRewriteOfEarlierLineSameSize: Pi rewrites a file in place (truncate, one write per
// entry) and changes a line before the last delivered one to another of the same length;
// header, line boundaries and last line stay. The settled check must find it within
// seconds, whether the rewrite comes after the back-fill or during it (from inside
// Sink.Line), and also when the back-fill's first run ends early (the sink refuses a
// line once, as a publisher does when NATS hiccups): the first run that completes then
// sees the rewritten file, and only the stat taken when the file was opened tells it
// changed.
func TestRewriteOfEarlierLineSameSize(t *testing.T) {
	for _, mode := range []string{"after back-fill", "during back-fill", "during back-fill, line refused once"} {
		during := mode != "after back-fill"
		refuse := strings.HasSuffix(mode, "refused once")
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			p := filepath.Join(root, "s.jsonl")
			old := session("same-len", 6)
			repl := slices.Clone(old)
			repl[2] = strings.Replace(repl[2], "same0002", "SAME0002", 1)
			if len(repl[2]) != len(old[2]) || repl[2] == old[2] {
				t.Fatal("bad fixture")
			}
			writeFile(t, p, joinLines(old...))
			rewrite := func() {
				b := make([][]byte, len(repl))
				for i, s := range repl {
					b[i] = []byte(s)
				}
				if err := sessiontest.Rewrite(p, b); err != nil {
					t.Error(err)
				}
			}
			sink := newRecSink()
			if during {
				var once sync.Once
				sink.line = func(f File, l Line) error {
					if l.Ordinal != 4 {
						return nil
					}
					first := false
					once.Do(func() { rewrite(); first = true })
					if first && refuse {
						return errors.New("publish failed")
					}
					return nil
				}
			}
			h := start(t, sink, []string{root}, func(o *Options) { o.SettleDelay = 50 * time.Millisecond })
			h.ready(t)
			if !during {
				waitLines(t, sink, p, old...)
				rewrite()
			}
			waitFor(t, "the rewritten line after a Truncated open", func() bool {
				return strings.Join(sinceLastOpen(sink, p), "\n") == strings.Join(repl, "\n")
			})
			if r := sink.reasons(p); r[len(r)-1] != Truncated {
				t.Fatalf("opens %v", r)
			}
		})
	}
}

// TestReopen: what background verification asks for when it finds drift.
func TestReopen(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	lines := session("reopen-x", 3)
	writeFile(t, p, joinLines(lines...))
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	waitLines(t, h.sink, p, lines...)
	if h.w.Reopen(filepath.Join(root, "nope.jsonl")) {
		t.Fatal("Reopen of an unknown file")
	}
	if !h.w.Reopen(p) {
		t.Fatal("Reopen of a known file")
	}
	waitFor(t, "a Truncated open", func() bool { r := h.sink.reasons(p); return len(r) == 2 && r[1] == Truncated })
	waitLines(t, h.sink, p, append(slices.Clone(lines), lines...)...)
}

// TestRewriteAfterResumeIsRechecked: a tail resumed from a Start (a checkpoint after a
// restart) has no fold of the lines before it; the first settled check after a change
// reopens it as Rechecked, so a same-size rewrite of an earlier line is not missed
// (torture seed 20261201: SIGKILL, then such a rewrite).
func TestRewriteAfterResumeIsRechecked(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	old := session("resumed1", 6)
	writeFile(t, p, joinLines(old...))
	resumeAt := int64(len(joinLines(old[:4]...)))
	sink := newRecSink()
	sink.open = func(f File, why OpenReason) (Start, error) {
		if why == Discovered {
			return Start{Offset: resumeAt, Ordinal: 4}, nil // as from a checkpoint
		}
		return Start{}, nil
	}
	h := start(t, sink, []string{root}, func(o *Options) { o.SettleDelay = 50 * time.Millisecond })
	h.ready(t)
	waitLines(t, sink, p, old[4:]...)
	repl := slices.Clone(old)
	repl[2] = strings.Replace(repl[2], "resu0002", "RESU0002", 1)
	// The changed bytes are written over the old ones, the file never shorter: a run that
	// saw a rewrite half done (truncated) would reopen the file as Truncated, not the
	// Rechecked this test is about.
	overwrite(t, p, joinLines(repl...))
	waitFor(t, "the whole file after a Rechecked open", func() bool {
		return strings.Join(sinceLastOpen(sink, p), "\n") == strings.Join(repl, "\n")
	})
	if r := sink.reasons(p); r[len(r)-1] != Rechecked {
		t.Fatalf("opens %v", r)
	}
}

// TestRewriteWhileAwayIsRechecked: torture seed 20261201. While the daemon was down, Pi
// rewrote an earlier line (same size) and appended more; the checkpoint's last line is
// unchanged, so the tail resumes from it. Lines past the Start mean the file changed while
// away: the settled check has it compared with the mirror (Rechecked).
func TestRewriteWhileAwayIsRechecked(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	old := session("awayaway", 4)
	resumeAt := int64(len(joinLines(old...)))
	now := session("awayaway", 7)
	now[2] = strings.Replace(now[2], "away0002", "AWAY0002", 1)
	writeFile(t, p, joinLines(now...))
	resumedIsRechecked(t, root, p, Start{Offset: resumeAt, Ordinal: 5}, now)
}

// TestShrinkAfterOpenIsTruncated: torture T11 (seed 724214427034). A file replaced by
// rename is opened (Replaced) at its new size; before anything of it is delivered, Pi
// truncates it in place to its first lines. Nothing delivered changed (the tail is at the
// start, the header stays), but the sink was told a size, and compared that content with
// its mirror, that the file no longer has: it is opened again as Truncated, at its new
// size. Before the fix the tail went on from the start without a reopen, and the sink
// kept the old size (the daemon reported the vanished bytes as backlog forever).
func TestShrinkAfterOpenIsTruncated(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	old := session("shrunken", 3)
	writeFile(t, p, joinLines(old...))
	repl := session("shrunken", 40)
	short := repl[:3]
	sink := newRecSink()
	var once sync.Once
	sink.open = func(f File, why OpenReason) (Start, error) {
		if why == Replaced {
			once.Do(func() { rewriteLines(t, p, short) })
		}
		return Start{}, nil
	}
	h := start(t, sink, []string{root}, nil)
	h.ready(t)
	waitLines(t, sink, p, old...)
	tmp := filepath.Join(root, ".s.jsonl.tmp")
	writeFile(t, tmp, joinLines(repl...))
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	want := int64(len(joinLines(short...)))
	waitFor(t, "an open at the shrunken size", func() bool {
		opens := sink.find("open", p)
		return len(opens) > 0 && opens[len(opens)-1].f.Size == want
	})
	if r := sink.reasons(p); len(r) != 3 || r[1] != Replaced || r[2] != Truncated {
		t.Fatalf("opens %v, want [discovered replaced truncated]", r)
	}
	waitFor(t, "the short content after the reopen", func() bool {
		return strings.Join(sinceLastOpen(sink, p), "\n") == strings.Join(short, "\n")
	})
}

// TestRewriteShiftingAnEmptyLastLine: torture T12 (seed 820390754443). The last line
// delivered is empty (a damaged line: just "\n"); Pi rewrites the file in place with an
// earlier line one byte longer, so everything after it moves one byte on. The byte at
// the empty line's old offset is now the '\n' of the line before it, which passes for
// the empty line: the per-run check saw nothing, and the empty line was delivered a
// second time, at the next ordinal (the mirror then held one line more than the file).
// A delivered line is also checked to start just after a '\n'.
func TestRewriteShiftingAnEmptyLastLine(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	old := append(session("shifted1", 4), "")
	repl := slices.Clone(old)
	repl[2] = strings.Replace(repl[2], `"content":"`, `"content":"9`, 1)
	writeFile(t, p, joinLines(old...))
	sink := newRecSink()
	// Only the checks of every run: the settled check would find the rewrite later.
	h := start(t, sink, []string{root}, func(o *Options) { o.SettleDelay = -1 })
	h.ready(t)
	waitLines(t, sink, p, old...)
	// Written over the old bytes, never shorter: the rewrite is seen whole (a run that
	// saw it half done would find the file shorter than what was delivered).
	overwrite(t, p, joinLines(repl...))
	waitFor(t, "the rewritten file after a Truncated open", func() bool {
		r := sink.reasons(p)
		return r[len(r)-1] == Truncated && strings.Join(sinceLastOpen(sink, p), "\n") == strings.Join(repl, "\n")
	})
}

// TestSettledToldAroundAChange: torture T13. The sink hears that lines are not settled
// before the first line of a change, and that they are once the settled check found
// every delivered byte in place; a change the check finds instead is a Truncated Open,
// never a Settled(true). The back-fill of a file opened from its start is settled.
func TestSettledToldAroundAChange(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	lines := session("settling", 3)
	writeFile(t, p, joinLines(lines...))
	sink := newRecSink()
	h := start(t, sink, []string{root}, func(o *Options) { o.SettleDelay = 50 * time.Millisecond })
	h.ready(t)
	waitLines(t, sink, p, lines...)
	if s := sink.find("settled", p); len(s) != 0 {
		t.Fatalf("back-fill: %+v", s)
	}
	// seq is the calls for p as "open", "line", "unsettled", "settled".
	seq := func() []string {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		var out []string
		for _, c := range sink.calls {
			switch {
			case c.f.Path != p || c.op == "torn":
			case c.op == "settled" && c.n == 0:
				out = append(out, "unsettled")
			default:
				out = append(out, c.op)
			}
		}
		return out
	}
	appendFile(t, p, entry("settling", 4)+"\n")
	want := "open line line line line unsettled line settled"
	waitFor(t, "settled after the append", func() bool { return strings.Join(seq(), " ") == want })

	// An earlier line changed (same size) and a line appended: unsettled before the
	// appended line, then the settled check reopens the file.
	repl := append(session("settling", 4), entry("settling", 5))
	repl[1] = strings.Replace(repl[1], "sett0001", "SETT0001", 1)
	overwrite(t, p, joinLines(repl...))
	waitFor(t, "a Truncated open", func() bool { r := sink.reasons(p); return r[len(r)-1] == Truncated })
	got := strings.Join(seq(), " ")
	if !strings.HasPrefix(got, want+" unsettled line open") {
		t.Fatalf("calls %s", got)
	}
}

// TestRewriteWhileAwayThenTornIsRechecked: torture seed 877348171493. While the daemon
// was down, Pi rewrote an earlier line (same size) and started a line it had not
// finished when the daemon came back: no line past the Start, only a torn tail. The
// file holds bytes past the checkpoint: it changed while away, and the settled check
// has it compared with the mirror (Rechecked), as when lines were appended.
func TestRewriteWhileAwayThenTornIsRechecked(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	old := session("awaytorn", 4)
	resumeAt := int64(len(joinLines(old...)))
	now := slices.Clone(old)
	now[2] = strings.Replace(now[2], "away0002", "AWAY0002", 1)
	writeFile(t, p, joinLines(now...)+`{"type":"message","id":"torn`)
	resumedIsRechecked(t, root, p, Start{Offset: resumeAt, Ordinal: int64(len(old))}, now)
}

// resumedIsRechecked watches root with a sink that resumes p from cp (the checkpoint of
// its old content) and wants p opened again as Rechecked and delivered whole as now.
func resumedIsRechecked(t *testing.T, root, p string, cp Start, now []string) {
	t.Helper()
	sink := newRecSink()
	sink.open = func(f File, why OpenReason) (Start, error) {
		if why == Discovered {
			return cp, nil
		}
		return Start{}, nil
	}
	h := start(t, sink, []string{root}, func(o *Options) { o.SettleDelay = 50 * time.Millisecond })
	h.ready(t)
	waitFor(t, "the whole file after a Rechecked open", func() bool {
		return strings.Join(sinceLastOpen(sink, p), "\n") == strings.Join(now, "\n")
	})
	if r := sink.reasons(p); r[len(r)-1] != Rechecked {
		t.Fatalf("opens %v", r)
	}
}

// TestHeaderRewrittenSameSize: a header rewritten in place, same size, the rest of the
// file unchanged, with the settled check off: the header check of every run alone sees
// it (it compares a digest of the header the file was opened with), also when the read
// buffer is shorter than the header (its first bytes are compared).
func TestHeaderRewrittenSameSize(t *testing.T) {
	for _, tc := range []struct {
		name       string
		readBuffer int
		from, to   string // the change in the header
	}{
		{"id", 0, `"hdr-same"`, `"HDR-SAME"`},
		{"last byte", 0, `"/w"}`, `"/v"}`},
		{"short buffer, first bytes", 16, `"type"`, `"TYPE"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			p := filepath.Join(root, "s.jsonl")
			old := session("hdr-same", 3)
			repl := slices.Clone(old)
			repl[0] = strings.Replace(repl[0], tc.from, tc.to, 1)
			if len(repl[0]) != len(old[0]) || repl[0] == old[0] {
				t.Fatal("bad fixture")
			}
			writeFile(t, p, joinLines(old...))
			sink := newRecSink()
			h := start(t, sink, []string{root}, func(o *Options) {
				o.SettleDelay = -1
				o.ReadBuffer = tc.readBuffer
			})
			h.ready(t)
			waitLines(t, sink, p, old...)
			b := make([][]byte, len(repl))
			for i, s := range repl {
				b[i] = []byte(s)
			}
			if err := sessiontest.Rewrite(p, b); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the rewritten header after a Truncated open", func() bool {
				return strings.Join(sinceLastOpen(sink, p), "\n") == strings.Join(repl, "\n")
			})
			if r := sink.reasons(p); r[len(r)-1] != Truncated {
				t.Fatalf("opens %v", r)
			}
		})
	}
}

// TestSettledCheckDueSurvivesAFailedRun: a run that takes a due settled check and ends
// before it looks at the file (here it cannot be opened) leaves the check due. A file
// that does not change again arms no timer of its own, so a rewrite that kept the header
// and the last delivered line would otherwise be found only by a later change.
func TestSettledCheckDueSurvivesAFailedRun(t *testing.T) {
	if os.Geteuid() == 0 {
		rerunAsNobody(t, t.Name()) // root opens any file whatever its mode
		return
	}
	const settle = 200 * time.Millisecond
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	old := session("unopened", 4)
	repl := slices.Clone(old)
	repl[2] = strings.Replace(repl[2], "unop0002", "UNOP0002", 1)
	writeFile(t, p, joinLines(old...))
	sink := newRecSink()
	h := start(t, sink, []string{root}, func(o *Options) { o.SettleDelay = settle })
	h.ready(t)
	waitLines(t, sink, p, old...)
	time.Sleep(20 * time.Millisecond) // a modification time of its own
	overwrite(t, p, joinLines(repl...))
	waitFor(t, "the change told unsettled", func() bool { return len(sink.find("settled", p)) == 1 })
	// Unreadable before the settled check comes due, readable again after it came.
	if err := os.Chmod(p, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * settle)
	if r := sink.reasons(p); len(r) != 1 {
		t.Fatalf("opens %v while unreadable", r)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rewritten line after a Truncated open", func() bool {
		return strings.Join(sinceLastOpen(sink, p), "\n") == strings.Join(repl, "\n")
	})
	if r := sink.reasons(p); r[len(r)-1] != Truncated {
		t.Fatalf("opens %v", r)
	}
}
