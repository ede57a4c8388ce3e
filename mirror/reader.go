package mirror

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotFound is returned for a conversation, head or blob the caller's owner does not
// have. A conversation of another tenant or owner is "not found" as well, never
// "forbidden" (DESIGN §3.7).
var ErrNotFound = errors.New("not found")

// Reader is the read API of the mirror, scoped to one owner. It reads a conversation only
// through the subject-bearing API forms (CONSUMER.CREATE.<stream>.<name>.<filter>,
// DIRECT.GET.<stream>.<subject>) so that NATS permissions can fence owners.
type Reader struct {
	js     jetstream.JetStream
	names  Names
	owner  Owner
	stream jetstream.Stream
	heads  jetstream.KeyValue
	blobs  jetstream.ObjectStore
}

// NewReader binds the mirror's objects; they must have been provisioned.
func NewReader(ctx context.Context, js jetstream.JetStream, n Names, o Owner) (*Reader, error) {
	b, err := Bind(ctx, js, n)
	if err != nil {
		return nil, err
	}
	return b.Reader(o), nil
}

// Owner is the owner this reader is scoped to.
func (r *Reader) Owner() Owner { return r.owner }

// Names are the names this reader uses.
func (r *Reader) Names() Names { return r.names }

// Conv builds a conversation reference under the reader's owner.
func (r *Reader) Conv(key string) (Conv, error) { return NewConv(r.owner, key) }

// LastSeq is the stream sequence of the conversation's newest message, 0 when it has none.
func (r *Reader) LastSeq(ctx context.Context, c Conv) (uint64, error) {
	m, err := r.stream.GetLastMsgForSubject(ctx, r.names.Subject(c))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("last message of %s: %w", c.Key, err)
	}
	return m.Sequence, nil
}

// Counts returns how many messages each conversation of the reader's owner has in the
// stream, by key: the server answers from its index of subjects, without reading a
// message. It is the list of the owner's conversations the commands start from. The
// server lists at most 100,000 subjects per response; the client asks for the next
// pages by offset (TestCountsPages).
func (r *Reader) Counts(ctx context.Context) (map[string]uint64, error) {
	counts, _, err := r.CountsAndLast(ctx)
	return counts, err
}

// CountsAndLast is Counts and the stream's newest sequence, from the same request: what a
// daemon asks once at start instead of one question per conversation. The stream's leader
// answers it (leader.go), so that counts taken right after a replica came back are not
// that replica's.
func (r *Reader) CountsAndLast(ctx context.Context) (map[string]uint64, uint64, error) {
	filter := r.names.OwnerSubjects(r.owner)
	subjects, last, err := r.leaderCounts(ctx, filter)
	if err != nil {
		return nil, 0, fmt.Errorf("count the messages of %s/%s: %w", r.owner.Tenant, r.owner.Name, err)
	}
	prefix := strings.TrimSuffix(filter, ">")
	counts := make(map[string]uint64, len(subjects))
	for subject, n := range subjects {
		if key, err := DecodeToken(strings.TrimPrefix(subject, prefix)); err == nil {
			counts[key] = n
		}
	}
	return counts, last, nil
}

// Count is how many messages conversation c holds, as the stream's leader counts them.
func (r *Reader) Count(ctx context.Context, c Conv) (uint64, error) {
	subject := r.names.Subject(c)
	counts, _, err := r.leaderCounts(ctx, subject)
	if err != nil {
		return 0, fmt.Errorf("count the messages of %s: %w", c.Key, err)
	}
	return counts[subject], nil
}

// scanConsumerIdle is how long the server keeps a scan's consumer after its last use.
const scanConsumerIdle = 5 * time.Second

// ScanOptions select what Scan reads.
type ScanOptions struct {
	FromSeq     uint64 // first stream sequence to read (0 or 1: from the start)
	HeadersOnly bool   // metadata only: what the resume protocol needs
	// Below, when FromSeq > 1, is at most how many of the conversation's messages lie
	// below FromSeq, as the caller knows them (a checkpoint: GenBase + Ordinal). With it
	// Scan knows how many messages past FromSeq the stream's leader may hold and gives a
	// replica that lags a moment (catchUpWait) to deliver them; without it a scan from
	// FromSeq ends with what the replica serving it holds.
	Below *uint64
	// Through is a stream sequence the caller knows holds a message of the conversation
	// (0: none): the scan does not end before it has read it, however long a replica
	// that lags takes to deliver it (it fails when the context ends first).
	Through uint64
	// Counted, if set, is the conversation's count that the stream's leader gave the
	// caller a moment ago (Count): Scan takes it instead of asking again, so that a caller
	// that counts first to decide whether to read at all pays one request for the count.
	Counted *uint64
	// Skipped, if set, is added the number of messages the scan read that are not pisync
	// lines (fn is not called with them): with the lines, what the leader counts.
	Skipped *uint64
	// Expect, if set, is called once before the first message with the number of
	// messages the scan will deliver at most (the consumer's pending count when it was
	// created), so that the caller can size what it collects them in.
	Expect func(n int)
}

// catchUpWait is how long a scan from a sequence waits for messages its leader counts
// but the replica serving its consumer has not delivered: a replica that came back
// catches up in moments, and the count it waits for may be a few messages too high
// (lines stored out of order around the caller's sequence), which costs this wait.
const catchUpWait = 5 * time.Second

// scanBatch is the most messages one pull of Scan asks for: what Scan holds ahead of fn.
const scanBatch = 512

// Scan calls fn for each message of conversation c from opts.FromSeq on, in stream order,
// up to the newest message at the time of the call. Messages that are not pisync lines are
// skipped. It reads through an ordered consumer filtered on the conversation's subject.
//
// The stream's leader first counts the conversation's messages (leader.go), unless
// opts.Counted gives its count: an empty conversation costs that one request and no
// consumer, and a whole-subject read does not end before it has read that many, whichever
// replica serves its consumer (it fails when the context ends first). The consumer's
// creation counts the messages to read, so that a short conversation is read with one
// pull of just its messages, and the consumer is deleted as soon as they are read: a scan
// does not hold one of the stream's consumers (1,000 per stream by default) until its
// pull requests and then its inactivity threshold expire.
func (r *Reader) Scan(ctx context.Context, c Conv, opts ScanOptions, fn func(Msg) error) error {
	var total uint64
	if opts.Counted != nil {
		total = *opts.Counted
	} else {
		n, err := r.Count(ctx, c)
		if err != nil {
			return err
		}
		total = n
	}
	if total == 0 {
		return nil
	}
	want := scanWant{n: total, exact: true}
	if opts.FromSeq > 1 {
		switch {
		case opts.Below == nil:
			want = scanWant{through: opts.Through}
		case total <= *opts.Below:
			return nil // nothing past FromSeq: the leader counts no more than lie below it
		default:
			want = scanWant{n: total - *opts.Below}
		}
	}
	var fnErr error
	err := r.scan(ctx, r.names.Subject(c), opts, want, func(_ string, m Msg) error {
		fnErr = fn(m)
		return fnErr
	})
	if err != nil && err != fnErr {
		return fmt.Errorf("read %s: %w", c.Key, err)
	}
	return err
}

// scanWant is how many messages a scan must deliver before it ends: n exactly (a
// whole-subject read, counted by the leader), at most n (waiting catchUpWait for them), or
// (n 0) what the consumer's replica holds, and at least through the sequence through.
type scanWant struct {
	n       uint64
	exact   bool
	through uint64
}

// waits reports whether the scan waits a moment for messages its replica may not hold yet.
func (w scanWant) waits() bool { return !w.exact && w.n != 0 }

// LineAt returns the metadata of the message at stream sequence seq of conversation c,
// a sequence the caller knows was stored (a duplicate acknowledgement names it): it waits
// for a replica behind its leader to deliver it, until ctx ends (ErrNotFound when c holds
// a later message but none there). It reads through a consumer filtered on c's subject,
// as Scan does, so that permissions fencing owners allow it.
func (r *Reader) LineAt(ctx context.Context, c Conv, seq uint64) (Line, error) {
	var found *Msg
	errFound := errors.New("found")
	err := r.Scan(ctx, c, ScanOptions{FromSeq: seq, HeadersOnly: true, Through: seq}, func(m Msg) error {
		found = &m
		return errFound
	})
	if err != nil && !errors.Is(err, errFound) {
		return Line{}, err
	}
	if found == nil || found.Seq != seq {
		return Line{}, fmt.Errorf("conversation %s sequence %d: %w", c.Key, seq, ErrNotFound)
	}
	return found.Line, nil
}

// ScanOwner calls fn for each message of every conversation of the reader's owner from
// opts.FromSeq on, in stream order, up to the newest message at the time of the call,
// with the key of its conversation. Messages that are not pisync lines are skipped.
//
// It reads through one ordered consumer on the owner's wildcard subject. To read most of
// an owner's conversations this is the cheap way: the server makes one pass over the
// stream, where a consumer per conversation has it pick each conversation's messages out
// from among everyone's, and it sets up one consumer instead of one per conversation.
func (r *Reader) ScanOwner(ctx context.Context, opts ScanOptions, fn func(key string, m Msg) error) error {
	prefix := strings.TrimSuffix(r.names.OwnerSubjects(r.owner), ">")
	keys := map[string]string{} // subject → decoded key: subjects repeat, line after line
	var fnErr error
	want := scanWant{}
	if opts.FromSeq <= 1 {
		counts, _, err := r.leaderCounts(ctx, r.names.OwnerSubjects(r.owner))
		if err != nil {
			return fmt.Errorf("count the messages of %s/%s: %w", r.owner.Tenant, r.owner.Name, err)
		}
		for _, n := range counts {
			want.n += n
		}
		if want.n == 0 {
			return nil
		}
		want.exact = true
	}
	err := r.scan(ctx, r.names.OwnerSubjects(r.owner), opts, want, func(subject string, m Msg) error {
		key, ok := keys[subject]
		if !ok {
			k, err := DecodeToken(strings.TrimPrefix(subject, prefix))
			if err != nil {
				return nil // not a conversation subject pisync writes
			}
			key = k
			keys[subject] = key
		}
		fnErr = fn(key, m)
		return fnErr
	})
	if err != nil && err != fnErr {
		return fmt.Errorf("read the conversations of %s/%s: %w", r.owner.Tenant, r.owner.Name, err)
	}
	return err
}

// scan reads the messages of filter through an ordered consumer, from opts.FromSeq on,
// until it has delivered what want asks (see scanWant), calling fn with each pisync line.
func (r *Reader) scan(ctx context.Context, filter string, opts ScanOptions, want scanWant, fn func(subject string, m Msg) error) error {
	cons, err := r.js.OrderedConsumer(ctx, r.names.Stream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    max(opts.FromSeq, 1),
		HeadersOnly:    opts.HeadersOnly,
		// A scan is over in moments; its consumer must not linger and count against
		// the stream's consumer limit should the delete below not reach the server.
		InactiveThreshold: scanConsumerIdle,
	})
	if err != nil {
		return fmt.Errorf("create consumer: %w", err)
	}
	defer r.deleteConsumer(cons)
	left := uint64(scanBatch)
	if info := cons.CachedInfo(); info != nil {
		left = info.NumPending // from opts.FromSeq on, on the consumer's replica
	}
	if left == 0 && want.n == 0 && want.through < max(opts.FromSeq, 1) {
		return nil
	}
	if opts.Expect != nil {
		opts.Expect(int(min(max(left, want.n), 1<<20)))
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(int(min(max(left, want.n, 1), scanBatch))))
	if err != nil {
		return err
	}
	defer it.Stop()
	var read uint64
	for {
		if want.n != 0 && read >= want.n {
			return nil
		}
		m, err := r.next(ctx, it, want, read)
		if err != nil || m == nil {
			return err
		}
		read++
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("metadata: %w", err)
		}
		if msg, ok := toMsg(m, meta, opts.HeadersOnly); ok {
			if err := fn(m.Subject(), msg); err != nil {
				return err
			}
		} else if opts.Skipped != nil {
			*opts.Skipped++
		}
		if want.n == 0 && meta.NumPending == 0 && meta.Sequence.Stream >= want.through {
			return nil
		}
	}
}

// toMsg is the pisync line a stream message carries; false for a message that is not one.
func toMsg(m jetstream.Msg, meta *jetstream.MsgMetadata, headersOnly bool) (Msg, bool) {
	l, err := ParseLine(m.Headers())
	if err != nil {
		return Msg{}, false
	}
	msg := Msg{Line: l, MsgID: m.Headers().Get(HdrMsgID), Seq: meta.Sequence.Stream, Time: meta.Timestamp}
	switch {
	case l.Kind == KindBlob:
		msg.Size = l.BlobSize
	case headersOnly:
		msg.Size, _ = strconv.ParseInt(m.Headers().Get(nats.MsgSize), 10, 64)
	default:
		msg.Data = m.Data()
		msg.Size = int64(len(msg.Data))
	}
	return msg, true
}

// next returns the scan's next message; nil when a scan that waits at most catchUpWait
// for the rest of its count has waited that long.
func (r *Reader) next(ctx context.Context, it jetstream.MessagesContext, want scanWant, read uint64) (jetstream.Msg, error) {
	if !want.waits() {
		m, err := it.Next(jetstream.NextContext(ctx))
		switch {
		case err == nil || ctx.Err() == nil:
		case want.exact:
			err = fmt.Errorf("read %d of the %d messages the stream's leader holds: %w", read, want.n, err)
		case want.through != 0:
			err = fmt.Errorf("sequence %d not delivered: %w", want.through, err)
		}
		return m, err
	}
	wctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	m, err := it.Next(jetstream.NextContext(wctx))
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return nil, nil
	}
	return m, err
}

// deleteConsumer asks the server to delete a scan's consumer, without waiting for the
// answer: the inactivity threshold removes it anyway should the request be lost (or not
// be allowed).
func (r *Reader) deleteConsumer(cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	_ = r.js.Conn().Publish(apiPrefix(r.js.Options())+"CONSUMER.DELETE."+r.names.Stream()+"."+info.Name, nil)
}

// apiPrefix is the JetStream API prefix the client uses (as nats.go derives it).
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// Generation holds the messages of one generation of a conversation in ordinal order.
type Generation struct {
	Number      int
	Generations []int // every generation present, ascending
	Msgs        []Msg
	Duplicates  int // messages dropped because their ordinal was already present
}

// ReadGeneration reads generation gen of conversation c (0: the newest), ordered by
// ordinal. A second message with an ordinal already seen is dropped and counted.
func (r *Reader) ReadGeneration(ctx context.Context, c Conv, gen int) (Generation, error) {
	present := map[int]bool{}
	var msgs []Msg
	expect := func(n int) { msgs = make([]Msg, 0, n) }
	err := r.Scan(ctx, c, ScanOptions{Expect: expect}, func(m Msg) error {
		present[m.Generation] = true
		if gen == 0 || m.Generation == gen {
			msgs = append(msgs, m)
		}
		return nil
	})
	if err != nil {
		return Generation{}, err
	}
	if len(present) == 0 {
		return Generation{}, fmt.Errorf("conversation %s: %w", c.Key, ErrNotFound)
	}
	g := Generation{Number: gen}
	for n := range present {
		g.Generations = append(g.Generations, n)
		if gen == 0 && n > g.Number {
			g.Number = n
		}
	}
	sort.Ints(g.Generations)
	if !present[g.Number] {
		return Generation{}, fmt.Errorf("conversation %s generation %d: %w", c.Key, g.Number, ErrNotFound)
	}
	if gen == 0 {
		kept := msgs[:0]
		for _, m := range msgs {
			if m.Generation == g.Number {
				kept = append(kept, m)
			}
		}
		msgs = kept
	}
	g.Msgs, g.Duplicates = OrderByOrdinal(msgs)
	return g, nil
}

// OrderByOrdinal orders the messages of one generation by ordinal, in place, and drops
// a second message with an ordinal already seen (returning how many). Messages come in
// stream order, which is ordinal order but for retried publishes: the sort is skipped
// when they are in order already.
func OrderByOrdinal(msgs []Msg) ([]Msg, int) {
	byOrdinal := func(a, b Msg) int { return cmp.Compare(a.Ordinal, b.Ordinal) }
	if !slices.IsSortedFunc(msgs, byOrdinal) {
		slices.SortStableFunc(msgs, byOrdinal)
	}
	out, dups := msgs[:0], 0
	for i, m := range msgs {
		if i > 0 && m.Ordinal == msgs[i-1].Ordinal {
			dups++
			continue
		}
		out = append(out, m)
	}
	return out, dups
}

// ErrBadHead is wrapped when a conversation's value in the heads bucket does not decode:
// readers treat the conversation as one without a head, and say so.
var ErrBadHead = errors.New("undecodable head")

// Head returns the head of one conversation and its revision. A value that does not
// decode fails with an error wrapping ErrBadHead.
func (r *Reader) Head(ctx context.Context, c Conv) (Head, uint64, error) {
	e, err := r.heads.Get(ctx, c.HeadKey())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Head{}, 0, fmt.Errorf("conversation %s: %w", c.Key, ErrNotFound)
	}
	if err != nil {
		return Head{}, 0, fmt.Errorf("head of %s: %w", c.Key, err)
	}
	h, err := DecodeHead(e.Value())
	if err != nil {
		return Head{}, 0, fmt.Errorf("head of %s (key %s): %w: %v", c.Key, e.Key(), ErrBadHead, err)
	}
	return h, e.Revision(), nil
}

// HeadList is what the heads bucket holds for an owner: the heads that decode, ordered
// by key, and the keys whose value does not.
type HeadList struct {
	Heads []Head
	Bad   []BadHead
}

// BadHead is a value of the heads bucket that does not decode.
type BadHead struct {
	Key          string // the bucket key
	Conversation string // the conversation key it belongs to ("" if the key does not decode either)
	Err          error  // wraps ErrBadHead
}

// Warning is the one line a command prints about b.
func (b BadHead) Warning() string {
	return fmt.Sprintf("head %s: %v; skipped (the conversation is still listed from the stream)", b.Key, b.Err)
}

// ListHeads lists the heads of every conversation of the reader's owner, ordered by key.
// A value that does not decode is skipped and returned in Bad, so that one bad value
// hides nothing else. It reads the heads with one watch of the owner's keys rather than
// listing the keys and getting each (a round trip per conversation).
//
// The watch's end-of-values marker is not proof that every key was delivered: while heads
// are written, the server's count of what is pending can reach 0 before a key rewritten
// during the watch is delivered again (TestListHeadsWhileHeadsAreWritten; the per-message
// pending is not monotonic under writes, nats-server issue 4824). So the keys
// the bucket holds are listed too, from the heads stream's subjects, and a key the watch
// missed is read by itself: none with a quiet bucket, the few being written otherwise.
func (r *Reader) ListHeads(ctx context.Context) (HeadList, error) {
	prefix := r.owner.KeyPrefix()
	w, err := r.heads.WatchFiltered(ctx, []string{prefix + "*"})
	if err != nil {
		return HeadList{}, fmt.Errorf("list heads: %w", err)
	}
	defer w.Stop() //nolint:errcheck // the watch is over either way
	// Each key's last operation, deletes included: a key seen is a key settled.
	last := map[string]jetstream.KeyValueEntry{}
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return HeadList{}, fmt.Errorf("list heads: %w", ctx.Err())
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return HeadList{}, errors.New("list heads: the watch ended early")
			case e == nil:
				done = true
			case strings.HasPrefix(e.Key(), prefix):
				last[e.Key()] = e
			}
		}
	}
	if err := r.headsMissed(ctx, prefix, last); err != nil {
		return HeadList{}, err
	}
	keys := make([]string, 0, len(last))
	for k, e := range last {
		if e.Operation() == jetstream.KeyValuePut {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var list HeadList
	list.Heads = make([]Head, 0, len(keys))
	for _, k := range keys {
		h, err := DecodeHead(last[k].Value())
		if err != nil {
			conv, _ := DecodeToken(strings.TrimPrefix(k, prefix))
			list.Bad = append(list.Bad, BadHead{Key: k, Conversation: conv, Err: fmt.Errorf("%w: %v", ErrBadHead, err)})
			continue
		}
		list.Heads = append(list.Heads, h)
	}
	return list, nil
}

// headsMissed adds to seen the keys under prefix that the heads bucket holds but the
// watch did not deliver, each read by itself.
func (r *Reader) headsMissed(ctx context.Context, prefix string, seen map[string]jetstream.KeyValueEntry) error {
	subjectPrefix := r.names.HeadsSubjectPrefix()
	subjects, _, err := leaderCounts(ctx, r.js, r.names.HeadsStream(), subjectPrefix+prefix+"*")
	if err != nil {
		return fmt.Errorf("list heads: %w", err)
	}
	for subject := range subjects {
		key := strings.TrimPrefix(subject, subjectPrefix)
		if _, ok := seen[key]; ok {
			continue
		}
		e, err := r.heads.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted): // deleted since
		case err != nil:
			return fmt.Errorf("list heads: %s: %w", key, err)
		default:
			seen[key] = e
		}
	}
	return nil
}

// Heads lists the heads of every conversation of the reader's owner, ordered by key, and
// fails if any value does not decode (ListHeads skips and reports those).
func (r *Reader) Heads(ctx context.Context) ([]Head, error) {
	list, err := r.ListHeads(ctx)
	if err != nil {
		return nil, err
	}
	if len(list.Bad) > 0 {
		return nil, fmt.Errorf("head %s: %w", list.Bad[0].Key, list.Bad[0].Err)
	}
	return list.Heads, nil
}
