package watcher

import (
	"container/heap"
	"context"
	"time"
)

// The clock fires per-file deadlines (retry after a sink error, Gone after MoveGrace)
// from one goroutine and one timer, however many files wait: no goroutine or timer per
// file, and nothing left running when Run returns.

type deadlineKind int

const (
	kindRetry  deadlineKind = iota // look at the file again (fileState.retryAt)
	kindGone                       // report the vanished file Gone (fileState.goneAt)
	kindSettle                     // check every delivered byte (fileState.settleAt)
)

type deadline struct {
	at   time.Time
	s    *fileState
	kind deadlineKind
}

// deadlines is a min-heap by time. A deadline that no longer matches its file's
// retryAt/goneAt is stale and ignored when it fires.
type deadlines []deadline

func (d deadlines) Len() int           { return len(d) }
func (d deadlines) Less(i, j int) bool { return d[i].at.Before(d[j].at) }
func (d deadlines) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *deadlines) Push(x any)        { *d = append(*d, x.(deadline)) }
func (d *deadlines) Pop() any {
	old := *d
	x := old[len(old)-1]
	old[len(old)-1] = deadline{}
	*d = old[:len(old)-1]
	return x
}

// afterLocked arranges for s to be looked at after d and returns the deadline.
func (w *Watcher) afterLocked(d time.Duration, s *fileState, kind deadlineKind) time.Time {
	at := time.Now().Add(d)
	heap.Push(&w.clock, deadline{at: at, s: s, kind: kind})
	if w.clock[0].s == s && w.clock[0].at.Equal(at) {
		kick(w.clockKick)
	}
	return at
}

func (w *Watcher) clockLoop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		w.mu.Lock()
		now := time.Now()
		for len(w.clock) > 0 && !w.clock[0].at.After(now) {
			d := heap.Pop(&w.clock).(deadline)
			switch s := d.s; d.kind {
			case kindRetry:
				if s.retryAt.Equal(d.at) {
					s.retryAt = time.Time{}
					w.scheduleLocked(s)
				}
			case kindSettle:
				if s.settleAt.Equal(d.at) {
					s.settleAt, s.settleDue = time.Time{}, true
					w.scheduleLocked(s)
				}
			case kindGone:
				if s.vanished && s.goneAt.Equal(d.at) {
					s.goneDue = true
					w.scheduleLocked(s)
				}
			}
		}
		wait := time.Hour
		if len(w.clock) > 0 {
			wait = w.clock[0].at.Sub(now)
		}
		w.mu.Unlock()
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-w.clockKick:
		case <-t.C:
		}
	}
}
