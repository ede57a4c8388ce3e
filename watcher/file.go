package watcher

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// fileState is everything the watcher knows about one session file. There is one per
// file, idle or not: its booleans sit together, so that no padding takes it over a size
// class of the allocator (TestFileStateSize).
type fileState struct {
	// Guarded by Watcher.mu.
	path, rel   string
	root        *root
	queued      bool // in Watcher.queue
	running     bool // a worker has it
	dirty       bool // something happened while it ran: queue it again
	dropped     bool // forgotten: runs do nothing
	vanished    bool // its path no longer holds it; Gone after MoveGrace unless it shows up elsewhere
	reopen      bool // Reopen asked for it: the next run opens it again as Truncated
	settleDue   bool // SettleDelay passed since the last change: the next run checks every delivered byte
	goneDue     bool // MoveGrace is over: the next run reports Gone
	moved       bool // re-keyed to a new path: the next run reports Moved
	idKnown     bool
	inByID      bool // Watcher.byID[id] == this
	needRun     bool // the last run failed: a rescan looks again even if nothing changed
	initPending bool // part of the initial scan, not run yet
	settleAt    time.Time
	id          FileID
	aliasOf     FileID // a second name of this tailed inode, waiting (Watcher.aliases)
	seenGen     uint64
	snap        statSnap // what the last complete run saw, for stat-only rescans
	mstate      string
	retryAt     time.Time
	goneAt      time.Time

	// Owned by the worker running the file (one at a time, handed over under Watcher.mu).
	announced   bool // the sink had an Open and no Gone yet
	current     bool // the sink has opened the present content
	movePending bool // a Moved not yet accepted by the sink
	resumedGrew bool // the last run found lines (or a torn tail) past a Start (see run)
	unsettled   bool // the sink was told Settled(false) since its last Open
	skip        bool
	agains      uint8      // consecutive runs cut short by a race (see again), at most maxAgains+1
	pendingWhy  OpenReason // reason of the next Open when !current
	skipSize    int64
	header      headerSum // of the header line the sink opened
	t           tail
	tornOff     int64
	tornN       int64
	file        File // as last given to the sink
	errKey      string
	backoff     time.Duration
}

// statSnap is what a stat-only rescan compares with.
type statSnap struct {
	ok    bool
	id    FileID
	size  int64
	mtime int64 // Unix nanoseconds: comparable, and a third of a time.Time
}

func snapOf(fi os.FileInfo) statSnap {
	return statSnap{ok: true, id: FileIDOf(fi), size: fi.Size(), mtime: fi.ModTime().UnixNano()}
}

// sinkError marks an error returned by Sink.Line.
type sinkError struct{ err error }

func (e sinkError) Error() string { return e.err.Error() }
func (e sinkError) Unwrap() error { return e.err }

// run looks at one file: who is at its path now, whether it was rewritten, and reads
// what is new, delivering complete lines.
func (w *Watcher) run(ctx context.Context, lr *lineReader, s *fileState) {
	w.mu.Lock()
	if s.dropped || (s.vanished && !s.goneDue) {
		w.mu.Unlock()
		return
	}
	if s.goneDue {
		s.goneDue = false
		w.dropLocked(s)
		w.mu.Unlock()
		w.sinkGone(s)
		return
	}
	path, rel, r := s.path, s.rel, s.root
	reopen, settle := s.reopen, s.settleDue
	s.reopen, s.settleDue = false, false
	id, idKnown := s.id, s.idKnown
	if s.moved {
		s.moved = false
		s.movePending = s.announced
	}
	w.mu.Unlock()

	fi, err := os.Lstat(path)
	if err != nil {
		if isGone(err) {
			w.vanish(s, path)
		} else {
			w.fail(s, errReason(err), "stat", err, false)
		}
		return
	}
	if !fi.Mode().IsRegular() {
		w.vanish(s, path)
		return
	}
	nid := FileIDOf(fi)
	if !idKnown || nid != id {
		if !w.resolve(s, path, nid) {
			return
		}
		if idKnown && s.announced {
			w.resetTorn(s)
			s.current, s.pendingWhy = false, Replaced
		}
	}

	f, err := os.OpenFile(path, openFlags, 0)
	if err != nil {
		if isGone(err) {
			w.vanish(s, path)
		} else {
			w.fail(s, errReason(err), "open", err, false)
		}
		return
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		w.fail(s, errReason(err), "stat", err, false)
		return
	}
	if FileIDOf(fi) != nid {
		w.again(s, errors.New("file changed between stat and open")) // renamed meanwhile: look again
		return
	}
	size := fi.Size()
	file := File{Root: r.path, Rel: rel, Path: path, ID: nid, Size: size, MTime: fi.ModTime().UnixNano()}

	if (reopen || size < s.file.Size) && s.current && !s.skip {
		// Asked to, or smaller than at the last run: bytes the sink was told of (its Open
		// compared the file at that size with the mirror) are gone, even when none of them
		// was delivered yet. Pi only appends, or rewrites the whole file (torture T11).
		s.current, s.pendingWhy = false, Truncated
	}
	needOpen, why := false, s.pendingWhy
	switch {
	case !s.current:
		needOpen = true
	case !w.sameContent(lr, f, s, size) || (settle && !s.skip && w.samePrefix(lr, f, s) == prefixDiffers):
		if s.movePending {
			// Not the file we knew under this inode number (it was freed and reused):
			// the old one is gone, this one is new.
			w.sinkGone(s)
			why = Discovered
		} else {
			why = Truncated
		}
		s.current, s.pendingWhy, needOpen = false, why, true
	case s.movePending && !s.skip:
		needOpen, why = true, Moved
	case settle && !s.skip && !s.t.prefixOK:
		// Resumed from a Start: what was delivered before it is not known here, so the
		// sink compares the whole file with what it mirrored.
		s.current, s.pendingWhy, needOpen, why = false, Rechecked, true, Rechecked
	}
	s.movePending = s.movePending && needOpen
	if needOpen && (why == Truncated || why == Rechecked) && s.announced {
		w.log.Info("session file changed under what was delivered; opening it again",
			zap.String("path", path), zap.String("reason", why.String()), zap.Bool("settled_check", settle))
	}

	if needOpen {
		w.resetTorn(s)
		lead, more, n, err := lr.leadLines(f, size)
		w.addRead(n)
		if err != nil {
			w.fail(s, errReason(err), "read", err, false)
			return
		}
		if len(lead) == 0 {
			// Empty or header torn: held until the first line completes.
			w.setState(s, statePending)
			w.succeed(s, fi)
			return
		}
		hdr := lead[0]
		s.file = file
		// For Open only: the file's state keeps a digest of the first line (sameContent).
		file.Lead = &Lead{Lines: lead, More: more}
		st, err := w.sink.Open(ctx, file, why)
		file.Lead = nil
		if err != nil {
			if ctx.Err() == nil {
				w.fail(s, reasonSinkOpen, "open", err, true)
			}
			return
		}
		if st.Wait {
			// The first lines do not decide yet (a title written before its header):
			// held like a torn first line, opened again when the file changes.
			w.setState(s, statePending)
			w.succeed(s, fi)
			return
		}
		t := tail{off: st.Offset, ord: st.Ordinal, scanned: st.Offset, prefixOK: st.Offset == 0}
		if !st.Skip {
			if err = checkStart(f, st, size); err == nil && st.Offset > 0 {
				var n int64
				t.last, n, err = lr.lineBefore(f, st.Offset)
				w.addRead(n)
			}
			if errors.Is(err, errRewritten) {
				s.current, s.pendingWhy = false, Truncated
				w.again(s, err)
				return
			}
			if err != nil {
				w.fail(s, reasonBadStart, "open", err, true)
				return
			}
		}
		s.announced, s.current, s.movePending = true, true, false
		if s.unsettled && why == Moved {
			w.settles.Settled(file, false) // the check still pending: the sink's new state hears it
		} else {
			s.unsettled = false
		}
		s.pendingWhy = Discovered
		w.mu.Lock()
		if !s.snap.ok {
			// The file as the sink was told of it. A first run that ends early (a line
			// refused, a short read) leaves no complete run to compare with, and the run
			// that completes may already read a rewritten file: against this, it sees the
			// change and arms the settled check.
			s.snap = snapOf(fi)
		}
		w.mu.Unlock()
		s.header, s.skip, s.skipSize = lr.sumHeader(hdr), st.Skip, size
		s.t = t
		if st.Skip {
			w.setState(s, stateSkipped)
		} else {
			w.setState(s, stateTailing)
		}
	}
	s.file = file
	if s.skip {
		w.succeed(s, fi)
		return
	}

	// A change is checked by the settled check only (succeed arms it when the file
	// changed since its last complete run, or a resumed tail finds bytes past its
	// Start): the sink hears so before the first line of it.
	if w.settles != nil && !s.unsettled && w.opts.SettleDelay > 0 &&
		((s.snap.ok && snapOf(fi) != s.snap) || (!s.t.prefixOK && size > s.t.off)) {
		s.unsettled = true
		w.settles.Settled(file, false)
	}
	ord := s.t.ord
	n, err := lr.advance(f, &s.t, size, func(l Line) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.sink.Line(ctx, file, l); err != nil {
			return sinkError{err}
		}
		return nil
	})
	w.addRead(n)
	// A tail resumed from a Start that finds lines past it, or the start of one (a torn
	// tail): the file changed while the daemon was away, perhaps rewritten keeping the
	// line before the Start. The settled check then has it compared with the mirror
	// (Rechecked).
	s.resumedGrew = !s.t.prefixOK && (s.t.ord > ord || size > s.t.off)
	if delivered := s.t.ord - ord; delivered > 0 {
		w.lines.Add(delivered)
		w.m.lines.Add(float64(delivered))
	}
	var se sinkError
	switch {
	case ctx.Err() != nil:
		return
	case errors.Is(err, errRewritten):
		// Bytes already delivered, or read for the next line, changed under the read:
		// nothing of the new content was delivered; it is opened again as a rewrite.
		s.current, s.pendingWhy = false, Truncated
		w.again(s, err)
		return
	case errors.Is(err, errShortRead):
		w.again(s, err) // it shrank while being read: the next run says how
		return
	case errors.As(err, &se) && errors.Is(se.err, ErrReopen):
		// The sink found the file no longer matches what it mirrored: open it again as a
		// rewrite, at once.
		s.current, s.pendingWhy = false, Truncated
		w.again(s, se.err)
		return
	case errors.As(err, &se):
		w.fail(s, reasonSinkLine, "line", se.err, true)
		return
	case err != nil:
		w.fail(s, errReason(err), "read", err, false)
		return
	}
	if settle && s.unsettled && s.t.ord == ord {
		// The settled check found every delivered byte in place (a change would have
		// reopened the file above), and nothing was delivered since.
		s.unsettled = false
		w.settles.Settled(file, true)
	}
	w.setTorn(s, s.t.off, size-s.t.off)
	w.succeed(s, fi)
}

// setTorn reports a change of the torn tail.
func (w *Watcher) setTorn(s *fileState, off, n int64) {
	if n == s.tornN && (n == 0 || off == s.tornOff) {
		return
	}
	if (n > 0) != (s.tornN > 0) {
		w.mu.Lock()
		if n > 0 {
			w.torn++
			w.m.torn.Inc()
		} else {
			w.torn--
			w.m.torn.Dec()
		}
		w.mu.Unlock()
	}
	s.tornOff, s.tornN = off, n
	w.sink.Torn(s.file, off, n)
}

// resetTorn resolves a reported torn tail before the file is reopened or gone.
func (w *Watcher) resetTorn(s *fileState) {
	if s.tornN > 0 {
		w.setTorn(s, s.tornOff, 0)
	}
}

// again queues s once more after its current run, for a race with a writer that the
// next run settles. Should it keep happening (a file system whose sizes or ids do not
// hold still), it becomes an error with a backoff rather than a busy loop.
func (w *Watcher) again(s *fileState, why error) {
	if s.agains++; s.agains > maxAgains {
		s.agains = 0
		w.fail(s, reasonIO, "read", why, true)
		return
	}
	w.mu.Lock()
	w.scheduleLocked(s)
	w.mu.Unlock()
}

const maxAgains = 3

// succeed records what a complete run saw and clears the error state.
func (w *Watcher) succeed(s *fileState, fi os.FileInfo) {
	if s.errKey != "" {
		w.log.Info("session file processed again after errors", zap.String("path", s.file.Path), zap.Int64("offset", s.t.off))
		s.errKey = ""
	}
	s.backoff, s.agains = 0, 0
	snap := snapOf(fi)
	w.mu.Lock()
	if ((s.snap.ok && snap != s.snap) || s.resumedGrew) && s.current && !s.skip && w.opts.SettleDelay > 0 {
		// Changed since the last complete run: once it has been quiet for SettleDelay,
		// every delivered byte is checked (a rewrite the per-run checks cannot see).
		s.settleAt = w.afterLocked(w.opts.SettleDelay, s, kindSettle)
	}
	s.snap, s.needRun = snap, false
	w.mu.Unlock()
}

// fail logs (once per streak of the same error), counts, and arranges the retry: the
// next event or rescan, and for a sink error also a backoff timer.
func (w *Watcher) fail(s *fileState, reason, op string, err error, retry bool) {
	w.countError(reason)
	w.mu.Lock()
	path := s.path
	s.needRun = true
	if retry {
		s.backoff = min(max(2*s.backoff, minBackoff), maxBackoff)
		s.retryAt = w.afterLocked(s.backoff, s, kindRetry)
	}
	w.mu.Unlock()
	if key := reason + "/" + op; key != s.errKey {
		s.errKey = key
		w.log.Warn("cannot process session file; will retry", zap.String("path", path),
			zap.Int64("offset", s.t.off), zap.String("op", op), zap.String("reason", reason), zap.Error(err))
	}
}

func isGone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

func errReason(err error) string {
	if errors.Is(err, fs.ErrPermission) {
		return reasonPermission
	}
	return reasonIO
}
