package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// PartSize is the largest decoded part of an upload, and of a part read by open.
const PartSize = 512 << 10

// attempts bounds how often one request re-reads the stream after losing a race.
const attempts = 5

var shaPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Append adds one entry line (its exact bytes) to conversation id of owner o, after the
// caller's leaf expected ("" for null), in DESIGN §8's order: owner → idempotency →
// expected head → publish with the expected subject sequence → head. The head is written
// when it returns.
func (s *Store) Append(ctx context.Context, o mirror.Owner, id, expected string, line []byte) (AppendReply, *Error) {
	return s.appendLine(ctx, o, id, expected, line, nil)
}

// appendLine is Append. When later is not nil and the head already says the store
// writes this generation, the head's compare-and-set is left to *later, which the service
// calls once the reply is sent: an append's reply then waits for one JetStream round trip
// (the publish), not two, and the next append on the conversation publishes while the
// head is written (writeHeads). What the deferred update changes is how far the head is,
// never who writes the conversation: the first append through the store writes the head
// before its reply, since the daemon reads from it who writes (DESIGN §8 "One writer at
// a time"). Readers of the heads bucket may see the head behind the stream for that
// moment, as after a replica stopped between its publish and its head update: the stream
// is the truth, and an open or append on another replica works from it.
func (s *Store) appendLine(ctx context.Context, o mirror.Owner, id, expected string, line []byte, later *func()) (AppendReply, *Error) {
	c, err := mirror.NewConv(o, id)
	if err != nil {
		return AppendReply{}, errorf(CodeNotFound, "conversation %q not found", id)
	}
	if int64(len(line)) > s.opts.MaxEntryBytes {
		return AppendReply{}, tooLarge(ReasonEntry, "entry bytes", int64(len(line)), s.opts.MaxEntryBytes)
	}
	env, err := session.ScanEntry(line)
	if err == nil {
		err = stringified(line)
	}
	if err != nil {
		return AppendReply{}, errorf(CodeInvalid, "line is not one JSON entry: %v", err)
	}
	if e := checkEnvelope(env); e != nil {
		return AppendReply{}, e
	}
	sum := session.Digest(line)
	st := s.conv(c)
	defer st.mu.Unlock()
	// The cached state is trusted only to go ahead: a publish on a stale state fails on
	// its expected sequence. Any other answer is given from a fresh read of the stream.
	fresh, dupSeen := false, false
	for attempt := 0; attempt < attempts; attempt++ {
		if !st.loaded || !fresh && attempt > 0 {
			if e := s.refresh(ctx, st, id); e != nil {
				return AppendReply{}, e
			}
			fresh = true
		}
		rep, e := st.check(env, sum, expected)
		if (rep != nil || e != nil) && !fresh {
			if e := s.refresh(ctx, st, id); e != nil {
				return AppendReply{}, e
			}
			fresh = true
			rep, e = st.check(env, sum, expected)
		}
		if rep != nil || e != nil {
			if e != nil && e.Code == CodeConflict {
				s.m.conflicts.WithLabelValues(e.Reason).Inc()
			}
			return derefReply(rep), e
		}
		l := mirror.Line{Kind: mirror.KindEntry, EntryID: env.ID, ParentID: env.ParentID, EntryType: env.Type,
			Ordinal: st.lastOrdinal + 1, Generation: st.gen, SHA256: sum, Format: string(session.FormatV3),
			Host: s.opts.Host, Source: st.source}
		ack, err := s.publish(ctx, c, l, line, st.subjSeq, dupSeen)
		if err != nil {
			if errors.Is(err, errBlob) {
				return AppendReply{}, errorf(CodeUnavailable, "%v", err)
			}
			// Lost a race (wrong sequence), or possibly stored (timeout, disconnect):
			// the stream says which on the next pass.
			s.log.Debug("append: publish", zapConv(st), zapErr(err))
			st.refused = st.refused || isWrongSequence(err)
			fresh = false
			continue
		}
		if ack.Duplicate {
			// Stored before, within the duplicate window: read it back. If the stream
			// does not hold it (its conversation was deleted), the next publish goes
			// without the message id.
			fresh, dupSeen = false, true
			continue
		}
		storeHead := st.kvHasHead && st.kvRev != 0 && st.kvHead.Writer == mirror.WriterStore && st.kvHead.Generation == st.gen
		st.subjSeq = ack.Sequence
		st.count++
		st.apply(scanned{Line: l, seq: ack.Sequence, at: time.Now(), targetID: env.TargetID})
		st.writer = mirror.WriterStore
		done := AppendReply{OK: true, Seq: ack.Sequence, Ordinal: l.Ordinal, Head: headPtr(st.leaf.ID())}
		if later != nil && storeHead {
			st.headDirty = true
			if !st.headWriting { // else the request writing the head writes this append's too
				st.headWriting = true
				*later = func() { s.writeHeads(ctx, st) }
			}
			return done, nil
		}
		if err := s.saveHead(ctx, st); err != nil {
			// The entry is stored; the next open or append repairs the head from the stream.
			s.log.Warn("append: head not updated", zapConv(st), zapErr(err))
		}
		return done, nil
	}
	return AppendReply{}, errorf(CodeUnavailable, "conversation %s kept changing, or JetStream did not answer; retry", id)
}

// refresh brings st up to the stream.
func (s *Store) refresh(ctx context.Context, st *conv, id string) *Error {
	return s.refreshRead(ctx, st, id, nil)
}

// refreshRead is refresh that tells what load read and counted in out (see loadOut).
func (s *Store) refreshRead(ctx context.Context, st *conv, id string, out *loadOut) *Error {
	if err := s.load(ctx, st, out); errors.Is(err, errNoConv) {
		return errorf(CodeNotFound, "conversation %q not found", id)
	} else if err != nil {
		return errorf(CodeUnavailable, "%v", err)
	}
	return nil
}

// check decides an append on st without writing: a reply (the entry is there already),
// an error, or neither (go ahead).
func (st *conv) check(env session.Envelope, sum, expected string) (*AppendReply, *Error) {
	if st.incomplete() {
		return nil, errorf(CodeNotFound, "conversation %q not found", st.c.Key)
	}
	if ref, ok := st.ids[env.ID]; ok {
		if ref.sha == sum {
			return &AppendReply{OK: true, Seq: ref.seq, Ordinal: ref.ordinal, Head: headPtr(ref.head), Duplicate: true}, nil
		}
		return nil, conflict(ReasonEntryExists, st.leaf.ID(), "entry %s is already in the conversation with other bytes", env.ID)
	}
	if st.leaf.ID() != expected {
		return nil, conflict(ReasonHead, st.leaf.ID(), "expected head %s, the head is %s", show(expected), show(st.leaf.ID()))
	}
	if _, ok := st.ids[env.ParentID]; env.ParentID != "" && !ok {
		return nil, errorf(CodeInvalid, "parent %s of entry %s is not in the conversation", env.ParentID, env.ID)
	}
	if _, ok := st.ids[env.TargetID]; env.Type == "leaf" && env.TargetID != "" && !ok {
		return nil, errorf(CodeInvalid, "target %s of leaf %s is not in the conversation", env.TargetID, env.ID)
	}
	return nil, nil
}

func derefReply(r *AppendReply) AppendReply {
	if r == nil {
		return AppendReply{}
	}
	return *r
}

// checkEnvelope applies Pi's checks of an entry line (parseEntryLine) and pisync's id rules.
func checkEnvelope(env session.Envelope) *Error {
	switch {
	case env.Type == "" || env.Type == "session":
		return errorf(CodeInvalid, "entry type %q", env.Type)
	case env.ID == "" || !mirror.ValidEntryID(env.ID) || env.ID == mirror.HeaderEntryType:
		return errorf(CodeInvalid, "entry id %q", env.ID)
	case env.Timestamp == "":
		return errorf(CodeInvalid, "entry %s has no timestamp", env.ID)
	}
	return nil
}

var errBlob = errors.New("blob")

// publish stores one line under §2, as a blob when it is above the threshold, with the
// subject's expected last sequence.
//
// withoutMsgID leaves out the Nats-Msg-Id header: after a delete, an id of the deleted
// conversation stays in the duplicate window (2 minutes by default) and the server would
// drop the new message as a duplicate of the purged one. The expected subject sequence
// alone keeps a store publish exactly once (a retry on a stale sequence is refused).
func (s *Store) publish(ctx context.Context, c mirror.Conv, l mirror.Line, line []byte, expectSeq uint64, withoutMsgID bool) (*jetstream.PubAck, error) {
	m := s.names.NewMsg(c, l, line)
	// Above the threshold, or too large for one message of this server with its headers
	// (a max_payload below the threshold), the line goes to the object store.
	if int64(len(line)) > s.opts.BlobThreshold || int64(len(line)+headerBytes(m.Header)) > s.opts.MaxPayload {
		uploaded, err := s.handles(c.Owner).writer.PutBlob(ctx, l.SHA256, bytes.NewReader(line))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errBlob, err)
		}
		if uploaded {
			s.m.blobs.Inc()
		}
		l.Kind, l.BlobSize = mirror.KindBlob, int64(len(line))
		m = s.names.NewMsg(c, l, nil)
	}
	if withoutMsgID {
		m.Header.Del(mirror.HdrMsgID)
	}
	return s.js.PublishMsg(ctx, m, expectSubjectSeq(expectSeq))
}

// headerBytes is about what h takes in a message (NATS/1.0 line, "key: value" lines),
// with room for the expected-sequence header the publish adds.
func headerBytes(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n") + len(jetstream.ExpectedLastSubjSeqHeader) + 24
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

func show(head string) string {
	if head == "" {
		return "null"
	}
	return strconv.Quote(head)
}

// exists answers not_found for a conversation the owner does not have.
func (s *Store) exists(ctx context.Context, o mirror.Owner, id string) *Error {
	c, err := mirror.NewConv(o, id)
	if err != nil {
		return errorf(CodeNotFound, "conversation %q not found", id)
	}
	st := s.conv(c)
	defer st.mu.Unlock()
	if err := s.load(ctx, st, nil); errors.Is(err, errNoConv) || err == nil && st.incomplete() {
		return errorf(CodeNotFound, "conversation %q not found", id)
	} else if err != nil {
		return errorf(CodeUnavailable, "%v", err)
	}
	return nil
}
