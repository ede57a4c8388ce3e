package watcher

import "testing"

// TestDecide is the table of the per-file state machine (decide.go): one row per case the
// watcher must tell apart, the torture findings (torture/FINDINGS.md) among them.
func TestDecide(t *testing.T) {
	on := func(in seen) seen { in.checks, in.settleSink = true, true; return in }
	for _, c := range []struct {
		name string
		in   seen
		want verdict
	}{
		// Taken from the queue.
		{"forgotten: nothing to do",
			seen{step: stepTake, dropped: true},
			verdict{act: actIdle}},
		{"vanished: nothing until it shows up elsewhere or MoveGrace ends",
			seen{step: stepTake, phase: tailing, vanished: true},
			verdict{act: actIdle, phase: tailing}},
		{"MoveGrace over: Gone, its torn tail resolved",
			seen{step: stepTake, phase: tailing, vanished: true, goneDue: true},
			verdict{act: actGone, phase: unopened, untorn: true}},
		{"re-keyed to a new path, opened: the sink is to hear Moved",
			seen{step: stepTake, phase: tailing, moved: true},
			verdict{act: actNext, phase: tailing, movePending: true}},
		{"re-keyed before the sink opened it: nothing to tell",
			seen{step: stepTake, phase: unopened, moved: true, movePending: true},
			verdict{act: actNext, phase: unopened}},

		// Its path's file identified.
		{"replaced (renamed over the path): opened again as Replaced, its torn tail resolved",
			seen{step: stepIdentify, phase: tailing, replaced: true},
			verdict{act: actNext, phase: stale, why: Replaced, untorn: true}},
		{"replaced while a reopen was pending: Replaced",
			seen{step: stepIdentify, phase: stale, why: Truncated, replaced: true},
			verdict{act: actNext, phase: stale, why: Replaced, untorn: true}},
		{"a new file at a path the sink never opened: still news",
			seen{step: stepIdentify, phase: unopened, replaced: true},
			verdict{act: actNext, phase: unopened}},

		// Looked at: open it for the sink, or read on?
		{"found: Discovered",
			seen{step: stepLook, phase: unopened},
			verdict{act: actOpen, reason: Discovered, phase: unopened, untorn: true}},
		{"held with a reason (first line torn, Wait): opened with it when it changed",
			seen{step: stepLook, phase: stale, why: Replaced},
			verdict{act: actOpen, reason: Replaced, phase: stale, why: Replaced, untorn: true}},
		{"tailed: what was delivered is compared first",
			seen{step: stepLook, phase: tailing, movePending: true},
			verdict{act: actCheckContent, phase: tailing, movePending: true}},
		{"appended to, what was delivered in place: read on",
			seen{step: stepLook, phase: tailing, content: contentSame},
			verdict{act: actTail, phase: tailing}},
		{"shorter than what was delivered: Truncated",
			seen{step: stepLook, phase: tailing, content: contentShorter},
			verdict{act: actOpen, reason: Truncated, phase: stale, why: Truncated, untorn: true}},
		{"header rewritten, same size: Truncated",
			seen{step: stepLook, phase: tailing, content: contentHeader},
			verdict{act: actOpen, reason: Truncated, phase: stale, why: Truncated, untorn: true}},
		{"T12: every line moved one byte on, the last delivered one (empty) no longer after a newline: Truncated",
			seen{step: stepLook, phase: tailing, content: contentLastLine},
			verdict{act: actOpen, reason: Truncated, phase: stale, why: Truncated, untorn: true}},
		{"T11: smaller than the size the sink was given, nothing delivered yet: Truncated without a comparison",
			seen{step: stepLook, phase: tailing, shrunk: true, pastTail: true},
			verdict{act: actOpen, reason: Truncated, phase: stale, why: Truncated, untorn: true}},
		{"T22: past the size the sink judged at its Open is growth: read on",
			seen{step: stepLook, phase: tailing, pastTail: true, content: contentSame},
			verdict{act: actTail, phase: tailing}},
		{"Reopen asked (the mirror differs from the file): Truncated",
			seen{step: stepLook, phase: tailing, reopen: true},
			verdict{act: actOpen, reason: Truncated, phase: stale, why: Truncated, untorn: true}},
		{"Reopen asked of a skipped file: nothing to compare",
			seen{step: stepLook, phase: skipped, reopen: true, content: contentSame},
			verdict{act: actDone, phase: skipped}},
		{"skipped, header rewritten: opened again (it may be a session now)",
			seen{step: stepLook, phase: skipped, content: contentHeader},
			verdict{act: actOpen, reason: Truncated, phase: stale, why: Truncated, untorn: true}},
		{"skipped and moved: the sink is not told",
			seen{step: stepLook, phase: skipped, movePending: true, content: contentSame},
			verdict{act: actDone, phase: skipped}},
		{"T1: settled check due, header and last line in place: every delivered line compared",
			seen{step: stepLook, phase: tailing, settle: true, content: contentSame},
			verdict{act: actCheckPrefix, phase: tailing}},
		{"T1: the settled check finds an earlier line changed, same size: Truncated",
			seen{step: stepLook, phase: tailing, settle: true, content: contentSame, prefix: prefixDiffers},
			verdict{act: actOpen, reason: Truncated, phase: stale, why: Truncated, untorn: true}},
		{"settled check passed: read on",
			seen{step: stepLook, phase: tailing, settle: true, content: contentSame, prefix: prefixSame},
			verdict{act: actTail, phase: tailing}},
		{"T1, resumed: a tail resumed from a Start has nothing to compare with: Rechecked",
			seen{step: stepLook, phase: tailing, settle: true, resumed: true, content: contentSame},
			verdict{act: actOpen, reason: Rechecked, phase: stale, why: Rechecked, untorn: true}},
		{"moved, what was delivered in place: Moved, the same content",
			seen{step: stepLook, phase: tailing, movePending: true, content: contentSame},
			verdict{act: actOpen, reason: Moved, phase: tailing, movePending: true, untorn: true}},
		{"moved, settled check due: the check first",
			seen{step: stepLook, phase: tailing, movePending: true, settle: true, content: contentSame},
			verdict{act: actCheckPrefix, phase: tailing, movePending: true}},
		{"moved as a resumed tail's settled check came due: Moved (the check waits for a change)",
			seen{step: stepLook, phase: tailing, movePending: true, settle: true, resumed: true, content: contentSame},
			verdict{act: actOpen, reason: Moved, phase: tailing, movePending: true, untorn: true}},
		{"moved, other content (an inode number freed and reused): Gone, then Discovered",
			seen{step: stepLook, phase: tailing, movePending: true, content: contentHeader},
			verdict{act: actOpen, reason: Discovered, phase: unopened, movePending: true, untorn: true, goneFirst: true}},
		{"moved and shrunk: Truncated, the move heard with it",
			seen{step: stepLook, phase: tailing, movePending: true, shrunk: true},
			verdict{act: actOpen, reason: Truncated, phase: stale, why: Truncated, movePending: true, untorn: true}},
		{"T13: a change the settled check will look at: Settled(false) before its first line",
			on(seen{step: stepLook, phase: tailing, changed: true, pastTail: true, content: contentSame}),
			verdict{act: actTail, phase: tailing, unsettled: true, sayUnsettled: true}},
		{"T13: told already since the last Open: not again",
			on(seen{step: stepLook, phase: tailing, unsettled: true, changed: true, content: contentSame}),
			verdict{act: actTail, phase: tailing, unsettled: true}},
		{"T14: a resumed tail with bytes past its Start, a torn line only: Settled(false)",
			on(seen{step: stepLook, phase: tailing, resumed: true, pastTail: true, content: contentSame}),
			verdict{act: actTail, phase: tailing, unsettled: true, sayUnsettled: true}},
		{"a resumed tail with nothing past its Start: settled",
			on(seen{step: stepLook, phase: tailing, resumed: true, content: contentSame}),
			verdict{act: actTail, phase: tailing}},
		{"a sink that is no SettleSink is never told",
			seen{step: stepLook, phase: tailing, checks: true, changed: true, content: contentSame},
			verdict{act: actTail, phase: tailing}},
		{"the settled check off: never told",
			seen{step: stepLook, phase: tailing, settleSink: true, changed: true, content: contentSame},
			verdict{act: actTail, phase: tailing}},

		// The sink answered an Open.
		{"empty, or the first line torn: held, the sink not asked",
			seen{step: stepAnswer, phase: unopened, answer: answerNoLead},
			verdict{act: actHold, phase: unopened}},
		{"a title before its header (Wait): held, opened again with the same reason",
			seen{step: stepAnswer, phase: stale, why: Truncated, reason: Truncated, answer: answerWait},
			verdict{act: actHold, phase: stale, why: Truncated}},
		{"Open failed: retried on a backoff timer",
			seen{step: stepAnswer, phase: stale, why: Replaced, reason: Replaced, answer: answerFailed},
			verdict{act: actRetry, phase: stale, why: Replaced}},
		{"Open cut short by the stop",
			seen{step: stepAnswer, phase: unopened, answer: answerCanceled},
			verdict{act: actStop, phase: unopened}},
		{"a Start beyond the file or inside a line: retried on a backoff timer",
			seen{step: stepAnswer, phase: unopened, answer: answerStart, start: startBad},
			verdict{act: actRetry, phase: unopened}},
		{"the line before the Start changed as it was read: Truncated at once",
			seen{step: stepAnswer, phase: tailing, movePending: true, reason: Moved, answer: answerStart, start: startRewritten},
			verdict{act: actAgain, phase: stale, why: Truncated, movePending: true}},
		{"the same for a file never accepted: still news to the sink, as Truncated",
			seen{step: stepAnswer, phase: unopened, answer: answerStart, start: startRewritten},
			verdict{act: actAgain, phase: unopened, why: Truncated}},
		{"a Start that fits: tailing, the pending reason and move cleared",
			seen{step: stepAnswer, phase: stale, why: Truncated, reason: Truncated, movePending: true, answer: answerStart},
			verdict{act: actTail, phase: tailing}},
		{"not a session file: skipped",
			seen{step: stepAnswer, phase: unopened, answer: answerSkip},
			verdict{act: actDone, phase: skipped}},
		{"T13: moved while a settled check was pending: the sink's state at the new path hears it",
			on(seen{step: stepAnswer, phase: tailing, unsettled: true, movePending: true, reason: Moved, answer: answerStart}),
			verdict{act: actTail, phase: tailing, unsettled: true, sayUnsettled: true}},
		{"T13: any other Open starts settled",
			on(seen{step: stepAnswer, phase: stale, why: Truncated, unsettled: true, reason: Truncated, answer: answerStart}),
			verdict{act: actTail, phase: tailing}},
		{"T14: resumed at a Start with bytes past it: Settled(false) before they are read",
			on(seen{step: stepAnswer, phase: unopened, answer: answerStart, resumed: true, pastTail: true}),
			verdict{act: actTail, phase: tailing, unsettled: true, sayUnsettled: true}},
		{"reopened after a change since the last complete run: Settled(false) before it reads",
			on(seen{step: stepAnswer, phase: stale, why: Truncated, reason: Truncated, answer: answerStart, changed: true}),
			verdict{act: actTail, phase: tailing, unsettled: true, sayUnsettled: true}},

		// The read ended.
		{"read to the end: done",
			on(seen{step: stepRead, phase: tailing, delivered: true}),
			verdict{act: actDone, phase: tailing}},
		{"changed since the last complete run: the settled check armed",
			on(seen{step: stepRead, phase: tailing, changed: true, delivered: true}),
			verdict{act: actDone, phase: tailing, arm: true}},
		{"e2b7f79: the first run ended early; the one that completes finds the stat not the Open's: armed",
			on(seen{step: stepRead, phase: tailing, unsettled: true, changed: true}),
			verdict{act: actDone, phase: tailing, unsettled: true, arm: true}},
		{"T14: a resumed tail that found only a torn line past its Start grew: armed, then Rechecked",
			on(seen{step: stepRead, phase: tailing, resumed: true, pastTail: true}),
			verdict{act: actDone, phase: tailing, grew: true, arm: true}},
		{"a resumed tail that delivered lines past its Start grew: armed",
			on(seen{step: stepRead, phase: tailing, resumed: true, delivered: true}),
			verdict{act: actDone, phase: tailing, grew: true, arm: true}},
		{"a resumed tail with nothing new: did not grow",
			on(seen{step: stepRead, phase: tailing, resumed: true, grew: true}),
			verdict{act: actDone, phase: tailing}},
		{"the settled check off: never armed",
			seen{step: stepRead, phase: tailing, settleSink: true, changed: true, resumed: true, delivered: true},
			verdict{act: actDone, phase: tailing, grew: true}},
		{"T13: the settled check found every delivered byte in place, nothing since: Settled(true)",
			on(seen{step: stepRead, phase: tailing, settle: true, unsettled: true}),
			verdict{act: actDone, phase: tailing, saySettled: true}},
		{"T13: lines delivered after the settled check: not settled yet",
			on(seen{step: stepRead, phase: tailing, settle: true, unsettled: true, delivered: true}),
			verdict{act: actDone, phase: tailing, unsettled: true}},
		{"T5: delivered bytes changed under the read: Truncated at once, not after the next event",
			seen{step: stepRead, phase: tailing, read: readRewritten},
			verdict{act: actAgain, phase: stale, why: Truncated}},
		{"T20, T29: the sink found a line not what it mirrored (a long line's digest, a first line's kind): Truncated at once",
			seen{step: stepRead, phase: tailing, read: readSinkReopen},
			verdict{act: actAgain, phase: stale, why: Truncated}},
		{"shrank while read: looked at again, the next run says how",
			seen{step: stepRead, phase: tailing, read: readShort},
			verdict{act: actAgain, phase: tailing}},
		{"the sink refused a line: retried on a backoff timer",
			seen{step: stepRead, phase: tailing, read: readSinkFailed},
			verdict{act: actRetry, phase: tailing}},
		{"an I/O error: retried at the next event or rescan",
			seen{step: stepRead, phase: tailing, read: readFailed},
			verdict{act: actFail, phase: tailing}},
		{"stopping: nothing more, what the read found kept",
			on(seen{step: stepRead, phase: tailing, read: readCanceled, resumed: true, delivered: true}),
			verdict{act: actStop, phase: tailing, grew: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := decide(c.in); got != c.want {
				t.Errorf("decide(%+v)\n got %+v\nwant %+v", c.in, got, c.want)
			}
		})
	}
}

// TestDecideLooksBeforeItReads: whatever a run saw, no line is read past content that was
// not compared with what was delivered, nor past a settled check that was due, and asking
// for a check changes nothing (the run asks again with its result).
func TestDecideLooksBeforeItReads(t *testing.T) {
	bits := []bool{false, true}
	n := 0
	for _, ph := range []phase{unopened, stale, tailing, skipped} {
		for _, mp := range bits {
			for _, reopen := range bits {
				for _, shrunk := range bits {
					for _, settle := range bits {
						for _, resumed := range bits {
							for content := contentUnchecked; content <= contentLastLine; content++ {
								for prefix := prefixUnchecked; prefix <= prefixUnknown; prefix++ {
									in := seen{step: stepLook, phase: ph, movePending: mp, reopen: reopen,
										shrunk: shrunk, settle: settle, resumed: resumed, content: content, prefix: prefix}
									v := decide(in)
									n++
									switch v.act {
									case actCheckContent, actCheckPrefix:
										if v.phase != in.phase || v.why != in.why || v.movePending != in.movePending {
											t.Fatalf("%+v: %v changes the standing: %+v", in, v.act, v)
										}
									case actTail:
										if content != contentSame || (settle && !resumed && (prefix == prefixUnchecked || prefix == prefixDiffers)) || shrunk || reopen {
											t.Fatalf("%+v: reads on unchecked content: %+v", in, v)
										}
									case actOpen:
										if !v.untorn {
											t.Fatalf("%+v: opened with a torn tail reported", in)
										}
									case actDone:
										if v.phase != skipped {
											t.Fatalf("%+v: done without reading: %+v", in, v)
										}
									default:
										t.Fatalf("%+v: %v", in, v.act)
									}
								}
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d cases", n)
}
