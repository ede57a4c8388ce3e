package publisher

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/logx"
	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// pending is one publish waiting for its acknowledgement.
type pending struct {
	st    *fileState
	it    *item
	out   *mirror.Outgoing // the message sent
	ack   *mirror.Pending
	epoch uint64 // the gate's epoch when it was sent
}

// Line turns one complete line into a message and publishes it, unless the mirror
// already holds it. It blocks while the in-flight window is full (backpressure onto the
// watcher, so that the files, not memory, buffer an outage).
func (p *Publisher) Line(ctx context.Context, f watcher.File, l watcher.Line) error {
	st := p.state(f.ID)
	if st == nil || st.skipped || st.file.Path != f.Path {
		// Not the file we opened under this identity (its inode number was reused, or
		// its state was retired when another file replaced it): open it again.
		return fmt.Errorf("%s: line %d of a file not opened under this identity: %w", f.Path, l.Ordinal+1, watcher.ErrReopen)
	}
	if err := p.waitResync(ctx, st); err != nil {
		return err
	}
	st.mu.Lock()
	takenOver := st.takenOver
	st.mu.Unlock()
	if takenOver {
		return fmt.Errorf("%s line %d: another writer extends the generation it was mirrored into: %w", f.Path, l.Ordinal+1, watcher.ErrReopen)
	}
	// While the cluster has no room, the whole host waits here (the files buffer).
	if err := p.gate.wait(ctx, p.closing); err != nil {
		return err
	}
	it := &item{ordinal: l.Ordinal, end: l.Offset + l.Len + 1, length: l.Len, seen: l.Seen}
	if l.Len > p.opts.MaxLineBytes {
		p.m.tooLarge.Inc()
		p.log.Error("line over the maximum line size skipped; recovery fills the gap it leaves",
			zap.String("path", f.Path), zap.Int64("line", l.Ordinal+1), zap.Int64("bytes", l.Len))
		it.done = true // nothing to publish: the frontier moves past it
		return p.enqueueResolved(st, it)
	}

	if err := leadHolds(st, l); err != nil {
		return fmt.Errorf("%s line %d: %w", f.Path, l.Ordinal+1, err)
	}
	data := l.Data
	var sum [sha256.Size]byte
	var prefix []byte // the first bytes of a line too long to hold, for its envelope
	if data == nil {
		var into *[]byte
		if l.Len > p.opts.BlobThreshold {
			// Going the blob way: the message will not keep these bytes, so they are read
			// into a buffer kept for the next such line. Allocating one afresh for each
			// (up to 16 MiB) kept the runtime returning pages to the system.
			into = blobReads.Get().(*[]byte)
			defer blobReads.Put(into)
		}
		var err error
		data, prefix, sum, err = readAgain(l, into)
		if err != nil {
			return fmt.Errorf("%s line %d: %w", f.Path, l.Ordinal+1, err)
		}
	} else {
		sum = sha256.Sum256(data)
	}
	blob := data == nil || l.Len > p.opts.BlobThreshold
	sha := session.HexDigest(sum)
	it.sha = sha

	h, isHeld, err := p.takeHeld(ctx, st, l.Ordinal)
	if err != nil {
		return fmt.Errorf("%s line %d: read what the mirror holds: %w", f.Path, l.Ordinal+1, err)
	}
	p.classify(st, it, data, prefix, f, l)
	if isHeld {
		if h.holds(sha) {
			p.m.heldBack.Inc()
			it.done, it.seq = true, h.seq
			return p.enqueueResolved(st, it)
		}
		// The file changed under what the mirror holds: reopening compares the whole file
		// with the mirror and starts a new generation.
		return fmt.Errorf("%s line %d differs from the mirrored line: %w", f.Path, l.Ordinal+1, watcher.ErrReopen)
	}

	st.mu.Lock()
	if st.storeGen != 0 && st.storeGen == st.acked.Generation {
		// The session store writes the generation this file's lines so far are in: a
		// line appended locally since goes to a new one, which reopening starts.
		st.mu.Unlock()
		return fmt.Errorf("%s line %d: the session store writes generation %d of this conversation: %w", f.Path, l.Ordinal+1, st.acked.Generation, watcher.ErrReopen)
	}
	ml := mirror.Line{
		Kind: it.kind, EntryID: entryID(it, l.Ordinal), ParentID: it.env.ParentID,
		EntryType: entryType(it), Ordinal: l.Ordinal, Generation: st.acked.Generation,
		SHA256: sha, Format: string(st.format), Host: p.opts.Host, Source: st.file.Rel,
	}
	conv := st.conv
	st.mu.Unlock()

	// The exact size (headers built) only for a line near the limit: most lines are far
	// below it, and building their headers twice would cost every line.
	near := int64(len(data)+len(ml.Source)+len(ml.Host))+headerReserve > p.maxPayload()
	if !blob && near && p.msgSize(ml, int64(len(data))) > p.maxPayload() {
		blob = true // the threshold allows it, the server would refuse it once headers count
	}
	var body []byte
	if blob {
		if err := p.putBlob(ctx, f, l, sha, data); err != nil {
			p.m.failures.WithLabelValues("blob").Inc()
			return err
		}
		ml.Kind, ml.BlobSize = mirror.KindBlob, l.Len
	} else {
		body = data // NewOutgoing copies it: the watcher's buffer is valid only during the call
	}
	it.kind = ml.Kind
	it.setOut(p.opts.Names.NewOutgoing(conv, ml, body))
	it.weight = int64(len(body)) + 512
	if err := p.acquire(ctx, it.weight); err != nil {
		return err
	}
	it.slot = true
	st.mu.Lock()
	wait := p.waitsBehind(st, it)
	it.waiting = wait
	st.queue = append(st.queue, it)
	st.seenEnd = max(st.seenEnd, it.end)
	st.mu.Unlock()
	if wait {
		return nil
	}
	return p.send(ctx, st, it)
}

// leadHolds checks a line among the first ones against what Open made of the file's
// beginning (where its header is): a file rewritten between Open's look at its first
// lines and their delivery (a fresh header over a title-first file, say) is opened
// again, so that no line is mirrored under the kind the old content gave its ordinal. A
// header replaced by another is still a header: the next run sees the first line
// changed and reopens the file.
func leadHolds(st *fileState, l watcher.Line) error {
	at := int64(st.headerAt)
	if l.Ordinal > at && (at >= 0 || l.Ordinal >= session.LeadLines) || l.Data == nil {
		return nil
	}
	_, err := session.ParseHeader(l.Data)
	isHeader := err == nil
	switch {
	case l.Ordinal == at && !isHeader:
		return fmt.Errorf("the session header is no longer where the file was opened with it: %w", watcher.ErrReopen)
	case l.Ordinal != at && isHeader:
		return fmt.Errorf("a session header where the file was opened without one: %w", watcher.ErrReopen)
	}
	return nil
}

// classify sets the item's kind and envelope. A line that is not a JSON entry is kept
// byte for byte as raw, reported with its file and line number. A line too large to hold
// in memory (data nil) is classified by its first bytes (prefix), where Pi writes the
// envelope, ahead of the payload.
func (p *Publisher) classify(st *fileState, it *item, data, prefix []byte, f watcher.File, l watcher.Line) {
	switch at := int64(st.headerAt); {
	case l.Ordinal == at:
		it.kind = mirror.KindHeader
		return
	case l.Ordinal < at:
		it.kind = mirror.KindRaw // a record written before the header (a fork's title): kept as it is
		return
	}
	if data == nil {
		if env, ok := session.ScanEnvelopePrefix(prefix); ok {
			it.kind, it.env, it.entry = mirror.KindEntry, env, true
			return
		}
		it.kind = mirror.KindRaw
		p.m.invalid.WithLabelValues("malformed").Inc()
		p.log.Warn("huge line does not start like a JSON entry; mirrored as raw", zap.String("path", f.Path),
			zap.Int64("line", l.Ordinal+1), zap.Int64("bytes", l.Len))
		return
	}
	if session.IsBlank(data) {
		it.kind = mirror.KindRaw
		p.m.invalid.WithLabelValues("blank").Inc()
		return
	}
	env, err := session.ScanEntry(data)
	if err != nil {
		it.kind = mirror.KindRaw
		p.m.invalid.WithLabelValues("malformed").Inc()
		p.log.Warn("line is not a JSON entry; mirrored as raw", zap.String("path", f.Path),
			zap.Int64("line", l.Ordinal+1), zap.Error(err))
		return
	}
	if env.ID != "" && !mirror.ValidEntryID(env.ID) {
		it.kind = mirror.KindRaw
		p.m.invalid.WithLabelValues("malformed").Inc()
		p.log.Warn("entry id cannot be mirrored; line kept as raw", zap.String("path", f.Path), zap.Int64("line", l.Ordinal+1))
		return
	}
	it.kind, it.env, it.entry = mirror.KindEntry, env, true
}

func entryID(it *item, ordinal int64) string {
	switch {
	case it.kind == mirror.KindHeader:
		return mirror.HeaderEntryType
	case it.kind == mirror.KindRaw || it.env.ID == "":
		return mirror.OrdinalID(ordinal)
	}
	return it.env.ID
}

func entryType(it *item) string {
	switch it.kind {
	case mirror.KindHeader:
		return mirror.HeaderEntryType
	case mirror.KindRaw:
		return ""
	}
	return it.env.Type
}

// enqueueResolved appends a line that needs no publish and moves the frontier.
func (p *Publisher) enqueueResolved(st *fileState, it *item) error {
	st.mu.Lock()
	st.queue = append(st.queue, it)
	released, moved := st.advance()
	st.mu.Unlock()
	if moved > 0 {
		p.noteDirty(st)
	}
	p.release(released)
	p.sendNext(st)
	return nil
}

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

// readAgain reads a line handed over without its bytes (longer than the watcher's
// inline limit) from the descriptor the watcher read it with: whole (data) when it fits
// in memory, else hashed in bounded chunks, keeping its first bytes (prefix) for its
// envelope. The bytes must have the digest the watcher took as it read them, else the
// file changed in between and is reopened (ErrReopen): a rewrite in place that moved the
// line, or changed its middle without changing its length, leaves a full-length section
// of other bytes, which would be mirrored as a line no file held under that ordinal.
func readAgain(l watcher.Line, into *[]byte) (data, prefix []byte, sum [sha256.Size]byte, err error) {
	if l.SHA256 == nil {
		return nil, nil, sum, fmt.Errorf("line at offset %d handed over with neither its bytes nor their digest", l.Offset)
	}
	if l.Len <= session.MaxBufferedLine {
		if into != nil {
			data, err = readSectionInto(into, l.Src, l.Offset, l.Len)
		} else {
			data, err = readSection(l.Src, l.Offset, l.Len)
		}
		if err == nil {
			sum = sha256.Sum256(data)
		}
	} else {
		prefix, sum, err = digestSection(l.Src, l.Offset, l.Len)
	}
	if err != nil {
		return nil, nil, sum, err
	}
	if sum != *l.SHA256 {
		return nil, nil, sum, fmt.Errorf("line at offset %d changed since the watcher read it: %w", l.Offset, watcher.ErrReopen)
	}
	return data, prefix, sum, nil
}

// digestSection hashes length bytes at offset of src (the descriptor the watcher read
// the line with) in bounded memory, with their first bytes for the envelope
// (session.DigestSection). A short section means the file changed under the line: the
// watcher reopens it (ErrReopen).
func digestSection(src io.ReaderAt, offset, length int64) (prefix []byte, sum [sha256.Size]byte, err error) {
	prefix, sum, err = session.DigestSection(src, offset, length)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = fmt.Errorf("line %w: %w", err, watcher.ErrReopen)
	}
	return prefix, sum, err
}

// readSection reads n bytes at offset of src (the descriptor the watcher read the line
// with). A short read means the file changed under the line: the watcher reopens it
// (ErrReopen); the bytes are never padded.
func readSection(src io.ReaderAt, offset, n int64) ([]byte, error) {
	var buf []byte
	return readSectionInto(&buf, src, offset, n)
}

// readSectionInto is readSection into *buf, grown if it is too small.
func readSectionInto(buf *[]byte, src io.ReaderAt, offset, n int64) ([]byte, error) {
	if int64(cap(*buf)) < n {
		*buf = make([]byte, n)
	}
	b := (*buf)[:n]
	got, err := src.ReadAt(b, offset)
	if int64(got) < n {
		if err == nil || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("line at offset %d cut short (%d of %d bytes): %w", offset, got, n, watcher.ErrReopen)
		}
		return nil, err
	}
	return b, nil
}

// typeLabel is the type label of a published line: any type Pi does not write today (a
// file can say anything) is counted as "other", so that file content cannot create
// label values without bound.
func typeLabel(it *item) string {
	switch {
	case it.kind == mirror.KindHeader:
		return "session"
	case it.kind == mirror.KindRaw:
		return ""
	case session.IsEntryType(it.env.Type):
		return it.env.Type
	}
	return "other"
}

// blobReads keeps the buffers lines going the blob way are read back into (readAgain).
var blobReads = sync.Pool{New: func() any { return new([]byte) }}
