package watcher

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestBackfillThenLiveAppends(t *testing.T) {
	root := t.TempDir()
	paths := []string{
		filepath.Join(root, "--w-a--", "2025-01-01T00-00-00-000Z_aaaa1111.jsonl"),
		filepath.Join(root, "--w-a--", "2025-01-02T00-00-00-000Z_bbbb2222.jsonl"),
		filepath.Join(root, "--w-b--", "deep", "2025-01-03T00-00-00-000Z_cccc3333.jsonl"),
	}
	want := map[string][]string{}
	for i, p := range paths {
		want[p] = session(fmt.Sprintf("id%02d-%s", i, strings.Repeat("x", 8)), 20+i*50)
		writeFile(t, p, joinLines(want[p]...))
	}
	writeFile(t, filepath.Join(root, "--w-a--", "notes.txt"), "not a session\n")
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	for _, p := range paths {
		if got := h.sink.texts(p); strings.Join(got, "\n") != strings.Join(want[p], "\n") {
			t.Fatalf("%s after Ready: got %d lines, want %d", filepath.Base(p), len(got), len(want[p]))
		}
		if r := h.sink.reasons(p); len(r) != 1 || r[0] != Discovered {
			t.Fatalf("%s: opens %v", p, r)
		}
		c := h.sink.find("open", p)[0]
		rel, _ := filepath.Rel(root, p)
		if c.f.Root != root || c.f.Rel != filepath.ToSlash(rel) || !bytes.Equal(c.f.Header(), []byte(want[p][0])) {
			t.Fatalf("open %+v", c.f)
		}
	}
	for round := range 3 {
		for i, p := range paths[:2] {
			line := entry(fmt.Sprintf("live%d", i), 100+round)
			appendFile(t, p, line+"\n")
			want[p] = append(want[p], line)
		}
	}
	for _, p := range paths {
		waitLines(t, h.sink, p, want[p]...)
	}
	if st := h.w.Stats(); st.Files != 3 || st.Tailing != 3 || st.Dirs != 4 || st.BytesRead == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFilesInNewNestedDirectories(t *testing.T) {
	root := t.TempDir()
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	var paths []string
	for i := range 5 {
		p := filepath.Join(root, fmt.Sprintf("d%d", i), "e", "f", "s.jsonl")
		// Created at once with its directories: the file exists before any watch can land.
		writeFile(t, p, joinLines(session("nested-"+fmt.Sprint(i)+"-xxxx", 3)...))
		paths = append(paths, p)
	}
	for i, p := range paths {
		waitLines(t, h.sink, p, session("nested-"+fmt.Sprint(i)+"-xxxx", 3)...)
		appendFile(t, p, "{\"more\":1}\n")
		waitLines(t, h.sink, p, append(session("nested-"+fmt.Sprint(i)+"-xxxx", 3), `{"more":1}`)...)
	}
}

func TestRootCreatedAfterStart(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "not", "yet")
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t) // nothing to back-fill
	if st := h.w.Stats(); st.WaitingRoots != 1 {
		t.Fatalf("stats %+v", st)
	}
	p := filepath.Join(root, "--w--", "s.jsonl")
	writeFile(t, p, joinLines(session("late-root", 2)...))
	waitLines(t, h.sink, p, session("late-root", 2)...)
	appendFile(t, p, "{}\n")
	waitLines(t, h.sink, p, append(session("late-root", 2), "{}")...)
}

func TestLineWrittenInTwoWrites(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	hdr := session("two-writes", 0)[0]
	writeFile(t, p, hdr+"\n")
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	line := `{"type":"message","id":"abcd0001","content":"` + strings.Repeat("z", 5000) + `"}`
	appendFile(t, p, line[:1234])
	waitFor(t, "torn tail reported", func() bool {
		torn := h.sink.find("torn", p)
		return len(torn) > 0 && torn[len(torn)-1].n == 1234
	})
	if c := h.sink.find("torn", p)[0]; c.off != int64(len(hdr)+1) {
		t.Fatalf("torn at %d", c.off)
	}
	if st := h.w.Stats(); st.TornTails != 1 {
		t.Fatalf("stats %+v", st)
	}
	appendFile(t, p, line[1234:]+"\n")
	waitLines(t, h.sink, p, hdr, line)
	waitFor(t, "torn tail resolved", func() bool {
		torn := h.sink.find("torn", p)
		return torn[len(torn)-1].n == 0
	})
	if st := h.w.Stats(); st.TornTails != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestTornTailAtStartupHeldThenCompleted(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	lines := session("torn-start", 3)
	writeFile(t, p, joinLines(lines...)+`{"partial":`)
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	waitLines(t, h.sink, p, lines...)
	torn := h.sink.find("torn", p)
	if len(torn) != 1 || torn[0].n != int64(len(`{"partial":`)) || torn[0].off != int64(len(joinLines(lines...))) {
		t.Fatalf("torn %+v", torn)
	}
	appendFile(t, p, "true}\n")
	waitLines(t, h.sink, p, append(lines, `{"partial":true}`)...)
}

func TestHeaderHeldUntilComplete(t *testing.T) {
	root := t.TempDir()
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	p := filepath.Join(root, "s.jsonl")
	writeFile(t, p, "")
	hdr := session("held-header", 0)[0]
	appendFile(t, p, hdr[:10])
	waitFor(t, "file pending", func() bool { return h.w.Stats().Pending == 1 })
	if len(h.sink.find("open", p)) != 0 || len(h.sink.find("torn", p)) != 0 {
		t.Fatal("opened before the header was complete")
	}
	appendFile(t, p, hdr[10:]+"\n")
	waitLines(t, h.sink, p, hdr)
	if r := h.sink.reasons(p); len(r) != 1 || r[0] != Discovered {
		t.Fatalf("opens %v", r)
	}
}

func TestLongLineNotInline(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	hdr := session("long-line", 0)[0]
	big := `{"type":"message","image":"` + strings.Repeat("QUJD", 3<<20/4) + `"}`
	writeFile(t, p, joinLines(hdr, "{\"small\":1}"))
	h := start(t, newRecSink(), []string{root}, func(o *Options) { o.ReadBuffer = 64 << 10 })
	h.ready(t)
	// Written in several pieces, as the harness does for lines over 512 KiB.
	for i := 0; i < len(big); i += 700 << 10 {
		appendFile(t, p, big[i:min(i+700<<10, len(big))])
	}
	appendFile(t, p, "\n{\"after\":2}\n")
	waitLines(t, h.sink, p, hdr, `{"small":1}`, big, `{"after":2}`)
	lines := h.sink.find("line", p)
	off := int64(len(hdr) + 1 + len(`{"small":1}`) + 1)
	if l := lines[2].line; l.Inline || l.Off != off || l.Len != int64(len(big)) {
		t.Fatalf("big line: inline %v offset %d len %d", l.Inline, l.Off, l.Len)
	}
	if !lines[1].line.Inline || !lines[3].line.Inline {
		t.Fatal("small lines not inline")
	}
}

func TestBlankAndCRLFLinesAsTheyAre(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	content := "{\"type\":\"session\",\"id\":\"crlf\"}\r\n\n{\"a\":1}\r\n\r\n  \n{\"b\":2}\n"
	writeFile(t, p, content)
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	waitLines(t, h.sink, p, "{\"type\":\"session\",\"id\":\"crlf\"}\r", "", "{\"a\":1}\r", "\r", "  ", `{"b":2}`)
	if c := h.sink.find("open", p)[0]; string(c.f.Header()) != "{\"type\":\"session\",\"id\":\"crlf\"}\r" {
		t.Fatalf("header %q", c.f.Header())
	}
}

func TestStartResumes(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	lines := session("resume-xx", 6)
	writeFile(t, p, joinLines(lines...))
	sink := newRecSink()
	off := int64(len(joinLines(lines[:4]...)))
	sink.open = func(File, OpenReason) (Start, error) { return Start{Offset: off, Ordinal: 4}, nil }
	h := start(t, sink, []string{root}, nil)
	h.ready(t)
	waitLines(t, sink, p, lines[4:]...)
	got := sink.find("line", p)
	if got[0].line.Ord != 4 || got[0].line.Off != off || got[1].line.Ord != 5 {
		t.Fatalf("lines %+v", got)
	}
}

func TestBadStartIsRetried(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	lines := session("bad-start", 2)
	writeFile(t, p, joinLines(lines...))
	sink := newRecSink()
	opens := 0
	sink.open = func(File, OpenReason) (Start, error) {
		opens++
		if opens == 1 {
			return Start{Offset: 5, Ordinal: 1}, nil // not at a line start
		}
		return Start{}, nil
	}
	h := start(t, sink, []string{root}, nil)
	waitLines(t, sink, p, lines...)
	if st := h.w.Stats(); st.Errors == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSkip(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "other.jsonl")
	writeFile(t, p, "{\"not\":\"a session\"}\n{\"x\":1}\n")
	sink := newRecSink()
	sink.open = func(f File, why OpenReason) (Start, error) {
		return Start{Skip: bytes.Contains(f.Header(), []byte(`"not"`))}, nil
	}
	h := start(t, sink, []string{root}, nil)
	h.ready(t)
	appendFile(t, p, "{\"y\":2}\n")
	waitFor(t, "file read after append", func() bool {
		st := h.w.Stats()
		return st.Skipped == 1 && st.BytesRead > 0
	})
	// Rewritten as a session: Truncated, then tailed.
	lines := session("now-a-session", 1)
	if err := os.WriteFile(p, []byte(joinLines(lines...)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitLines(t, sink, p, lines...)
	if r := sink.reasons(p); len(r) != 2 || r[1] != Truncated {
		t.Fatalf("opens %v", r)
	}
	if n := len(sink.find("line", p)); n != len(lines) {
		t.Fatalf("%d lines delivered", n)
	}
}

func TestSinkLineErrorRetriesWithoutEvents(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	lines := session("sink-err", 4)
	writeFile(t, p, joinLines(lines...))
	sink := newRecSink()
	failures := 0
	sink.line = func(_ File, l Line) error {
		if l.Ordinal == 2 && failures < 2 {
			failures++
			return fmt.Errorf("publisher unavailable")
		}
		return nil
	}
	h := start(t, sink, []string{root}, nil)
	h.ready(t)
	waitLines(t, sink, p, lines...)
	if r := sink.reasons(p); len(r) != 1 {
		t.Fatalf("opens %v", r)
	}
	if st := h.w.Stats(); st.Errors != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSinkWaitsForMoreLines: a sink that cannot tell yet what a file is (a title record
// written before its header) answers Wait; the file is held like one whose first line
// is torn, and opened again, with its first lines, once it grows.
func TestSinkWaitsForMoreLines(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "2026-12-05T14-00-00-000Z_wait.jsonl")
	title := `{"type":"title","v":1,"title":"t"}`
	writeFile(t, p, title+"\n")
	sink := newRecSink()
	var leads [][]string
	var mu sync.Mutex
	sink.open = func(f File, why OpenReason) (Start, error) {
		mu.Lock()
		defer mu.Unlock()
		var lines []string
		for _, l := range f.Lead.Lines {
			lines = append(lines, string(l))
		}
		leads = append(leads, lines)
		if len(lines) < 2 {
			return Start{Wait: true}, nil
		}
		return Start{}, nil
	}
	h := start(t, sink, []string{root}, nil)
	h.ready(t)
	waitFor(t, "the first Open", func() bool { mu.Lock(); defer mu.Unlock(); return len(leads) == 1 })
	if got := sink.texts(p); len(got) != 0 {
		t.Fatalf("lines delivered while the sink waits: %q", got)
	}
	hdr := session("wait-hdr", 1)
	appendFile(t, p, joinLines(hdr...))
	waitLines(t, sink, p, append([]string{title}, hdr...)...)
	mu.Lock()
	defer mu.Unlock()
	if len(leads) != 2 || strings.Join(leads[1], "|") != strings.Join([]string{title, hdr[0], hdr[1]}, "|") {
		t.Fatalf("Opens saw %q", leads)
	}
	if r := sink.reasons(p); len(r) != 2 || r[0] != Discovered || r[1] != Discovered {
		t.Fatalf("opens %v: the Open after a Wait has the reason the first had", r)
	}
}
