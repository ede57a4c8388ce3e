package watcher

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
)

// dirState is a watched directory.
type dirState struct {
	root *root
	id   FileID
	gen  uint64 // scan generation that last saw it
	cost int    // watch resources it holds (see budget)
}

// errWatchLimit means the directory has no watch for lack of resources: it does not fit
// in the budget, or the kernel refused it (ENOSPC, EMFILE, ENFILE). It is polled.
var errWatchLimit = errors.New("watch limit reached")

// rescan walks all of r: watches directories that lack a watch, and looks at every
// file whose size, mtime or identity differ from what was last read (stat only: an
// unchanged file is not opened). Known files not met are looked at too (they vanished).
func (w *Watcher) rescan(ctx context.Context, r *root, reason string, initial bool) {
	w.rescans.Add(1)
	w.m.rescans.WithLabelValues(reason).Inc()
	w.mu.Lock()
	w.scanGen++
	gen := w.scanGen
	w.mu.Unlock()
	start := time.Now()
	limited, ok := w.walk(ctx, r, r.path, gen, initial)
	if ctx.Err() != nil {
		return
	}
	if !ok {
		w.rootLost(r)
		return
	}
	var candidates []string
	w.mu.Lock()
	for _, s := range w.files {
		if s.root == r && s.seenGen != gen {
			w.scheduleLocked(s)
		}
	}
	for d, ds := range w.dirs {
		if ds.root == r && ds.gen != gen {
			candidates = append(candidates, d)
		}
	}
	for d, p := range w.polled {
		if p.root == r && p.gen != gen {
			delete(w.polled, d) // gone, or watched meanwhile
		}
	}
	w.mu.Unlock()
	// A directory not met may have been added by the event loop behind the walk.
	for _, d := range candidates {
		fi, err := os.Lstat(d)
		w.mu.Lock()
		ds := w.dirs[d]
		var stale []string
		if ds != nil && (err != nil || !fi.IsDir() || FileIDOf(fi) != ds.id) {
			stale = w.forgetDirsLocked(d)
		}
		w.mu.Unlock()
		w.removeWatches(stale)
	}
	w.mu.Lock()
	w.setPollingLocked(r, limited || w.noEvents)
	if r.polling {
		r.nextPoll = time.Now().Add(w.opts.FallbackPollInterval)
	}
	w.updateWatchGaugesLocked()
	files := 0
	for _, s := range w.files {
		if s.root == r {
			files++
		}
	}
	w.mu.Unlock()
	w.log.Debug("rescan done", zap.String("root", r.path), zap.String("reason", reason),
		zap.Int("files", files), zap.Duration("took", time.Since(start)))
}

// walk watches and lists dir and everything below it (symlinks are not followed),
// touching session files. ok is false when dir is r's root and it is gone.
func (w *Watcher) walk(ctx context.Context, r *root, dir string, gen uint64, initial bool) (limited, ok bool) {
	stack := []string{dir}
	for len(stack) > 0 {
		if ctx.Err() != nil {
			return limited, true
		}
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		var fi os.FileInfo
		var err error
		if d == r.path {
			fi, err = os.Stat(d)
		} else {
			fi, err = os.Lstat(d)
		}
		if err != nil || !fi.IsDir() {
			if d == r.path {
				return limited, false
			}
			continue
		}
		// The watch comes before the listing, so that a file created in between is
		// either listed or reported.
		if errors.Is(w.watchDir(r, d, FileIDOf(fi), gen), errWatchLimit) {
			limited = true
		}
		subdirs, entries, err := w.listDir(r, d, gen, initial)
		if err != nil {
			if !isGone(err) {
				w.warnDir(d, reasonReadDir, "cannot list directory", err)
			}
			continue
		}
		if w.budget.perEntry > 0 {
			w.mu.Lock()
			shed := w.resyncCostLocked(d, entries)
			w.mu.Unlock()
			limited = limited || shed != nil
			w.removeWatches(shed)
		}
		stack = append(stack, subdirs...)
	}
	return limited, true
}

// watchDir adds a watch for dir unless it has one, if it fits in the budget; a
// directory left without one is polled (errWatchLimit).
func (w *Watcher) watchDir(r *root, dir string, id FileID, gen uint64) error {
	w.mu.Lock()
	if ds := w.dirs[dir]; ds != nil && ds.id == id {
		ds.gen = gen
		w.mu.Unlock()
		return nil
	}
	// The same directory watched under an old name (renamed while its events were
	// lost), or another directory watched under this name: forget those watches first,
	// or the old paths would keep being reported for this directory.
	var stale []string
	if old, ok := w.dirsByID[id]; ok && old != dir {
		stale = w.forgetDirsLocked(old)
	}
	if w.dirs[dir] != nil {
		stale = append(stale, w.forgetDirsLocked(dir)...)
	}
	w.mu.Unlock()
	w.removeWatches(stale)

	entries := w.budget.entriesOf(dir) // perEntry does not change after New
	w.mu.Lock()
	cost := w.budget.cost(entries)
	if !w.budget.fits(cost) {
		w.setPolledLocked(r, dir, gen, true)
		w.mu.Unlock()
		return errWatchLimit
	}
	w.budget.used += cost // held from now: a concurrent walk must not count it free
	w.mu.Unlock()

	err := w.src.Add(dir)
	if err != nil && isWatchLimit(err) {
		// kqueue may hold part of it (the directory and the entries opened before the
		// refusal): release that before counting it free.
		_ = w.src.Remove(dir)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		if old := w.dirs[dir]; old != nil {
			w.budget.used -= old.cost // added twice at once (event loop and scan): one watch
		}
		w.dirs[dir] = &dirState{root: r, id: id, gen: gen, cost: cost}
		if id != (FileID{}) {
			w.dirsByID[id] = dir
		}
		w.setPolledLocked(r, dir, gen, false)
		w.m.dirs.Set(float64(len(w.dirs)))
		w.m.watches.Set(float64(w.budget.used))
		return nil
	}
	w.budget.used -= cost
	switch {
	case isWatchLimit(err):
		w.refusedLocked(dir, err)
		w.setPolledLocked(r, dir, gen, true)
		return errWatchLimit
	case isGone(err):
		return nil
	default:
		w.countError(reasonWatch)
		if !w.warned[dir] {
			w.warned[dir] = true
			w.log.Warn("cannot watch directory; it is rescanned periodically", zap.String("path", dir), zap.Error(err))
		}
		return err
	}
}

// forgetDirsLocked drops the watches of dir and every directory below it, and queues
// the files below it (they may have vanished). It returns the paths to unwatch.
func (w *Watcher) forgetDirsLocked(dir string) []string {
	var out []string
	for d, ds := range w.dirs {
		if within(d, dir) {
			delete(w.dirs, d)
			if w.dirsByID[ds.id] == d {
				delete(w.dirsByID, ds.id)
			}
			w.budget.used -= ds.cost
			out = append(out, d)
		}
	}
	for d := range w.polled {
		if within(d, dir) {
			delete(w.polled, d)
		}
	}
	for d, files := range w.byDir {
		if within(d, dir) {
			for s := range files {
				w.scheduleLocked(s)
			}
		}
	}
	w.updateWatchGaugesLocked()
	return out
}

func (w *Watcher) removeWatches(dirs []string) {
	for _, d := range dirs {
		_ = w.src.Remove(d) // already gone with its directory, most often
	}
}

// touchLocked notes that path exists (snap from a scan, or nil after an event) and
// queues it unless a scan finds it unchanged since it was last read.
func (w *Watcher) touchLocked(r *root, path string, snap *statSnap, gen uint64, initial bool) {
	s := w.files[path]
	if s == nil {
		s = &fileState{path: path, rel: relPath(r.path, path), root: r, seenGen: gen}
		w.linkLocked(s)
		w.setStateLocked(s, statePending)
		if initial {
			s.initPending = true
			w.initLeft++
		}
		w.scheduleLocked(s)
		return
	}
	if snap != nil && w.skipUnchangedLocked(s, snap, gen, initial) {
		return
	}
	if gen != 0 {
		s.seenGen = gen
	}
	if initial && !s.initPending {
		s.initPending = true
		w.initLeft++
	}
	w.scheduleLocked(s)
}

// skipUnchangedLocked reports whether a scan that met the known file s with snap has
// nothing to do (and records the meeting); otherwise the scan hands s to touchLocked.
func (w *Watcher) skipUnchangedLocked(s *fileState, snap *statSnap, gen uint64, initial bool) bool {
	if (initial && !s.initPending) || s.needRun || !s.snap.ok || s.snap != *snap {
		return false
	}
	if gen != 0 {
		s.seenGen = gen
	}
	return true
}

func relPath(root, path string) string {
	// Where path is clean and below root, rel is a substring of it and shares its
	// memory: one string per file instead of two.
	if filepath.Separator == '/' && len(path) > len(root) && path[:len(root)] == root && filepath.Clean(path) == path {
		if root == "/" {
			return path[1:]
		}
		if path[len(root)] == '/' {
			return path[len(root)+1:]
		}
	}
	rel, err := filepath.Rel(root, path)
	if err != nil {
		return filepath.ToSlash(path)
	}
	return filepath.ToSlash(rel)
}

// warnDir logs a directory problem once and counts it every time.
func (w *Watcher) warnDir(dir, reason, msg string, err error) {
	if errors.Is(err, os.ErrPermission) {
		reason = reasonPermission
	}
	w.countError(reason)
	w.mu.Lock()
	first := !w.warned[dir]
	w.warned[dir] = true
	w.mu.Unlock()
	if first {
		w.log.Warn(msg, zap.String("path", dir), zap.Error(err))
	}
}
