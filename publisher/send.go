package publisher

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The in-flight window: a slot and a weight for each line sent, the acknowledgements
// that settle it, and the failures that put a file's queue up for a resend.

func (p *Publisher) acquire(ctx context.Context, weight int64) error {
	if err := p.slots.Acquire(ctx, 1); err != nil {
		return err
	}
	if err := p.window.Acquire(ctx, weight); err != nil {
		p.slots.Release(1)
		return err
	}
	p.m.inflight.Inc()
	p.m.inflightB.Add(float64(weight))
	return nil
}

// release frees the window taken by resolved published lines (held lines took none).
func (p *Publisher) release(weight int64) {
	if weight == 0 {
		return
	}
	p.window.Release(weight)
	p.m.inflightB.Sub(float64(weight))
}

func (p *Publisher) releaseSlot() {
	p.slots.Release(1)
	p.m.inflight.Dec()
}

// send publishes it asynchronously and hands its record to the acknowledgement loop.
func (p *Publisher) send(ctx context.Context, st *fileState, it *item) error {
	st.mu.Lock()
	out := it.out
	if out == nil { // acknowledged meanwhile (a reconciliation found it in the mirror)
		st.mu.Unlock()
		return nil
	}
	seq := fence(st, it, !p.opts.Unfenced)
	it.sends++
	st.mu.Unlock()
	epoch := p.gate.current()
	rec, err := p.async.Publish(out.Msg(seq), p.ackReady)
	st.mu.Lock()
	if err != nil {
		st.mu.Unlock()
		if permanentFailure(err) != "" {
			p.refused(ctx, st, it, err)
			return nil
		}
		p.fail(st, err, epoch)
		return nil // the line is queued; reconciliation publishes it
	}
	it.inFlight = true
	st.mu.Unlock()
	select {
	case p.acks <- pending{st: st, it: it, out: out, ack: rec, epoch: epoch}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// collectAcks reads every publish's result in publish order. Results are written into
// their records by the async publisher, which signals ackReady as any of them is set:
// one channel for all, not two per message.
func (p *Publisher) collectAcks() {
	defer p.wg.Done()
	for {
		var pd pending
		select {
		case <-p.runCtx.Done():
			return
		case pd = <-p.acks:
		}
		for !pd.ack.Done() {
			select {
			case <-p.ackReady:
			case <-p.runCtx.Done():
				return
			}
		}
		ack, err, _ := pd.ack.Result()
		p.async.Release(pd.ack)
		p.resolve(pd, &ack, err)
	}
}

func (p *Publisher) resolve(pd pending, ack *jetstream.PubAck, err error) {
	st, it := pd.st, pd.it
	st.mu.Lock()
	it.inFlight = false
	if it.done {
		// Already resolved by a reconciliation that found it in the mirror.
		st.mu.Unlock()
		return
	}
	if err != nil {
		if permanentFailure(err) != "" {
			it.inFlight = true // being dealt with: reconciliation leaves it alone
			st.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.refused(p.runCtx, st, it, err)
			}()
			return
		}
		st.mu.Unlock()
		p.fail(st, err, pd.epoch)
		return
	}
	p.gate.acknowledged(pd.epoch)
	if ack.Duplicate && it.idMayRepeat() {
		st.mu.Unlock()
		repeated, err := p.repeatedID(st, it, ack.Sequence)
		if err != nil {
			p.fail(st, err, pd.epoch)
			return
		}
		if repeated {
			return
		}
		st.mu.Lock()
	}
	if it.out == pd.out && it.sends == 1 {
		// The acknowledgement of the message's only publish, whose record is released:
		// nothing reads the message any more.
		it.out.Release()
	}
	it.done, it.seq, it.out = true, ack.Sequence, nil
	first := !st.ownAck
	st.ownAck = true
	st.retry = nil // publishing works again: the next failure starts a fresh backoff
	p.settle(st, it)
	if first {
		p.sendBackfill(st)
	}
	if ack.Duplicate {
		p.m.duplicates.Inc()
	}
	p.m.published.WithLabelValues(string(it.kind), typeLabel(it)).Inc()
	p.m.publishedB.Add(float64(it.length + 1))
	p.m.latency.Observe(time.Since(it.seen).Seconds())
	p.m.lastAckUnix.SetToCurrentTime()
}

// settle frees what a line just resolved holds and moves the frontier; the caller holds
// st.mu, which settle releases. The window is freed as each line resolves, not when the
// frontier passes it: a line stuck in one file must not hold the bytes of every line
// after it.
func (p *Publisher) settle(st *fileState, it *item) {
	slot := it.slot
	it.slot = false
	released := it.weight
	it.weight = 0
	more, moved := st.advance()
	released += more
	st.mu.Unlock()
	if moved > 0 {
		p.noteDirty(st)
	}
	if slot {
		p.releaseSlot()
	}
	p.release(released)
	p.sendNext(st)
}

// fail marks st for reconciliation and starts it unless it is running. A refusal for
// lack of room in the cluster (sent in epoch) is back-pressure: counted by reason, never
// quarantined, reported, and held at the gate with every other publish of the host. A
// fenced line refused is not a failure: another writer's line is on the subject
// (onewriter.go).
func (p *Publisher) fail(st *fileState, err error, epoch uint64) {
	if !fenced(err) {
		p.m.failures.WithLabelValues(failureReason(err)).Inc()
	}
	reason := clusterPressure(err, p.connected())
	if reason != "" {
		p.m.throttled.WithLabelValues(reason).Inc()
		if hostWide(reason) {
			p.gate.refused(reason, err, epoch)
		}
	}
	st.mu.Lock()
	st.failed = true
	st.pressured = holdsHost(reason)
	start := st.resyncing == nil
	if start {
		st.resyncing = make(chan struct{})
	}
	st.mu.Unlock()
	if start {
		p.wg.Add(1)
		go p.reconcile(st, err)
	}
}

// connected reports whether the connection to NATS is up (a timeout then means a slow
// acknowledgement, not an outage).
func (p *Publisher) connected() bool {
	nc := p.opts.JS.Conn()
	return nc != nil && nc.IsConnected()
}

func failureReason(err error) string {
	switch {
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return "timeout"
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse):
		return "no_responders"
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrConnectionReconnecting):
		return "disconnected"
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return "server"
	}
	return "other"
}
