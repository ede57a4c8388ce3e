package watcher

// The per-file state machine. A file's standing with the sink is its phase (with the
// reason of the next Open, a move the sink has yet to hear, and whether the settled
// check has lines to confirm). One run of the file (run, file.go) is a few effectful
// steps: take it from the queue, identify who is at its path, open it and look at what
// changed, announce it to the sink, read what is new. After each step the run asks
// decide, a pure function of the standing and of what the step saw, what to do next;
// decide never reads, locks or calls anything, so every case it knows is a row of a
// table (decide_test.go).

// phase is where a file stands with the sink.
type phase uint8

const (
	// unopened: the sink holds no Open of the file (never opened, or told Gone). The next
	// Open is news to it.
	unopened phase = iota
	// stale: the sink opened the file, but its content since changed in a way reading on
	// cannot tell it (rewritten, replaced, to be compared again): it is opened again.
	stale
	// tailing: the sink opened the present content; complete lines are delivered.
	tailing
	// skipped: the sink opened the present content and wants none of its lines.
	skipped
)

func (p phase) String() string {
	switch p {
	case unopened:
		return "unopened"
	case stale:
		return "stale"
	case tailing:
		return "tailing"
	case skipped:
		return "skipped"
	}
	return "phase?"
}

// opened reports whether the sink holds the present content: what was delivered is
// checked against the file, and a change of it is a rewrite.
func (p phase) opened() bool { return p == tailing || p == skipped }

// step is how far a run has come when it asks decide what next.
type step uint8

const (
	stepTake     step = iota // taken from the queue: is there anything to look at?
	stepIdentify             // its path holds a regular file, whose identity is settled
	stepLook                 // opened and stat'ed: open it for the sink, or read on?
	stepAnswer               // the sink answered an Open (or the first line is not complete)
	stepRead                 // the read of what is new ended
)

// contentCheck is what sameContent found: is what was delivered still in the file?
type contentCheck uint8

const (
	contentUnchecked contentCheck = iota
	contentSame
	contentShorter  // smaller than the delivered offset or the header (or than a skipped file was)
	contentHeader   // the header line is not the one opened
	contentLastLine // the last delivered line is not where it was, just after a '\n'
)

// answer is what came of announcing the file to the sink.
type answer uint8

const (
	answerStart    answer = iota // a Start to tail from (see startCheck)
	answerNoLead                 // the first line is not complete: the sink was not asked
	answerFailed                 // Open returned an error
	answerCanceled               // Open returned as the watcher stops
	answerWait                   // the first lines do not decide yet
	answerSkip                   // not a file to tail
)

// startCheck is how the Start the sink returned fits the file.
type startCheck uint8

const (
	startFits      startCheck = iota
	startRewritten            // the line before the Start changed while it was read
	startBad                  // beyond the file, or not just after a newline
)

// readEnd is how a read of what is new ended.
type readEnd uint8

const (
	readDone       readEnd = iota // up to the size the run found
	readCanceled                  // the watcher is stopping
	readRewritten                 // delivered bytes, or the line being read, changed under it
	readShort                     // the file ended before that size: it shrank meanwhile
	readSinkReopen                // the sink found a line no longer matches (ErrReopen)
	readSinkFailed                // the sink refused a line
	readFailed                    // an I/O error
)

// seen is what decide is asked about: the file's standing as the run found it, and
// what the steps so far saw. A step fills in its part; decide reads only the parts of
// the steps done.
type seen struct {
	step step

	// The standing (fileState).
	phase       phase
	why         OpenReason // the reason of the next Open, while the phase wants one
	movePending bool       // a move the sink has yet to hear (Moved)
	unsettled   bool       // the sink was told Settled(false) since its last Open
	grew        bool       // the last read found bytes past a Start (fileState.resumedGrew)

	// Settings.
	checks     bool // Options.SettleDelay > 0: the settled check runs
	settleSink bool // the sink is a SettleSink

	// stepTake: the path's life and what was asked of this run, under Watcher.mu.
	dropped  bool // forgotten
	vanished bool // its path lost it; waiting out MoveGrace
	goneDue  bool // MoveGrace is over
	moved    bool // re-keyed to a new path
	reopen   bool // Reopen asked for it
	settle   bool // the settled check is due

	// stepIdentify.
	replaced bool // the path holds another file (FileID) than the one known there

	// stepLook, and the tail for the steps after it.
	shrunk   bool // smaller than the size the sink was last given
	changed  bool // the stat is not the one of the last complete run (or of the first Open)
	resumed  bool // the tail started at a Start past 0: the lines before it were not read here
	pastTail bool // the file holds bytes past the next line to deliver
	content  contentCheck
	prefix   prefixCheck

	// stepAnswer.
	reason OpenReason // of the Open answered
	answer answer
	start  startCheck

	// stepRead.
	read      readEnd
	delivered bool // lines were delivered
}

// act is what a run does next.
type act uint8

const (
	actNext         act = iota // go on with the next step
	actIdle                    // nothing: forgotten, or waiting out MoveGrace
	actGone                    // forget it and tell the sink Gone
	actCheckContent            // compare the header and the last delivered line (sameContent)
	actCheckPrefix             // the settled check: every delivered line (samePrefix)
	actOpen                    // announce the file to the sink (Open with reason)
	actTail                    // deliver the lines that completed
	actHold                    // done for now, nothing announced: wait for the file to change
	actDone                    // the run is complete
	actAgain                   // look again once this run ends: a race with a writer
	actRetry                   // failed: look again at the next event, rescan or backoff timer
	actFail                    // failed: look again at the next event or rescan
	actStop                    // the watcher is stopping
)

func (a act) String() string {
	return [...]string{"next", "idle", "gone", "check content", "check prefix", "open", "tail",
		"hold", "done", "again", "retry", "fail", "stop"}[a]
}

// verdict is decide's answer: what to do, the standing after it, and what the sink is
// told besides.
type verdict struct {
	act    act
	reason OpenReason // of an actOpen

	phase       phase
	why         OpenReason
	movePending bool
	unsettled   bool
	grew        bool

	untorn       bool // resolve a reported torn tail: it belonged to content the sink no longer has
	goneFirst    bool // tell the sink Gone for the file it knew before opening this one as new
	sayUnsettled bool // tell the sink Settled(false) before any line is read
	saySettled   bool // tell the sink Settled(true)
	arm          bool // arm the settled check, SettleDelay from now
}

// decide says what a run does next with a file, from what the run has seen so far. It
// is the only place that changes a file's standing.
func decide(in seen) verdict {
	v := verdict{phase: in.phase, why: in.why, movePending: in.movePending, unsettled: in.unsettled, grew: in.grew}
	switch in.step {
	case stepTake:
		switch {
		case in.dropped || (in.vanished && !in.goneDue):
			v.act = actIdle
		case in.goneDue:
			v.act, v.phase, v.untorn = actGone, unopened, true
		default:
			v.act = actNext
			if in.moved {
				// The sink hears a move only of a file it opened.
				v.movePending = in.phase != unopened
			}
		}

	case stepIdentify:
		v.act = actNext
		if in.replaced && in.phase != unopened {
			// A new file at the path (an atomic rename over it): what the sink opened
			// is gone from it, torn tail and all.
			v.phase, v.why, v.untorn = stale, Replaced, true
		}

	case stepLook:
		if (in.reopen || in.shrunk) && v.phase == tailing {
			// Asked to, or smaller than at the last run: bytes the sink was told of are
			// gone, even when none of them was delivered yet (its Open compared the file
			// at that size with the mirror). Pi only appends, or rewrites the whole file.
			v.phase, v.why = stale, Truncated
		}
		checkPrefix := in.settle && v.phase == tailing && !in.resumed
		switch {
		case !v.phase.opened():
			v.act, v.reason = actOpen, v.why
		case in.content == contentUnchecked:
			v.act = actCheckContent
		case in.content != contentSame:
			v = rewritten(in, v)
		case checkPrefix && in.prefix == prefixUnchecked:
			v.act = actCheckPrefix
		case checkPrefix && in.prefix == prefixDiffers:
			v = rewritten(in, v)
		case in.movePending && v.phase == tailing:
			v.act, v.reason = actOpen, Moved
		case in.settle && v.phase == tailing && in.resumed:
			// Resumed from a Start: what was delivered before it is not known here, so
			// the sink compares the whole file with what it mirrored.
			v.phase, v.why = stale, Rechecked
			v.act, v.reason = actOpen, Rechecked
		case v.phase == skipped:
			v.act, v.movePending = actDone, false
		default:
			v.act, v.movePending = actTail, false
			if unsettles(in, v) {
				v.sayUnsettled, v.unsettled = true, true
			}
		}
		if v.act == actOpen {
			v.untorn = true
		}

	case stepAnswer:
		switch {
		case in.answer == answerNoLead || in.answer == answerWait:
			// Empty, its first line torn, or a title written before its header: held
			// until the file changes, then opened with the same reason.
			v.act = actHold
			v.arm = arms(in, v)
		case in.answer == answerCanceled:
			v.act = actStop
		case in.answer == answerFailed || (in.answer == answerStart && in.start == startBad):
			v.act = actRetry
		case in.answer == answerStart && in.start == startRewritten:
			if v.phase != unopened {
				v.phase = stale
			}
			v.why, v.act = Truncated, actAgain
		default:
			v.phase, v.why, v.movePending = tailing, Discovered, false
			if in.answer == answerSkip {
				v.phase = skipped
			}
			// A check was pending when the file moved: the sink's state at the new
			// path hears of it too. Any other Open starts settled.
			v.sayUnsettled = in.unsettled && in.reason == Moved
			v.unsettled = v.sayUnsettled
			if v.phase == skipped {
				v.act = actDone
				break
			}
			v.act = actTail
			if unsettles(in, v) {
				v.sayUnsettled, v.unsettled = true, true
			}
		}

	case stepRead:
		// A tail resumed from a Start that finds lines past it, or the start of one (a
		// torn tail): the file changed while the daemon was away, perhaps rewritten
		// keeping the line before the Start. The settled check then has it compared
		// with the mirror (Rechecked).
		v.grew = in.resumed && (in.delivered || in.pastTail)
		switch in.read {
		case readCanceled:
			v.act = actStop
		case readRewritten, readSinkReopen:
			// What was delivered changed under the read, or the sink found a line no
			// longer matches what it mirrored: nothing of the new content was
			// delivered; open it again as a rewrite, at once.
			v.phase, v.why, v.act = stale, Truncated, actAgain
		case readShort:
			v.act = actAgain // it shrank while being read: the next run says how
		case readSinkFailed:
			v.act = actRetry
		case readFailed:
			v.act = actFail
		default:
			v.act = actDone
			if in.settle && in.unsettled && !in.delivered {
				// The settled check found every delivered byte in place (a change would
				// have reopened the file), and nothing was delivered since.
				v.saySettled, v.unsettled = true, false
			}
			v.arm = arms(in, v)
		}
	}
	return v
}

// rewritten is the verdict on a file whose delivered bytes changed: opened again as a
// rewrite. A file that moved and changed is not the file known under that FileID (its
// inode number was freed and reused): the old one is gone, this one is new.
func rewritten(in seen, v verdict) verdict {
	v.act, v.phase, v.why = actOpen, stale, Truncated
	if in.movePending {
		v.goneFirst, v.phase, v.why = true, unopened, Discovered
	}
	v.reason = v.why
	return v
}

// unsettles reports whether the sink is to hear, before a read that ends in v, that
// lines are coming which the settled check has yet to confirm: the file changed since its
// last complete run, or a tail resumed from a Start finds bytes past it.
func unsettles(in seen, v verdict) bool {
	return in.settleSink && in.checks && !v.unsettled && (in.changed || (in.resumed && in.pastTail))
}

// arms reports whether a run that ends in v arms the settled check: the file changed
// since its last complete run (or a resumed tail found bytes past its Start), and its
// lines are delivered.
func arms(in seen, v verdict) bool {
	return in.checks && v.phase == tailing && (in.changed || v.grew)
}
