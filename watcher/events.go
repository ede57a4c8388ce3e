package watcher

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"

	pisession "github.com/pisync/pisync/internal/session"
)

// eventBuffer is the number of events fsnotify may queue ahead of the event loop, so
// that a burst is absorbed here rather than overflowing the kernel's queue.
const eventBuffer = 4096

// fsnotifySource adapts an fsnotify.Watcher to EventSource.
type fsnotifySource struct{ w *fsnotify.Watcher }

// NewFSNotify returns the default EventSource: a (non-recursive) fsnotify watcher to
// which the Watcher adds every directory itself.
func NewFSNotify() (EventSource, error) {
	fw, err := fsnotify.NewBufferedWatcher(eventBuffer)
	if err != nil {
		return nil, err
	}
	return &fsnotifySource{w: fw}, nil
}

func (s *fsnotifySource) Add(dir string) error          { return s.w.Add(dir) }
func (s *fsnotifySource) Remove(dir string) error       { return s.w.Remove(dir) }
func (s *fsnotifySource) Events() <-chan fsnotify.Event { return s.w.Events }
func (s *fsnotifySource) Errors() <-chan error          { return s.w.Errors }
func (s *fsnotifySource) Close() error                  { return s.w.Close() }
func (s *fsnotifySource) String() string                { return "fsnotify" }

var _ EventSource = (*fsnotifySource)(nil)

// eventLoop turns file-system events into work: new directories are watched and
// scanned, touched session files are queued, vanished paths are looked at.
func (w *Watcher) eventLoop(ctx context.Context) {
	evs, errs := w.src.Events(), w.src.Errors()
	for evs != nil || errs != nil {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-evs:
			if !ok {
				evs = nil
				w.sourceClosed(ctx)
				continue
			}
			w.handleEvent(ctx, ev)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			w.handleError(err)
		}
	}
	<-ctx.Done()
}

var eventOps = []struct {
	op   fsnotify.Op
	name string
}{
	{fsnotify.Create, "create"},
	{fsnotify.Write, "write"},
	{fsnotify.Remove, "remove"},
	{fsnotify.Rename, "rename"},
	{fsnotify.Chmod, "chmod"},
}

func (w *Watcher) handleEvent(ctx context.Context, ev fsnotify.Event) {
	w.events.Add(1)
	for _, o := range eventOps {
		if ev.Has(o.op) {
			w.m.events.WithLabelValues(o.name).Inc()
		}
	}
	path := filepath.Clean(ev.Name)
	r := w.rootOf(path)
	if r == nil {
		return
	}
	session := pisession.IsFileName(filepath.Base(path))
	if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
		if path == r.path {
			w.rootLost(r)
			return
		}
		w.pathGone(path)
	}
	if ev.Has(fsnotify.Create) {
		w.mu.Lock()
		shed := w.entryChangedLocked(path, +1)
		w.mu.Unlock()
		w.removeWatches(shed)
		if fi, err := os.Lstat(path); err == nil {
			switch {
			case fi.IsDir():
				w.mu.Lock()
				gen := w.scanGen
				w.mu.Unlock()
				w.walk(ctx, r, path, gen, false)
			case fi.Mode().IsRegular() && session:
				w.mu.Lock()
				w.touchLocked(r, path, nil, 0, false)
				w.mu.Unlock()
			}
		}
	}
	if session && (ev.Has(fsnotify.Write) || ev.Has(fsnotify.Chmod)) {
		w.mu.Lock()
		// A chmod may make an unreadable file readable; on a file never seen it is no news.
		if ev.Has(fsnotify.Write) || w.files[path] != nil {
			w.touchLocked(r, path, nil, 0, false)
		}
		w.mu.Unlock()
	}
}

// pathGone handles a removed or renamed path: a directory loses its watches (a new
// name gets new ones on its Create), a file is looked at.
func (w *Watcher) pathGone(path string) {
	w.mu.Lock()
	stale := w.entryChangedLocked(path, -1)
	if w.dirs[path] != nil {
		stale = append(stale, w.forgetDirsLocked(path)...)
	}
	if s := w.files[path]; s != nil {
		w.scheduleLocked(s)
	}
	w.mu.Unlock()
	w.removeWatches(stale)
}

func (w *Watcher) handleError(err error) {
	if errors.Is(err, fsnotify.ErrEventOverflow) {
		w.overflows.Add(1)
		w.m.overflows.Inc()
		w.log.Warn("file-system events were lost (queue overflow); rescanning every root")
		w.mu.Lock()
		for _, r := range w.roots {
			r.want = rescanOverflow
		}
		w.mu.Unlock()
		kick(w.scanKick)
		return
	}
	if isWatchLimit(err) {
		// kqueue could not watch an entry created in a watched directory: the
		// descriptors ran out despite the budget. A rescan finds what it missed.
		w.countError(reasonWatchLimit)
		w.mu.Lock()
		for _, r := range w.roots {
			if r.active {
				r.want = rescanPoll
			}
		}
		w.mu.Unlock()
		kick(w.scanKick)
	} else {
		w.countError(reasonWatch)
	}
	if n, log := w.sourceErrs.Hit(); log {
		w.log.Warn("event source error", zap.Int64("count", n), zap.Error(err))
	}
}

// sourceClosed falls back to polling every root when the event source stops early.
func (w *Watcher) sourceClosed(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	w.log.Error("the event source stopped; polling every root instead")
	w.mu.Lock()
	w.noEvents = true
	for _, r := range w.roots {
		if r.active {
			w.setPollingLocked(r, true)
		}
	}
	w.mu.Unlock()
	kick(w.scanKick)
}

// rootOf returns the root path lies in, or nil.
func (w *Watcher) rootOf(path string) *root {
	for _, r := range w.roots {
		if within(path, r.path) {
			return r
		}
	}
	return nil
}
