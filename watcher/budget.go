package watcher

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"syscall"

	"go.uber.org/zap"
)

// Watches cost the kernel something, and the kernel has a limit. With kqueue (macOS,
// BSD) fsnotify opens one descriptor per watched directory and one per entry in it, all
// against the process's RLIMIT_NOFILE, which reading files and connections need too;
// with inotify (Linux) each directory costs one watch out of fs.inotify.max_user_watches,
// shared by every program of the user. The watcher therefore keeps its watches within a
// budget (Options.WatchBudget; by default a share of those limits, see
// defaultWatchBudget), and a directory that does not fit, or that the kernel refuses
// (ENOSPC, EMFILE, ENFILE), is polled instead: its root is rescanned (stat only) every
// FallbackPollInterval, which finds what events would have reported, later.

// noBudget is the limit of a budget that has none.
const noBudget = math.MaxInt

// budget counts the watch resources held, against a limit. Guarded by Watcher.mu.
type budget struct {
	limit    int    // noBudget = none
	source   string // where the limit comes from, for logs
	perEntry int    // what each entry of a watched directory costs (1 with kqueue, 0 with inotify)
	used     int
}

// newBudget returns the budget for opts: WatchBudget if set, else the platform default.
func newBudget(opts Options) budget {
	b := budget{limit: noBudget, perEntry: watchCostPerEntry}
	if opts.countEntries {
		b.perEntry = 1
	}
	switch {
	case opts.WatchBudget > 0:
		b.limit, b.source = opts.WatchBudget, "Options.WatchBudget"
	case opts.WatchBudget == 0:
		if n, src := defaultWatchBudget(); n > 0 {
			b.limit, b.source = n, src
		}
	}
	return b
}

// shown is the limit as metrics, logs and Stats show it: 0 for none.
func (b *budget) shown() int {
	if b.limit == noBudget {
		return 0
	}
	return b.limit
}

// cost is what watching a directory of entries entries holds.
func (b *budget) cost(entries int) int { return 1 + b.perEntry*entries }

// fits reports whether cost more fits in the budget.
func (b *budget) fits(cost int) bool { return b.limit == noBudget || b.used+cost <= b.limit }

// isWatchLimit reports whether err is the kernel refusing a watch for lack of resources:
// inotify's ENOSPC (max_user_watches), kqueue's EMFILE or ENFILE (descriptors).
func isWatchLimit(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// entriesOf counts dir's entries where each costs a watch (kqueue), before it is
// watched; elsewhere it costs nothing and reads nothing.
func (b *budget) entriesOf(dir string) int {
	if b.perEntry == 0 {
		return 0
	}
	f, err := os.Open(dir)
	if err != nil {
		return 0 // the Add that follows fails the same way
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return len(names)
}

// refusedLocked handles the kernel refusing a watch: the budget becomes what is held
// now (the kernel's real limit, as far as this process can tell), so that the
// directories that do not fit are polled without asking again. A restart asks anew.
func (w *Watcher) refusedLocked(dir string, err error) {
	w.countError(reasonWatchLimit)
	if w.budget.limit > w.budget.used {
		w.budget.limit = w.budget.used
		w.log.Warn("the kernel refused a watch; polling what does not fit in the watches held now",
			zap.String("path", dir), zap.Int("watches", w.budget.used), zap.Error(err))
		w.m.watchBudget.Set(float64(w.budget.shown()))
	}
}

// setPolledLocked records that dir (of r, met by scan gen) has no watch for lack of
// budget, or drops it from the record.
func (w *Watcher) setPolledLocked(r *root, dir string, gen uint64, polled bool) {
	if !polled {
		delete(w.polled, dir)
		return
	}
	if w.polled[dir] == nil {
		w.log.Debug("directory polled: no watch within the budget", zap.String("path", dir),
			zap.Int("watches", w.budget.used), zap.Int("watch_budget", w.budget.shown()))
	}
	w.polled[dir] = &polledDir{root: r, gen: gen}
	w.setPollingLocked(r, true)
}

// polledDir is a directory without a watch, found by polling rescans.
type polledDir struct {
	root *root
	gen  uint64 // scan generation that last met it
}

// entryChangedLocked adjusts the cost of path's directory when an entry appears (+1)
// or goes (-1) in it: kqueue watches every entry of a watched directory. A directory
// that no longer fits loses its watch and is polled.
func (w *Watcher) entryChangedLocked(path string, delta int) []string {
	if w.budget.perEntry == 0 {
		return nil
	}
	dir := filepath.Dir(path)
	ds := w.dirs[dir]
	if ds == nil {
		return nil
	}
	c := max(w.budget.cost(0), ds.cost+delta*w.budget.perEntry)
	w.budget.used += c - ds.cost
	ds.cost = c
	if w.budget.used <= w.budget.limit {
		w.updateWatchGaugesLocked()
		return nil
	}
	return w.shedLocked(dir)
}

// resyncCostLocked sets the cost of the watched dir from a listing of its entries, and
// sheds its watch if the budget no longer holds it.
func (w *Watcher) resyncCostLocked(dir string, entries int) []string {
	ds := w.dirs[dir]
	if ds == nil || w.budget.perEntry == 0 {
		return nil
	}
	c := w.budget.cost(entries)
	w.budget.used += c - ds.cost
	ds.cost = c
	if w.budget.used <= w.budget.limit {
		return nil
	}
	return w.shedLocked(dir)
}

// shedLocked drops the watch of dir (alone: watched subdirectories keep theirs) and
// polls it. It returns the path to unwatch.
func (w *Watcher) shedLocked(dir string) []string {
	ds := w.dirs[dir]
	delete(w.dirs, dir)
	if w.dirsByID[ds.id] == dir {
		delete(w.dirsByID, ds.id)
	}
	w.budget.used -= ds.cost
	w.setPolledLocked(ds.root, dir, ds.gen, true)
	w.updateWatchGaugesLocked()
	// Whatever changed in it since the listing is found by the next poll; look at its
	// known files now, in case an event was lost with the watch.
	for s := range w.byDir[dir] {
		w.scheduleLocked(s)
	}
	return []string{dir}
}

// updateWatchGaugesLocked exports the watches held, the budget, and what is polled.
func (w *Watcher) updateWatchGaugesLocked() {
	w.m.dirs.Set(float64(len(w.dirs)))
	w.m.watches.Set(float64(w.budget.used))
	files := 0
	for d := range w.polled {
		files += len(w.byDir[d])
	}
	w.m.polledDirs.Set(float64(len(w.polled)))
	w.m.polledFiles.Set(float64(files))
}

// Polled counts what is polled rather than watched under one root.
type Polled struct {
	Dirs  int // directories without a watch, for lack of budget or refused by the kernel
	Files int // session files in them: their changes are found by polling
}

// PolledByRoot returns what is polled under each root (roots with nothing polled are
// absent).
func (w *Watcher) PolledByRoot() map[string]Polled {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]Polled{}
	for d, p := range w.polled {
		c := out[p.root.path]
		c.Dirs++
		c.Files += len(w.byDir[d])
		out[p.root.path] = c
	}
	return out
}
