package mirror

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// AsyncPublisher publishes messages to JetStream over core NATS and tracks their
// acknowledgements itself: each message goes out with its own reply subject under one
// wildcard inbox subscription, and the acknowledgement is matched by the subject's
// token. It keeps the semantics of nats.go's jetstream PublishMsgAsync that the
// publisher relies on (per-message ack timeout, bounded pending with a stall, pending
// publishes failed on reconnect, no responders retried then ErrNoStreamResponse, error
// replies as *jetstream.APIError) at a fraction of its cost: nats.go allocates a future,
// a reply subject, a timer and two channels per message and parses every
// acknowledgement with encoding/json (bench/RESULTS.md). Here a message costs
// no allocation of this type's once its Pending records are reused: one sweeper
// goroutine keeps the deadlines, the acknowledgement is written into the record, and
// waiters share one notification channel.
type AsyncPublisher struct {
	nc         *nats.Conn
	prefix     string // reply subjects: prefix + token
	sub        *nats.Subscription
	status     chan nats.Status
	timeout    time.Duration
	maxPending int
	stallWait  time.Duration
	acked      func(*nats.Msg)
	base       time.Time // deadlines are nanoseconds since base (monotonic)

	mu       sync.Mutex
	pending  map[uint64]*Pending
	head     *Pending   // pending with a deadline, oldest first (one timeout for all: publish order)
	tail     *Pending   //
	retrying []*Pending // answered "no responders", sent again at their retryAt
	free     []*Pending // records to reuse (see Release)
	next     uint64     // the next record's token
	stallCh  chan struct{}
	closed   bool
	stream   string // the last stream name acknowledged: reused, not allocated per ack

	wake chan struct{} // the sweeper has a new earliest deadline
	done chan struct{}
	wg   sync.WaitGroup
}

// AsyncOptions configure an AsyncPublisher; zero values take nats.go's defaults.
type AsyncOptions struct {
	// AckTimeout fails a publish with jetstream.ErrAsyncPublishTimeout when its
	// acknowledgement has not come by then (0: no timeout, as nats.go's default).
	AckTimeout time.Duration
	// MaxPending bounds the publishes awaiting an acknowledgement: a Publish beyond it
	// waits up to StallWait for room, then fails with jetstream.ErrTooManyStalledMsgs.
	MaxPending int           // default 4000
	StallWait  time.Duration // default 200 ms
	// Acked, if set, is called with each message acknowledged, as the acknowledgement
	// arrives (benchmarks timestamp acknowledgements with it), with the publisher's lock
	// held: it must not block nor call the publisher.
	Acked func(*nats.Msg)
}

// As nats.go: a "no responders" answer (the stream has no leader for a moment, an
// election) is retried twice, 250 ms apart, before the publish fails.
const (
	noRespondersRetries = 2
	noRespondersWait    = 250 * time.Millisecond
)

// Pending is one publish awaiting its acknowledgement. Its result is read with Result
// once Done reports it (or the notification channel given to Publish fires).
type Pending struct {
	a     *AsyncPublisher
	token uint64
	reply string
	msg   nats.Msg // what goes on the wire: the caller's message with our reply subject
	orig  *nats.Msg

	notify   chan<- struct{}
	deadline int64 // since a.base; 0: none
	retries  int
	retryAt  int64
	prev     *Pending
	next     *Pending
	linked   bool

	publishing int  // Publish or a retry is handing msg to nats.go (a.mu)
	held       bool // the result is set, delivered when publishing ends (a.mu)
	released   bool // the caller is done with the record (a.mu)
	reusable   bool // resolved by its own reply: no later reply can carry its token (a.mu)

	state atomic.Bool // the result below is set
	ack   jetstream.PubAck
	err   error
}

// Done reports whether the result is set.
func (p *Pending) Done() bool { return p.state.Load() }

// Result is the publish's acknowledgement or error; ok is false while it is pending.
func (p *Pending) Result() (ack jetstream.PubAck, err error, ok bool) {
	if !p.state.Load() {
		return jetstream.PubAck{}, nil, false
	}
	return p.ack, p.err, true
}

// Msg is the message published.
func (p *Pending) Msg() *nats.Msg { return p.orig }

// NewAsyncPublisher subscribes to a fresh inbox of nc (its custom inbox prefix, if
// any, applies) and starts the sweeper. Close stops it.
func NewAsyncPublisher(nc *nats.Conn, opts AsyncOptions) (*AsyncPublisher, error) {
	if opts.MaxPending <= 0 {
		opts.MaxPending = 4000
	}
	if opts.StallWait <= 0 {
		opts.StallWait = 200 * time.Millisecond
	}
	a := &AsyncPublisher{
		nc: nc, prefix: nc.NewInbox() + ".", timeout: opts.AckTimeout, maxPending: opts.MaxPending,
		stallWait: opts.StallWait, acked: opts.Acked, base: time.Now(),
		pending: make(map[uint64]*Pending, opts.MaxPending),
		wake:    make(chan struct{}, 1), done: make(chan struct{}),
	}
	// Before the subscription: a reconnection that comes between the two is seen.
	a.status = nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	sub, err := nc.Subscribe(a.prefix+"*", a.handleReply)
	if err != nil {
		nc.RemoveStatusListener(a.status)
		return nil, fmt.Errorf("subscribe to the acknowledgement inbox: %w", err)
	}
	// Acknowledgements of a back-fill come faster than any single handler call: no
	// limit on the messages buffered for the handler (they are bounded by MaxPending).
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		nc.RemoveStatusListener(a.status)
		return nil, fmt.Errorf("acknowledgement inbox: %w", err)
	}
	a.sub = sub
	a.wg.Add(1)
	go a.sweep()
	return a, nil
}

// ErrPublisherClosed fails the publishes pending when the AsyncPublisher is closed.
var ErrPublisherClosed = fmt.Errorf("async publisher closed: %w", nats.ErrConnectionClosed)

// Close stops the sweeper and the subscription and fails what is pending with
// ErrPublisherClosed. It is idempotent.
func (a *AsyncPublisher) Close() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	a.failAllLocked(ErrPublisherClosed)
	a.mu.Unlock()
	close(a.done)
	a.wg.Wait()
	_ = a.sub.Unsubscribe()
	a.nc.RemoveStatusListener(a.status)
}

// Publish sends m (which must have no reply subject) and returns its record; notify,
// if not nil, receives a value (without blocking: give it a buffer of 1) whenever a
// result of a record published with it is set. m is read until Publish returns, and
// again if a "no responders" answer makes it go again: it must not change while the
// record is pending. Call Release once done with the record.
func (a *AsyncPublisher) Publish(m *nats.Msg, notify chan<- struct{}) (*Pending, error) {
	if m.Reply != "" {
		return nil, jetstream.ErrAsyncPublishReplySubjectSet
	}
	a.mu.Lock()
	if err := a.waitRoomLocked(); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	p := a.takeLocked()
	p.msg = nats.Msg{Subject: m.Subject, Reply: p.reply, Header: m.Header, Data: m.Data}
	p.orig, p.notify = m, notify
	p.publishing = 1
	a.pending[p.token] = p
	a.armLocked(p)
	a.mu.Unlock()

	err := a.nc.PublishMsg(&p.msg)

	a.mu.Lock()
	if err != nil {
		p.publishing--
		if a.pending[p.token] == p {
			a.forgetLocked(p)
		}
		// Not the caller's any more: it never sees the record, nor a result a
		// reconnection may have set meanwhile.
		p.released, p.held = true, false
		a.recycleLocked(p)
		a.mu.Unlock()
		return nil, err
	}
	a.donePublishingLocked(p)
	a.mu.Unlock()
	return p, nil
}

// Release hands the record back for reuse: the caller reads nothing of it any more.
func (a *AsyncPublisher) Release(p *Pending) {
	a.mu.Lock()
	p.released = true
	a.recycleLocked(p)
	a.mu.Unlock()
}

// Pending is the number of publishes awaiting their acknowledgement.
func (a *AsyncPublisher) Pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pending)
}

// waitRoomLocked waits, a.mu held (released while waiting), until fewer than
// maxPending publishes are pending, or fails after stallWait.
func (a *AsyncPublisher) waitRoomLocked() error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if a.closed {
			return ErrPublisherClosed
		}
		if len(a.pending) < a.maxPending {
			return nil
		}
		if a.stallCh == nil {
			a.stallCh = make(chan struct{})
		}
		ch := a.stallCh
		a.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(a.stallWait)
		}
		select {
		case <-ch:
			a.mu.Lock()
		case <-timer.C:
			a.mu.Lock()
			return jetstream.ErrTooManyStalledMsgs
		}
	}
}

// takeLocked returns a record to publish with: a reused one or a new one with a token
// of its own (a token is never shared by two records).
func (a *AsyncPublisher) takeLocked() *Pending {
	if n := len(a.free); n > 0 {
		p := a.free[n-1]
		a.free[n-1] = nil
		a.free = a.free[:n-1]
		p.released, p.reusable, p.held, p.retries, p.err, p.ack = false, false, false, 0, nil, jetstream.PubAck{}
		p.state.Store(false)
		return p
	}
	a.next++
	return &Pending{a: a, token: a.next, reply: a.prefix + strconv.FormatUint(a.next, 36)}
}

// recycleLocked puts p on the free list once nobody uses it: released by the caller,
// not being handed to nats.go, and resolved by its own reply (a record failed by a
// timeout or a reconnection may still get a late reply on its token: it is dropped).
func (a *AsyncPublisher) recycleLocked(p *Pending) {
	if !p.released || p.publishing > 0 || !p.reusable || a.pending[p.token] == p || len(a.free) >= a.maxPending {
		return
	}
	p.reusable = false // on the list once
	p.msg, p.orig, p.notify = nats.Msg{}, nil, nil
	a.free = append(a.free, p)
}

// armLocked gives p its deadline and appends it to the deadline list.
func (a *AsyncPublisher) armLocked(p *Pending) {
	if a.timeout <= 0 {
		return
	}
	p.deadline = a.now() + int64(a.timeout)
	wasEmpty := a.head == nil
	p.prev, p.next, p.linked = a.tail, nil, true
	if a.tail != nil {
		a.tail.next = p
	} else {
		a.head = p
	}
	a.tail = p
	if wasEmpty {
		a.signalWake()
	}
}

func (a *AsyncPublisher) unlinkLocked(p *Pending) {
	if !p.linked {
		return
	}
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		a.head = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	} else {
		a.tail = p.prev
	}
	p.prev, p.next, p.linked = nil, nil, false
}

// forgetLocked takes p out of the pending set and the deadline list.
func (a *AsyncPublisher) forgetLocked(p *Pending) {
	delete(a.pending, p.token)
	a.unlinkLocked(p)
	if a.stallCh != nil && len(a.pending) < a.maxPending {
		close(a.stallCh)
		a.stallCh = nil
	}
}

// resolveLocked sets p's result and notifies its waiter. A reply that overtakes the
// return of the PublishMsg that sent it (the flusher wrote the message, the server
// answered) is delivered when that call returns: the caller may reuse the message once
// it has the acknowledgement (the publisher recycles its header map), and must not
// while nats.go could still be reading it.
func (a *AsyncPublisher) resolveLocked(p *Pending, ack jetstream.PubAck, err error, byReply bool) {
	a.forgetLocked(p)
	p.ack, p.err, p.reusable = ack, err, byReply
	if p.publishing > 0 {
		p.held = true
		return
	}
	a.deliverLocked(p)
}

func (a *AsyncPublisher) deliverLocked(p *Pending) {
	p.held = false
	p.state.Store(true)
	if p.notify != nil {
		select {
		case p.notify <- struct{}{}:
		default:
		}
	}
	a.recycleLocked(p)
}

// donePublishingLocked ends a hand-over of p's message to nats.go.
func (a *AsyncPublisher) donePublishingLocked(p *Pending) {
	p.publishing--
	if p.publishing == 0 && p.held {
		a.deliverLocked(p)
		return
	}
	a.recycleLocked(p)
}

func (a *AsyncPublisher) failAllLocked(err error) {
	for _, p := range a.pending {
		a.resolveLocked(p, jetstream.PubAck{}, err, false)
	}
	clear(a.retrying)
	a.retrying = a.retrying[:0]
}

func (a *AsyncPublisher) now() int64 { return int64(time.Since(a.base)) }

func (a *AsyncPublisher) signalWake() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// handleReply is the subscription's handler: one acknowledgement.
func (a *AsyncPublisher) handleReply(m *nats.Msg) {
	token, ok := parseToken(m.Subject, len(a.prefix))
	if !ok {
		return
	}
	a.mu.Lock()
	p := a.pending[token]
	if p == nil || a.retryingLocked(p) {
		a.mu.Unlock()
		return // timed out, failed by a reconnection, or a stray reply
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		if p.retries < noRespondersRetries {
			p.retries++
			a.unlinkLocked(p)
			p.retryAt = a.now() + int64(noRespondersWait)
			a.retrying = append(a.retrying, p)
			a.signalWake()
			a.mu.Unlock()
			return
		}
		a.resolveLocked(p, jetstream.PubAck{}, jetstream.ErrNoStreamResponse, true)
		a.mu.Unlock()
		return
	}
	ack, err := a.parseAckLocked(m.Data)
	if err == nil && a.acked != nil {
		a.acked(p.orig) // before the result: then the caller may reuse the message
	}
	a.resolveLocked(p, ack, err, true)
	a.mu.Unlock()
}

func (a *AsyncPublisher) retryingLocked(p *Pending) bool {
	for _, r := range a.retrying {
		if r == p {
			return true
		}
	}
	return false
}

// parseToken reads the base-36 token after the prefix of a reply subject.
func parseToken(subject string, prefixLen int) (uint64, bool) {
	if len(subject) <= prefixLen {
		return 0, false
	}
	t, err := strconv.ParseUint(subject[prefixLen:], 36, 64)
	return t, err == nil
}

// parseAckLocked reads an acknowledgement. The success form the server writes,
// {"stream":"S","seq":N} with an optional "domain" before the sequence and
// "duplicate": true after it, is read by hand with no allocation (the stream name is
// the one of the previous acknowledgement); anything else goes through encoding/json
// into the shape nats.go reads, with nats.go's errors.
func (a *AsyncPublisher) parseAckLocked(b []byte) (jetstream.PubAck, error) {
	if ack, ok := a.parseSuccessLocked(b); ok {
		return ack, nil
	}
	var resp struct {
		Error *jetstream.APIError `json:"error,omitempty"`
		*jetstream.PubAck
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return jetstream.PubAck{}, jetstream.ErrInvalidJSAck
	}
	if resp.Error != nil {
		return jetstream.PubAck{}, resp.Error
	}
	if resp.PubAck == nil || resp.Stream == "" {
		return jetstream.PubAck{}, jetstream.ErrInvalidJSAck
	}
	return *resp.PubAck, nil
}

func (a *AsyncPublisher) parseSuccessLocked(b []byte) (jetstream.PubAck, bool) {
	var ack jetstream.PubAck
	rest, ok := cutPrefix(b, `{"stream":"`)
	if !ok {
		return ack, false
	}
	name, rest, ok := quoted(rest)
	if !ok || len(name) == 0 {
		return ack, false
	}
	if string(name) != a.stream {
		a.stream = string(name)
	}
	ack.Stream = a.stream
	if r, ok := cutPrefix(rest, `,"domain":"`); ok {
		var domain []byte
		if domain, rest, ok = quoted(r); !ok {
			return ack, false
		}
		ack.Domain = string(domain) // rare: allocated
	}
	if rest, ok = cutPrefix(rest, `,"seq":`); !ok {
		return ack, false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || n > 20 {
		return ack, false
	}
	seq, err := strconv.ParseUint(string(rest[:n]), 10, 64) // no allocation: the conversion is not kept
	if err != nil {
		return ack, false
	}
	ack.Sequence = seq
	rest = rest[n:]
	if r, ok := cutPrefix(rest, `,"duplicate":`); ok {
		for len(r) > 0 && r[0] == ' ' {
			r = r[1:]
		}
		if rest, ok = cutPrefix(r, "true"); !ok {
			return ack, false
		}
		ack.Duplicate = true
	}
	return ack, string(rest) == "}"
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return b, false
	}
	return b[len(prefix):], true
}

// quoted reads a JSON string without escapes up to its closing quote.
func quoted(b []byte) (s, rest []byte, ok bool) {
	for i, c := range b {
		switch {
		case c == '"':
			return b[:i], b[i+1:], true
		case c == '\\' || c < 0x20:
			return nil, b, false
		}
	}
	return nil, b, false
}

// sweep keeps the deadlines and the retries, and fails what is pending when the
// connection starts reconnecting (its replies are lost with it: nats.go does the same)
// or is closed (nats.go leaves those to their timeout).
func (a *AsyncPublisher) sweep() {
	defer a.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		a.mu.Lock()
		next, any := a.expireLocked()
		a.mu.Unlock()
		if any {
			timer.Reset(time.Duration(next - a.now()))
		} else {
			timer.Stop()
		}
		select {
		case <-a.done:
			return
		case <-a.wake:
		case <-timer.C:
		case s, ok := <-a.status:
			if !ok {
				a.status = nil // removed by Close, which is about to end this loop
				continue
			}
			if s == nats.CLOSED {
				// For good: no reply comes any more, and a publish fails at once. The
				// sweeper's work is over (a publisher never closed ends with its
				// connection).
				a.mu.Lock()
				a.failAllLocked(nats.ErrConnectionClosed)
				a.mu.Unlock()
				return
			}
			a.mu.Lock()
			a.failAllLocked(nats.ErrDisconnected)
			a.mu.Unlock()
		}
	}
}

// expireLocked fails the publishes past their deadline, sends again those whose retry
// is due (a.mu released meanwhile), and returns the next time to look.
func (a *AsyncPublisher) expireLocked() (next int64, any bool) {
	now := a.now()
	for a.head != nil && a.head.deadline <= now {
		a.resolveLocked(a.head, jetstream.PubAck{}, jetstream.ErrAsyncPublishTimeout, false)
	}
	var due []*Pending
	kept := a.retrying[:0]
	for _, p := range a.retrying {
		switch {
		case a.pending[p.token] != p: // failed meanwhile
		case p.retryAt <= now:
			due = append(due, p)
		default:
			kept = append(kept, p)
			if !any || p.retryAt < next {
				next, any = p.retryAt, true
			}
		}
	}
	clear(a.retrying[len(kept):])
	a.retrying = kept
	for _, p := range due {
		p.publishing++
		a.armLocked(p) // nats.go restarts the timeout as it sends again
	}
	if len(due) > 0 {
		a.mu.Unlock()
		for _, p := range due {
			if err := a.nc.PublishMsg(&p.msg); err != nil {
				a.mu.Lock()
				if a.pending[p.token] == p {
					a.resolveLocked(p, jetstream.PubAck{}, err, false)
				}
				a.mu.Unlock()
			}
		}
		a.mu.Lock()
		for _, p := range due {
			a.donePublishingLocked(p)
		}
	}
	if a.head != nil && (!any || a.head.deadline < next) {
		next, any = a.head.deadline, true
	}
	return next, any
}
