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
	path, rel string
	root      *root
	// Its turn with the workers (watcher.go).
	queued      bool // in Watcher.queue
	running     bool // a worker has it
	dirty       bool // something happened while it ran: queue it again
	needRun     bool // the last run failed: a rescan looks again even if nothing changed
	initPending bool // part of the initial scan, not run yet
	// Its path and identity (identity.go).
	dropped  bool // forgotten: runs do nothing
	vanished bool // its path no longer holds it; Gone after MoveGrace unless it shows up elsewhere
	idKnown  bool
	inByID   bool // Watcher.byID[id] == this
	// Asked of the next run by other goroutines; the run takes them (decide's stepTake).
	goneDue   bool // MoveGrace is over: the next run reports Gone
	moved     bool // re-keyed to a new path: the next run reports Moved
	reopen    bool // Reopen asked for it: the next run opens it again as Truncated
	settleDue bool // SettleDelay passed since the last change: the next run checks every delivered byte
	// Its deadlines (clock.go), identity, and what the last complete run saw.
	settleAt time.Time
	retryAt  time.Time
	goneAt   time.Time
	id       FileID
	aliasOf  FileID // a second name of this tailed inode, waiting (Watcher.aliases)
	seenGen  uint64
	snap     statSnap // what the last complete run saw, for stat-only rescans
	mstate   string   // its files{state} label

	// Owned by the worker running the file (one at a time, handed over under Watcher.mu).
	// The standing with the sink (decide.go) is phase, pendingWhy, movePending,
	// unsettled and resumedGrew: decide says what it becomes (apply), and sinkGone
	// makes the file unopened when the sink hears it is gone.
	phase       phase
	movePending bool       // a Moved not yet accepted by the sink
	resumedGrew bool       // the last read found lines (or a torn tail) past a Start
	unsettled   bool       // the sink was told Settled(false) since its last Open
	agains      uint8      // consecutive runs cut short by a race (see again), at most maxAgains+1
	pendingWhy  OpenReason // reason of the next Open while the phase wants one
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

// standing fills in the part of in that is s's standing with the sink.
func (s *fileState) standing(in *seen) {
	in.phase, in.why, in.movePending, in.unsettled, in.grew = s.phase, s.pendingWhy, s.movePending, s.unsettled, s.resumedGrew
}

// apply makes v's standing that of s, and of in for the steps after.
func (s *fileState) apply(in *seen, v verdict) {
	s.phase, s.pendingWhy, s.movePending, s.unsettled, s.resumedGrew = v.phase, v.why, v.movePending, v.unsettled, v.grew
	s.standing(in)
}

// run looks at one file: who is at its path now, whether it was rewritten, and reads
// what is new, delivering complete lines. Each step does what decide says of what the
// steps before it saw.
func (w *Watcher) run(ctx context.Context, lr *lineReader, s *fileState) {
	in := seen{step: stepTake, checks: w.opts.SettleDelay > 0, settleSink: w.settles != nil}
	w.mu.Lock()
	s.standing(&in)
	in.dropped, in.vanished, in.goneDue, in.moved = s.dropped, s.vanished, s.goneDue, s.moved
	v := decide(in)
	switch v.act {
	case actIdle:
		w.mu.Unlock()
		return
	case actGone:
		s.goneDue = false
		w.dropLocked(s)
		w.mu.Unlock()
		w.sinkGone(s)
		s.apply(&in, v)
		return
	}
	s.apply(&in, v)
	path, rel, r := s.path, s.rel, s.root
	in.reopen, in.settle = s.reopen, s.settleDue
	s.reopen, s.settleDue, s.moved = false, false, false
	id, idKnown := s.id, s.idKnown
	w.mu.Unlock()

	nid, ok := w.identify(s, path, id, idKnown, &in)
	if !ok {
		w.notLooked(s, &in)
		return
	}
	f, err := os.OpenFile(path, openFlags, 0)
	if err != nil {
		w.notLooked(s, &in)
		if isGone(err) {
			w.vanish(s, path)
		} else {
			w.fail(s, errReason(err), "open", err, false)
		}
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		w.notLooked(s, &in)
		w.fail(s, errReason(err), "stat", err, false)
		return
	}
	if FileIDOf(fi) != nid {
		w.notLooked(s, &in)
		w.again(s, errors.New("file changed between stat and open")) // renamed meanwhile: look again
		return
	}
	size := fi.Size()
	file := File{Root: r.path, Rel: rel, Path: path, ID: nid, Size: size, MTime: fi.ModTime().UnixNano()}

	v = w.look(lr, f, s, &in, size, snapOf(fi))
	switch v.act {
	case actOpen:
		if (v.reason == Truncated || v.reason == Rechecked) && s.phase != unopened {
			w.log.Info("session file changed under what was delivered; opening it again",
				zap.String("path", path), zap.String("reason", v.reason.String()), zap.Bool("settled_check", in.settle))
		}
		if v.untorn {
			w.resetTorn(s)
		}
		if v = w.announce(ctx, lr, f, s, &in, file, fi, v.reason); v.act != actTail && v.act != actDone {
			return
		}
	case actDone, actTail:
		s.file = file
	}
	if v.sayUnsettled {
		w.settles.Settled(file, false)
	}
	if v.act == actDone {
		w.succeed(s, fi, v.arm)
		return
	}
	w.deliver(ctx, lr, f, s, &in, file, fi)
}

// notLooked keeps the settled check due when a run that took it ends before it looked at
// the file (it could not be stat'ed or opened, or was renamed meanwhile): no timer arms
// it again for a file that does not change after this.
func (w *Watcher) notLooked(s *fileState, in *seen) {
	if in.settle {
		w.mu.Lock()
		s.settleDue = true
		w.mu.Unlock()
	}
}

// identify settles who owns the path now that a regular file is there, and decides
// what that means for the sink. ok is false when the run ends here (the path lost, let
// go, or an error).
func (w *Watcher) identify(s *fileState, path string, id FileID, idKnown bool, in *seen) (nid FileID, ok bool) {
	fi, err := os.Lstat(path)
	if err != nil {
		if isGone(err) {
			w.vanish(s, path)
		} else {
			w.fail(s, errReason(err), "stat", err, false)
		}
		return nid, false
	}
	if !fi.Mode().IsRegular() {
		w.vanish(s, path)
		return nid, false
	}
	nid = FileIDOf(fi)
	if !idKnown || nid != id {
		if !w.resolve(s, path, nid) {
			return nid, false
		}
		in.replaced = idKnown
	}
	in.step = stepIdentify
	v := decide(*in)
	if v.untorn {
		w.resetTorn(s)
	}
	s.apply(in, v)
	return nid, true
}

// look compares the file with what was delivered from it, as far as decide asks, and
// returns the verdict: open it for the sink, read on, or nothing to read (skipped).
func (w *Watcher) look(lr *lineReader, f *os.File, s *fileState, in *seen, size int64, now statSnap) verdict {
	in.step = stepLook
	in.shrunk = size < s.file.Size
	in.changed = s.snap.ok && now != s.snap // s.snap is written by this worker only
	in.resumed, in.pastTail = !s.t.prefixOK, size > s.t.off
	for {
		v := decide(*in)
		switch v.act {
		case actCheckContent:
			in.content = w.sameContent(lr, f, s, size)
		case actCheckPrefix:
			in.prefix = w.samePrefix(lr, f, s)
		default:
			if v.goneFirst {
				w.sinkGone(s)
			}
			s.apply(in, v)
			return v
		}
	}
}

// announce opens the file for the sink (Sink.Open, with reason why) and takes its
// answer. The verdict is actTail or actDone when the file was opened, with s at the
// Start the sink gave.
func (w *Watcher) announce(ctx context.Context, lr *lineReader, f *os.File, s *fileState, in *seen, file File, fi os.FileInfo, why OpenReason) verdict {
	size := file.Size
	lead, more, n, err := lr.leadLines(f, size)
	w.addRead(n)
	if err != nil {
		w.fail(s, errReason(err), "read", err, false)
		return verdict{act: actFail}
	}
	in.step, in.reason, in.answer, in.start = stepAnswer, why, answerNoLead, startFits
	var st Start
	var t tail
	if len(lead) > 0 {
		s.file = file
		// For Open only: the file's state keeps a digest of the first line (sameContent).
		file.Lead = &Lead{Lines: lead, More: more}
		st, err = w.sink.Open(ctx, file, why)
		file.Lead = nil
		switch {
		case err != nil && ctx.Err() != nil:
			in.answer = answerCanceled
		case err != nil:
			in.answer = answerFailed
		case st.Wait:
			in.answer = answerWait
		case st.Skip:
			in.answer = answerSkip
			t = tail{off: st.Offset, ord: st.Ordinal, scanned: st.Offset, prefixOK: st.Offset == 0}
		default:
			in.answer = answerStart
			t = tail{off: st.Offset, ord: st.Ordinal, scanned: st.Offset, prefixOK: st.Offset == 0}
			// The Start must fit the file, and the line before it is the anchor the
			// checks of every run compare.
			if err = checkStart(f, st, size); err == nil && st.Offset > 0 {
				var n int64
				t.last, n, err = lr.lineBefore(f, st.Offset)
				w.addRead(n)
			}
			switch {
			case errors.Is(err, errRewritten):
				in.start = startRewritten
			case err != nil:
				in.start = startBad
			}
			in.resumed, in.pastTail = !t.prefixOK, size > t.off
		}
	}
	v := decide(*in)
	s.apply(in, v)
	switch v.act {
	case actHold:
		w.setState(s, statePending)
		w.succeed(s, fi, v.arm)
		return v
	case actStop:
		return v
	case actRetry:
		if in.answer == answerFailed {
			w.fail(s, reasonSinkOpen, "open", err, true)
		} else {
			w.fail(s, reasonBadStart, "open", err, true)
		}
		return v
	case actAgain:
		w.again(s, err)
		return v
	}
	w.mu.Lock()
	if !s.snap.ok {
		// The file as the sink was told of it. A first run that ends early (a line
		// refused, a short read) leaves no complete run to compare with, and the run
		// that completes may already read a rewritten file: against this, it sees the
		// change and arms the settled check.
		s.snap = snapOf(fi)
	}
	w.mu.Unlock()
	s.header, s.skipSize = lr.sumHeader(lead[0]), size
	s.t = t
	if s.phase == skipped {
		w.setState(s, stateSkipped)
	} else {
		w.setState(s, stateTailing)
	}
	s.file = file
	return v
}

// deliver reads the lines that completed since the last run into the sink, and decides
// what the way the read ended means.
func (w *Watcher) deliver(ctx context.Context, lr *lineReader, f *os.File, s *fileState, in *seen, file File, fi os.FileInfo) {
	size := file.Size
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
	if delivered := s.t.ord - ord; delivered > 0 {
		w.lines.Add(delivered)
		w.m.lines.Add(float64(delivered))
	}
	var se sinkError
	isSink := errors.As(err, &se)
	in.step, in.delivered = stepRead, s.t.ord > ord
	in.resumed, in.pastTail = !s.t.prefixOK, size > s.t.off
	switch {
	case ctx.Err() != nil:
		in.read = readCanceled
	case errors.Is(err, errRewritten):
		in.read = readRewritten
	case errors.Is(err, errShortRead):
		in.read = readShort
	case isSink && errors.Is(se.err, ErrReopen):
		in.read, err = readSinkReopen, se.err
	case isSink:
		in.read, err = readSinkFailed, se.err
	case err != nil:
		in.read = readFailed
	default:
		in.read = readDone
	}
	v := decide(*in)
	s.apply(in, v)
	switch v.act {
	case actAgain:
		w.again(s, err)
	case actRetry:
		w.fail(s, reasonSinkLine, "line", err, true)
	case actFail:
		w.fail(s, errReason(err), "read", err, false)
	case actDone:
		if v.saySettled {
			w.settles.Settled(file, true)
		}
		w.setTorn(s, s.t.off, size-s.t.off)
		w.succeed(s, fi, v.arm)
	}
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

// succeed records what a complete run saw and clears the error state. With arm (decide:
// the file changed since its last complete run), every delivered byte is checked once it
// has been quiet for SettleDelay: a rewrite the checks of every run cannot see.
func (w *Watcher) succeed(s *fileState, fi os.FileInfo, arm bool) {
	if s.errKey != "" {
		w.log.Info("session file processed again after errors", zap.String("path", s.file.Path), zap.Int64("offset", s.t.off))
		s.errKey = ""
	}
	s.backoff, s.agains = 0, 0
	snap := snapOf(fi)
	w.mu.Lock()
	if arm {
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
