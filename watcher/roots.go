package watcher

import (
	"context"
	"os"
	"time"

	"go.uber.org/zap"
)

// Reasons of the rescans_total{reason} counter.
const (
	rescanInitial      = "initial"       // at Run
	rescanOverflow     = "overflow"      // events were lost
	rescanPeriodic     = "periodic"      // RescanInterval
	rescanPoll         = "poll"          // the root has directories without a watch
	rescanRootAppeared = "root_appeared" // a missing root now exists
)

// root is one configured root.
type root struct {
	path string

	// Guarded by Watcher.mu.
	active        bool      // exists and is watched and scanned
	polling       bool      // some directory has no watch (budget, kernel refusal): rescanned every FallbackPollInterval
	want          string    // rescan asked for by the event loop ("" = none)
	nextPoll      time.Time // next polling rescan
	missingLogged bool
}

// scanLoop runs the initial scan, then every rescan: asked for (overflow, a vanished
// root), periodic, polling of roots short of watches, and checks for missing roots.
func (w *Watcher) scanLoop(ctx context.Context) {
	for _, r := range w.roots {
		if ctx.Err() != nil {
			return
		}
		w.activate(ctx, r, rescanInitial, true)
	}
	w.mu.Lock()
	w.initDone = true
	w.checkReadyLocked()
	w.mu.Unlock()

	periodicOn := w.opts.RescanInterval > 0
	now := time.Now()
	nextPeriodic := now.Add(w.opts.RescanInterval)
	nextRootPoll := now.Add(w.opts.RootPollInterval)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		now = time.Now()
		wake := now.Add(time.Hour)
		if periodicOn {
			wake = earlier(wake, nextPeriodic)
		}
		w.mu.Lock()
		for _, r := range w.roots {
			switch {
			case r.want != "":
				wake = now
			case !r.active:
				wake = earlier(wake, nextRootPoll)
			case r.polling:
				wake = earlier(wake, r.nextPoll)
			}
		}
		w.mu.Unlock()
		if d := wake.Sub(now); d > 0 {
			t.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-w.scanKick:
			case <-t.C:
			}
		}
		now = time.Now()
		periodic := periodicOn && !now.Before(nextPeriodic)
		if periodic {
			nextPeriodic = now.Add(w.opts.RescanInterval)
		}
		rootPoll := !now.Before(nextRootPoll)
		if rootPoll {
			nextRootPoll = now.Add(w.opts.RootPollInterval)
		}
		for _, r := range w.roots {
			if ctx.Err() != nil {
				return
			}
			w.mu.Lock()
			active, polling, want, due := r.active, r.polling, r.want, !now.Before(r.nextPoll)
			r.want = ""
			w.mu.Unlock()
			switch {
			case !active:
				if rootPoll || want != "" {
					w.activate(ctx, r, rescanRootAppeared, false)
				}
			case want != "":
				w.rescan(ctx, r, want, false)
			case periodic:
				w.rescan(ctx, r, rescanPeriodic, false)
			case polling && due:
				w.rescan(ctx, r, rescanPoll, false)
			}
		}
	}
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// activate starts watching r if it exists (a directory, or a symlink to one: the
// configured root itself may be a link; nothing below it is followed).
func (w *Watcher) activate(ctx context.Context, r *root, reason string, initial bool) {
	fi, err := os.Stat(r.path)
	if err != nil || !fi.IsDir() {
		w.mu.Lock()
		logIt := !r.missingLogged
		r.missingLogged = true
		w.updateRootGaugesLocked()
		w.mu.Unlock()
		if logIt {
			w.log.Info("root does not exist yet; waiting for it", zap.String("root", r.path), zap.Error(err))
		}
		return
	}
	w.mu.Lock()
	r.active, r.missingLogged = true, false
	w.updateRootGaugesLocked()
	w.mu.Unlock()
	if !initial {
		w.log.Info("root appeared", zap.String("root", r.path))
	}
	w.rescan(ctx, r, reason, initial)
}

// rootLost handles a root that was removed or renamed: its watches go, its files are
// looked at (they vanish, and are Gone after MoveGrace unless they show up again), and
// the root is polled for.
func (w *Watcher) rootLost(r *root) {
	w.mu.Lock()
	if !r.active {
		w.mu.Unlock()
		return
	}
	r.active, r.polling = false, false
	stale := w.forgetDirsLocked(r.path)
	r.want = rescanRootAppeared
	w.updateRootGaugesLocked()
	w.mu.Unlock()
	w.removeWatches(stale)
	w.log.Warn("root vanished; waiting for it to reappear", zap.String("root", r.path))
	kick(w.scanKick)
}

// setPollingLocked switches r's polling fallback, logging the change.
func (w *Watcher) setPollingLocked(r *root, on bool) {
	if r.polling == on {
		return
	}
	r.polling = on
	if on {
		r.nextPoll = time.Now().Add(w.opts.FallbackPollInterval)
		kick(w.scanKick) // the scanner may be asleep for longer than that
		w.log.Warn("cannot watch every directory (over the watch budget, refused by the kernel, or no event source); polling the root",
			zap.String("root", r.path), zap.Duration("interval", w.opts.FallbackPollInterval),
			zap.Int("watches", w.budget.used), zap.Int("watch_budget", w.budget.shown()))
	} else {
		w.log.Info("every directory is watched again; polling stopped", zap.String("root", r.path))
	}
	w.updateRootGaugesLocked()
}

func (w *Watcher) updateRootGaugesLocked() {
	var waiting, polling int
	for _, r := range w.roots {
		if !r.active {
			waiting++
		} else if r.polling {
			polling++
		}
	}
	w.m.waitingRoots.Set(float64(waiting))
	w.m.pollingRoots.Set(float64(polling))
}
