package publisher

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/logx"
)

// waitResync blocks a file's new lines while its queue is being reconciled, so that a
// retry resends from the first unacknowledged line, in order.
func (p *Publisher) waitResync(ctx context.Context, st *fileState) error {
	st.mu.Lock()
	ch := st.resyncing
	st.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gatePoll is how often a file held at the gate looks again whether its lines in flight
// are resolved (the gate itself is waited on without polling).
const gatePoll = 20 * time.Millisecond

// reconcile waits until none of st's publishes is in flight, asks the mirror which of
// the unresolved lines it holds (a timeout means "possibly stored"), and resends the rest
// with their original message ids, with exponential backoff and jitter between attempts.
func (p *Publisher) reconcile(st *fileState, cause error) {
	defer p.wg.Done()
	// The backoff belongs to the file, not to this reconciliation: a line that fails
	// again as soon as it is resent starts another one, and the pause must keep growing
	// until an acknowledgement resets it.
	st.mu.Lock()
	if st.retry == nil {
		st.retry = newRetryBackoff(p.opts.RetryMax)
	}
	bo := st.retry
	pressured := st.pressured
	st.mu.Unlock()
	// next is the pause before the next attempt, and whether the gate decides it: a
	// file refused for lack of room in the cluster waits with the whole host, and goes
	// as soon as the cluster takes lines again, not after its own grown backoff.
	next := func() (time.Duration, bool) {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.pressured {
			return gatePoll, true
		}
		return bo.next(), false
	}
	failed := logx.Run{Every: 20}
	log := p.log.With(zap.String("path", st.file.Path))
	if pressured {
		// The gate reports the cluster's refusal once for the host, not once per file.
		log.Debug("publish refused for lack of room in the cluster; resent when it has room", zap.Error(cause))
	} else if fenced(cause) {
		log.Info("the conversation holds a line this daemon did not publish; comparing with the mirror", zap.Error(cause))
	} else {
		log.Warn("publish failed; reconciling with the mirror and resending", zap.Error(cause))
	}
	for {
		pause, atGate := next()
		select {
		case <-p.runCtx.Done():
			p.endResync(st)
			return
		case <-time.After(pause):
		case <-p.back.wait():
			// The pause grew while the cluster was unreachable; it is over now. The
			// reconnections of a fleet are spread (natsconn.Backoff) and the questions
			// bounded (maxResyncs): waking now costs the cluster no storm.
			st.mu.Lock()
			bo.reset()
			st.mu.Unlock()
		}
		st.mu.Lock()
		busy := false
		for _, it := range st.queue {
			busy = busy || it.inFlight
		}
		st.mu.Unlock()
		if busy {
			continue
		}
		// Past the gate only once nothing of the file is in flight, so that a probe's
		// turn is not spent on a file that cannot resend yet.
		if atGate {
			if err := p.gate.wait(p.runCtx, p.closing); err != nil {
				p.endResync(st)
				return
			}
		}
		err := p.resendUnheld(st)
		if err == nil {
			if n := failed.End(); n > 0 {
				log.Info("publishing resumed", zap.Int64("failed_attempts", n))
			}
			return
		}
		if n, ok := failed.Hit(); ok {
			log.Warn("still unable to publish", zap.Int64("attempts", n), zap.Error(err))
		}
		// The mirror did not answer: the file's own backoff paces the next question,
		// whether or not the gate is open.
		st.mu.Lock()
		st.pressured = false
		st.mu.Unlock()
	}
}

func (p *Publisher) endResync(st *fileState) {
	st.mu.Lock()
	if st.resyncing != nil {
		close(st.resyncing)
		st.resyncing = nil
	}
	st.mu.Unlock()
}

// maxResyncs is how many files of one daemon ask the mirror at once what it holds of
// their failed lines. After an outage every file with lines in flight reconciles; the
// rest wait their turn, so that the questions of a fleet coming back arrive at the pace
// of its reconnections, not all at once (docs/capacity.md, the restart storm).
const maxResyncs = 4

// resendUnheld is one reconciliation attempt.
func (p *Publisher) resendUnheld(st *fileState) error {
	if !p.connected() {
		// A question asked now would wait out its whole timeout holding a slot: wait for
		// the connection instead (connBack wakes us).
		return nats.ErrConnectionReconnecting
	}
	if err := p.resyncs.Acquire(p.runCtx, 1); err != nil {
		return err // closing
	}
	ctx, cancel := context.WithTimeout(p.runCtx, 10*time.Second)
	defer cancel()
	st.mu.Lock()
	// The lines the file's window covers were compared with the file when it was opened.
	gen, from := st.acked.Generation, max(st.acked.StreamSeq, st.held.after())+1
	st.failed = false
	st.mu.Unlock()
	last, err := p.reader.LastSeq(ctx, st.conv)
	var held map[int64]heldLine
	var newer bool
	if err == nil {
		held, newer, err = p.heldSince(ctx, st.conv, gen, from, last)
	}
	p.resyncs.Release(1)
	if err != nil {
		st.mu.Lock()
		st.failed = true
		st.mu.Unlock()
		return err
	}
	p.gate.answered()
	st.mu.Lock()
	st.fenceSeq = max(st.fenceSeq, last)
	st.ownAck = false // the first line resent is fenced on what the mirror just said
	if newer || foreign(st, held) {
		p.takeOver(st) // unlocks st.mu
		p.endResync(st)
		return nil
	}
	var resend []*item
	for _, it := range st.queue {
		if it.done || it.inFlight {
			continue // an item sent meanwhile is resolved by its own acknowledgement
		}
		if h, ok := held[it.ordinal]; ok && h.holds(it.sha) {
			it.done, it.seq, it.out = true, h.seq, nil
			if it.slot {
				it.slot = false
				p.releaseSlot()
			}
			p.release(it.weight)
			it.weight = 0
			continue
		}
		resend = append(resend, it)
	}
	released, moved := st.advance()
	st.mu.Unlock()
	if moved > 0 {
		p.noteDirty(st)
	}
	p.release(released)
	// The first line resent goes now, fenced; back-filled ones behind it once it is
	// acknowledged, live ones each when the one before it resolves (onewriter.go).
	st.mu.Lock()
	hold := p.backfillHeld(st)
	for k, it := range resend {
		if k > 0 && (st.live(it) || hold) {
			for _, w := range resend[k:] {
				w.waiting = true
			}
			resend = resend[:k]
			break
		}
		it.waiting = false
	}
	st.mu.Unlock()
	// Ends the pause before resending: a resend that fails starts a new reconciliation.
	p.endResync(st)
	for _, it := range resend {
		p.m.retries.WithLabelValues("failure").Inc()
		if err := p.send(p.runCtx, st, it); err != nil {
			return nil
		}
	}
	return nil
}
