// Which occurrences of a repeated failure are logged: the first of a run, then every
// Nth, so that a loop retrying for hours writes a few lines with a count instead of one
// per attempt (Litestream's monitor loop does the same).
package logx

import "sync/atomic"

// Run counts the consecutive occurrences of one failure. The zero value logs only the
// first of each run; set Every to log every Every-th as well. It is safe for concurrent
// use.
type Run struct {
	Every int64
	n     atomic.Int64
}

// Hit counts one occurrence and returns the count so far in this run and whether to log it.
func (r *Run) Hit() (count int64, log bool) {
	n := r.n.Add(1)
	return n, n == 1 || (r.Every > 0 && n%r.Every == 0)
}

// End ends the run (the failure stopped) and returns how many occurrences it had.
func (r *Run) End() int64 { return r.n.Swap(0) }
