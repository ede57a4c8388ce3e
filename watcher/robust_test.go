package watcher

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

func TestLinkThenUnlinkIsMoved(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a.jsonl"), filepath.Join(root, "b.jsonl")
	lines := session("linked-a", 2)
	writeFile(t, a, joinLines(lines...))
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	// The new name appears before the old one goes: while both exist, one is tailed.
	if err := os.Link(a, b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "second name waiting", func() bool { return h.w.aliasCount() == 1 })
	appendFile(t, b, "{\"via\":\"b\"}\n")
	waitLines(t, h.sink, a, append(lines, `{"via":"b"}`)...)
	if len(h.sink.find("open", b)) != 0 {
		t.Fatal("a second name of one inode was opened")
	}
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Moved", func() bool { return len(h.sink.find("open", b)) == 1 })
	if r := h.sink.reasons(b); r[0] != Moved {
		t.Fatalf("opens %v", r)
	}
	appendFile(t, b, "{}\n")
	waitLines(t, h.sink, b, "{}")
	h.noGone(t)
}

func TestMovedOutIsGone(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	a, b := filepath.Join(root, "a.jsonl"), filepath.Join(root, "b.jsonl")
	writeFile(t, a, joinLines(session("out-aaaa", 1)...))
	writeFile(t, b, joinLines(session("out-bbbb", 1)...))
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	if err := os.Rename(a, filepath.Join(outside, "a.jsonl")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(b, b+".bak"); err != nil { // no longer a session name
		t.Fatal(err)
	}
	waitFor(t, "both Gone", func() bool { return len(h.sink.find("gone", a)) == 1 && len(h.sink.find("gone", b)) == 1 })
}

func TestOverflowRescanMissesNothing(t *testing.T) {
	root := t.TempDir()
	a := filepath.Join(root, "--w--", "a.jsonl")
	b := filepath.Join(root, "--w--", "b.jsonl")
	writeFile(t, a, joinLines(session("overflow-a", 2)...))
	writeFile(t, b, joinLines(session("overflow-b", 2)...))
	writeFile(t, filepath.Join(root, "--dir--", "sub", "d.jsonl"), joinLines(session("overflow-d", 1)...))
	src := newFakeSource(t)
	h := start(t, newRecSink(), []string{root}, func(o *Options) { o.Events = src })
	h.ready(t)
	before := h.w.Stats().Rescans

	// From now on every event is lost; only the rescan after the overflow can see changes.
	src.drop.Store(true)
	appendFile(t, a, "{\"after\":1}\n")
	c := filepath.Join(root, "--new--", "deep", "c.jsonl")
	writeFile(t, c, joinLines(session("overflow-c", 3)...))
	moved := filepath.Join(root, "--w--", "b-moved.jsonl")
	if err := os.Rename(b, moved); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(root, "--old--", "sub", "d.jsonl")
	if err := os.Rename(filepath.Join(root, "--dir--"), filepath.Join(root, "--old--")); err != nil {
		t.Fatal(err)
	}
	src.errors <- fsnotify.ErrEventOverflow

	waitLines(t, h.sink, a, append(session("overflow-a", 2), `{"after":1}`)...)
	waitLines(t, h.sink, c, session("overflow-c", 3)...)
	waitFor(t, "Moved", func() bool { return len(h.sink.find("open", moved)) == 1 })
	if r := h.sink.reasons(moved); r[0] != Moved {
		t.Fatalf("opens %v", r)
	}
	waitFor(t, "directory moved", func() bool { return len(h.sink.find("open", d)) == 1 })
	st := h.w.Stats()
	if st.Overflows != 1 || st.Rescans != before+1 || st.Dirs != 6 {
		t.Fatalf("stats %+v", st)
	}
	h.noGone(t)

	// Events flow again: the directory renamed while they were lost is watched under
	// its new name only.
	src.drop.Store(false)
	appendFile(t, d, "{\"live\":1}\n")
	waitLines(t, h.sink, d, `{"live":1}`)
	e := filepath.Join(root, "--old--", "sub", "e.jsonl")
	writeFile(t, e, joinLines(session("overflow-e", 1)...))
	waitLines(t, h.sink, e, session("overflow-e", 1)...)
	if st := h.w.Stats(); st.Rescans != before+1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestWatchLimitFallsBackToPolling(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "limited", "s.jsonl")
	writeFile(t, p, joinLines(session("limit-aa", 1)...))
	src := newFakeSource(t)
	src.refuse = func(dir string) error {
		if strings.Contains(dir, "limited") {
			return syscall.ENOSPC
		}
		return nil
	}
	h := start(t, newRecSink(), []string{root}, func(o *Options) { o.Events = src })
	h.ready(t)
	waitLines(t, h.sink, p, session("limit-aa", 1)...)
	if st := h.w.Stats(); st.PollingRoots != 1 {
		t.Fatalf("stats %+v", st)
	}
	appendFile(t, p, "{\"polled\":1}\n")
	q := filepath.Join(root, "limited", "more", "q.jsonl")
	writeFile(t, q, joinLines(session("limit-qq", 2)...))
	waitLines(t, h.sink, p, append(session("limit-aa", 1), `{"polled":1}`)...)
	waitLines(t, h.sink, q, session("limit-qq", 2)...)
	if h.logs.FilterMessageSnippet("polling the root").Len() != 1 {
		t.Fatal("polling fallback not logged exactly once")
	}
}

func TestPermissionDeniedFileDoesNotStopOthers(t *testing.T) {
	if os.Geteuid() == 0 {
		rerunAsNobody(t, t.Name()) // root ignores file permissions
		return
	}
	root := t.TempDir()
	locked := filepath.Join(root, "locked.jsonl")
	open := filepath.Join(root, "open.jsonl")
	writeFile(t, locked, joinLines(session("locked-x", 1)...))
	writeFile(t, open, joinLines(session("open-xxx", 1)...))
	if err := os.Chmod(locked, 0); err != nil {
		t.Fatal(err)
	}
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	waitLines(t, h.sink, open, session("open-xxx", 1)...)
	appendFile(t, open, "{}\n")
	waitLines(t, h.sink, open, append(session("open-xxx", 1), "{}")...)
	logged := h.logs.FilterMessageSnippet("cannot process session file").FilterField(zap.String("path", locked))
	if logged.Len() != 1 {
		t.Fatalf("%d log lines for the locked file", logged.Len())
	}
	if len(h.sink.find("open", locked)) != 0 || h.w.Stats().Errors == 0 {
		t.Fatal("locked file opened, or error not counted")
	}
	// Readable again: the chmod event is enough to retry.
	if err := os.Chmod(locked, 0o644); err != nil {
		t.Fatal(err)
	}
	waitLines(t, h.sink, locked, session("locked-x", 1)...)
}

func TestSymlinksNotFollowed(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(outside, "sub", "x.jsonl"), joinLines(session("outside-x", 1)...))
	writeFile(t, filepath.Join(outside, "y.jsonl"), joinLines(session("outside-y", 1)...))
	if err := os.Symlink(filepath.Join(outside, "sub"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "y.jsonl"), filepath.Join(root, "y.jsonl")); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(root, "in.jsonl")
	writeFile(t, inside, joinLines(session("inside-x", 1)...))
	h := start(t, newRecSink(), []string{root}, nil)
	h.ready(t)
	if err := os.Symlink(outside, filepath.Join(root, "link2")); err != nil {
		t.Fatal(err)
	}
	appendFile(t, filepath.Join(outside, "sub", "x.jsonl"), "{}\n")
	later := filepath.Join(root, "later.jsonl")
	writeFile(t, later, joinLines(session("later-xx", 1)...))
	waitLines(t, h.sink, later, session("later-xx", 1)...)
	opens := h.sink.find("open", "")
	if len(opens) != 2 || opens[0].f.Path != inside {
		t.Fatalf("opens %+v", opens)
	}
	if st := h.w.Stats(); st.Dirs != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPeriodicRescanReadsNothingUnchanged(t *testing.T) {
	root := t.TempDir()
	for _, n := range []string{"a", "b", "c"} {
		writeFile(t, filepath.Join(root, n, n+".jsonl"), joinLines(session("periodic-"+n, 10)...)+`{"torn":`)
	}
	h := start(t, newRecSink(), []string{root}, func(o *Options) { o.RescanInterval = 20 * time.Millisecond })
	h.ready(t)
	read := h.w.Stats().BytesRead
	r0 := h.w.Stats().Rescans
	waitFor(t, "three rescans", func() bool { return h.w.Stats().Rescans >= r0+3 })
	if got := h.w.Stats().BytesRead; got != read {
		t.Fatalf("rescans read %d bytes", got-read)
	}
}

func TestMetricsRegister(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	writeFile(t, p, joinLines(session("metrics-x", 2)...)+"torn")
	h := start(t, newRecSink(), []string{root}, func(o *Options) { o.Metrics = m })
	h.ready(t)
	waitLines(t, h.sink, p, session("metrics-x", 2)...)
	waitFor(t, "torn tail", func() bool { return h.w.Stats().TornTails == 1 })
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "pisync_watcher_") {
			t.Errorf("metric %s", f.GetName())
		}
		for _, m := range f.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			name := f.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			values[name] = v
		}
	}
	want := map[string]float64{
		"pisync_watcher_lines_total":           3,
		"pisync_watcher_files/tailing":         1,
		"pisync_watcher_torn_tails":            1,
		"pisync_watcher_watched_directories":   1,
		"pisync_watcher_rescans_total/initial": 1,
	}
	for k, v := range want {
		if values[k] != v {
			t.Errorf("%s = %v, want %v", k, values[k], v)
		}
	}
	if values["pisync_watcher_read_bytes_total"] == 0 {
		t.Error("no bytes read")
	}
	names := slices.Sorted(maps.Keys(values))
	if len(names) < 20 {
		t.Errorf("only %d series: %v", len(names), names)
	}
}

// A rescan compares each file's identity, size and modification time with what the last
// run saw (on Linux from fstatat relative to the directory): a file rewritten in place to
// the same size, with its events lost, is still looked at again, and found rewritten.
func TestRescanSeesSameSizeRewrite(t *testing.T) {
	root := t.TempDir()
	a := filepath.Join(root, "--w--", "a.jsonl")
	lines := session("same-size", 3)
	writeFile(t, a, joinLines(lines...))
	src := newFakeSource(t)
	h := start(t, newRecSink(), []string{root}, func(o *Options) { o.Events = src })
	h.ready(t)
	waitLines(t, h.sink, a, lines...)

	src.drop.Store(true)
	rewritten := append([]string(nil), lines...)
	last := []byte(rewritten[len(rewritten)-1])
	last[len(last)-3] ^= 1 // same length, other bytes
	rewritten[len(rewritten)-1] = string(last)
	if err := os.WriteFile(a, []byte(joinLines(rewritten...)), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(a, later, later); err != nil {
		t.Fatal(err)
	}
	src.errors <- fsnotify.ErrEventOverflow
	waitFor(t, "reopened as rewritten", func() bool {
		r := h.sink.reasons(a)
		return len(r) == 2 && r[1] == Truncated
	})
}
