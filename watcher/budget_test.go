package watcher

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// budgetSource accounts watches as the kernel does: each Add holds 1 + perEntry ×
// (entries of the directory) resources until its Remove (kqueue: one descriptor for the
// directory and one per entry; inotify: perEntry 0), and fails with EMFILE, holding
// nothing, when that would pass limit (0 = none). It records the peak held and the
// refusals.
type budgetSource struct {
	*fakeSource
	perEntry, limit int

	mu                  sync.Mutex
	held                map[string]int
	used, peak, refused int
}

func (b *budgetSource) Add(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	cost := 1 + b.perEntry*len(entries)
	b.mu.Lock()
	if _, ok := b.held[dir]; !ok {
		if b.limit > 0 && b.used+cost > b.limit {
			b.refused++
			b.mu.Unlock()
			return &os.PathError{Op: "open", Path: dir, Err: syscall.EMFILE}
		}
		b.held[dir] = cost
		b.used += cost
		b.peak = max(b.peak, b.used)
	}
	b.mu.Unlock()
	return b.fakeSource.Add(dir)
}

func (b *budgetSource) Remove(dir string) error {
	b.mu.Lock()
	b.used -= b.held[dir]
	delete(b.held, dir)
	b.mu.Unlock()
	return b.fakeSource.Remove(dir)
}

func (b *budgetSource) counts() (peak, refused int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peak, b.refused
}

// openDescriptors counts the process's open descriptors, or -1 where it cannot tell.
func openDescriptors() int {
	for _, d := range []string{"/proc/self/fd", "/dev/fd"} {
		if es, err := os.ReadDir(d); err == nil {
			return len(es)
		}
	}
	return -1
}

// TestWatchBudgetPollsWhatItCannotWatch: 10,000 sessions in 250 directories with room
// for a few dozen watches, as on a Mac with a low descriptor limit. Every line still
// arrives (the directories without a watch are polled), the watches held never pass
// the budget (nor the kernel's limit), the metrics say what is polled, and stopping the
// watcher leaves no descriptor behind.
func TestWatchBudgetPollsWhatItCannotWatch(t *testing.T) {
	cases := []struct {
		name        string
		dirs        int  // of 40 sessions each
		kqueue      bool // every entry of a watched directory costs one (kqueue)
		budget      int  // Options.WatchBudget
		kernelLimit int  // the fake kernel refuses with EMFILE past it
		wantRefused bool
	}{
		// 2,000 descriptors: the root (1 + 250 entries) and 42 directories of 41.
		{name: "kqueue descriptors within the budget", dirs: 250, kqueue: true, budget: 2000, kernelLimit: 2500},
		// No budget: the kernel refuses the 41st directory; the budget becomes 40.
		{name: "kernel refuses with EMFILE", dirs: 60, budget: -1, kernelLimit: 40, wantRefused: true},
	}
	const perDir = 40
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dirs := tc.dirs
			root := manyFilesDir(t)
			want := map[string][]string{}
			for d := range dirs {
				dir := filepath.Join(root, fmt.Sprintf("--home-u-project-%03d--", d))
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				for f := range perDir {
					p := filepath.Join(dir, fmt.Sprintf("2026-01-01T00-00-%02d_%03d.jsonl", f, d))
					lines := session(fmt.Sprintf("s%03d%02dxx", d, f), 2)
					writeFile(t, p, joinLines(lines...))
					want[p] = lines
				}
			}
			fdsBefore := openDescriptors()
			perEntry := 0
			if tc.kqueue {
				perEntry = 1
			}
			src := &budgetSource{fakeSource: newFakeSource(t), perEntry: perEntry, limit: tc.kernelLimit, held: map[string]int{}}
			h := start(t, newRecSink(), []string{root}, func(o *Options) {
				o.Events, o.WatchBudget, o.countEntries = src, tc.budget, tc.kqueue
				o.FallbackPollInterval = time.Second // a rescan stats 10,000 files: slow under -race
				o.ReadBuffer = 4 << 10               // small files: no 256 KiB buffer for each
			})
			waitAll(t, h.sink, want)

			// Live: a line appended to every 20th session, watched or polled, and 60 new
			// sessions in one watched directory (with kqueue costs, they push it over
			// the budget: it sheds its watch and is polled).
			h.w.mu.Lock()
			var watched string
			for d := range h.w.dirs {
				if d != root {
					watched = d
					break
				}
			}
			h.w.mu.Unlock()
			if watched == "" {
				t.Fatal("no directory below the root is watched")
			}
			i := 0
			for p := range want {
				if i++; i%20 == 0 {
					appendFile(t, p, "{\"live\":1}\n")
					want[p] = append(want[p], `{"live":1}`)
				}
			}
			for f := range 60 {
				p := filepath.Join(watched, fmt.Sprintf("2026-02-01T00-00-%02d_new.jsonl", f))
				lines := session(fmt.Sprintf("new%02dxxx", f), 1)
				writeFile(t, p, joinLines(lines...))
				want[p] = lines
			}
			waitAll(t, h.sink, want)

			st := h.w.Stats()
			peak, refused := src.counts()
			budget := tc.budget
			if tc.wantRefused {
				budget = tc.kernelLimit
			}
			if st.WatchBudget != budget || st.Watches > budget || peak > budget {
				t.Errorf("budget %d, watches %d, peak held %d: want at most %d", st.WatchBudget, st.Watches, peak, budget)
			}
			if (refused > 0) != tc.wantRefused || refused > 1 {
				t.Errorf("the kernel refused %d watches", refused)
			}
			// Every session is in a watched or a polled directory, and the gauges agree.
			var watchedFiles int
			h.w.mu.Lock()
			for d := range h.w.dirs {
				watchedFiles += len(h.w.byDir[d])
			}
			h.w.mu.Unlock()
			if st.PolledDirs < dirs/3 || st.PolledFiles+watchedFiles != len(want) {
				t.Errorf("%d polled directories, %d polled and %d watched sessions of %d", st.PolledDirs, st.PolledFiles, watchedFiles, len(want))
			}
			m := h.w.m
			if testutil.ToFloat64(m.polledDirs) != float64(st.PolledDirs) || testutil.ToFloat64(m.polledFiles) != float64(st.PolledFiles) ||
				testutil.ToFloat64(m.watchBudget) != float64(budget) || testutil.ToFloat64(m.watches) != float64(st.Watches) ||
				testutil.ToFloat64(m.pollingRoots) != 1 {
				t.Errorf("metrics: polled directories %v, polled files %v, budget %v, watches %v, polling roots %v; stats %+v",
					testutil.ToFloat64(m.polledDirs), testutil.ToFloat64(m.polledFiles), testutil.ToFloat64(m.watchBudget),
					testutil.ToFloat64(m.watches), testutil.ToFloat64(m.pollingRoots), st)
			}
			if p := h.w.PolledByRoot()[root]; p.Dirs != st.PolledDirs || p.Files != st.PolledFiles {
				t.Errorf("PolledByRoot %+v, stats %+v", p, st)
			}
			if tc.kqueue && !h.w.isPolled(watched) {
				t.Errorf("%s grew past the budget and kept its watch", watched)
			}

			h.stop()
			if fdsBefore >= 0 {
				waitFor(t, "the descriptors to be released", func() bool {
					runtime.GC() // an os.File dropped without Close is closed by its finalizer
					return openDescriptors() <= fdsBefore
				})
			}
		})
	}
}

// manyFilesDir returns a temporary directory for thousands of files: in memory
// (/dev/shm) where there is one, since deleting 10,000 files from a disk-backed
// temporary directory takes seconds on a small virtual machine.
func manyFilesDir(t *testing.T) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if dir, err := os.MkdirTemp("/dev/shm", "pisync-watcher-"); err == nil {
			t.Cleanup(func() {
				if err := os.RemoveAll(dir); err != nil {
					t.Error(err)
				}
			})
			return dir
		}
	}
	return t.TempDir()
}

func (w *Watcher) isPolled(dir string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.polled[dir] != nil
}

// waitAll waits until every file in want has had exactly its lines delivered, in order.
func waitAll(t *testing.T, s *recSink, want map[string][]string) {
	t.Helper()
	total := 0
	for _, lines := range want {
		total += len(lines)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		s.mu.Lock()
		n := 0
		for _, c := range s.calls {
			if c.op == "line" {
				n++
			}
		}
		s.mu.Unlock()
		if n >= total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines of %d delivered", n, total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	got := map[string][]string{}
	for _, c := range s.find("line", "") {
		got[c.f.Path] = append(got[c.f.Path], c.line.Data)
	}
	for p, lines := range want {
		if fmt.Sprint(got[p]) != fmt.Sprint(lines) {
			t.Fatalf("%s: got %q, want %q", filepath.Base(p), got[p], lines)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("lines of %d files, want %d", len(got), len(want))
	}
}
