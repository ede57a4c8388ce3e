package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// entryRef is what the store keeps of one line of the generation it serves: enough for
// idempotency (digest), parent checks (the id itself) and replies (seq, ordinal).
type entryRef struct {
	seq     uint64
	ordinal int64
	sha     string
	head    string // the head right after the entry, for a retried append's reply
}

// headerMeta is the conversation metadata read from its header line.
type headerMeta struct {
	id, createdAt, cwd, parentSession string
	metadata                          json.RawMessage
}

// conv is the cached state of one conversation, rebuilt from the stream (the truth)
// whenever the stream is ahead of it. Its mutex serializes the appends of one
// conversation within a replica; other replicas are fenced by the expected sequence.
type conv struct {
	mu sync.Mutex
	c  mirror.Conv

	loaded      bool
	gen         int          // the generation served and extended
	writer      string       // mirror.WriterStore or "" (daemon)
	subjSeq     uint64       // newest stream sequence on the subject, any generation
	count       uint64       // messages of the subject read or published, any generation (load)
	refused     bool         // a publish found the subject's last sequence past subjSeq (load)
	genSeq      uint64       // newest stream sequence of gen
	genTime     time.Time    // when the message at genSeq was stored (about)
	lastOrdinal int64        // highest ordinal of gen (-1: none)
	leaf        session.Leaf // Pi's leaf after the last line in file order (ID "" = null)
	ids         map[string]entryRef
	entries     int64 // entry lines of gen, header excluded
	meta        headerMeta
	source      string // Pisync-Source of the header
	headerSHA   string
	headerSeq   uint64
	fork        *forkMark // the header's mark when the conversation is a fork
	headerDup   bool      // a header publish was a duplicate of a message the stream lacks

	kvRev     uint64      // revision of the head we last read or wrote (0: none)
	kvHead    mirror.Head // that head
	kvHasHead bool

	// An append whose head already says the store writes this generation leaves the
	// head's update until after its reply (appendLine): headDirty says the head is behind
	// what this replica published, headWriting that a request is writing it (writeHeads).
	headDirty, headWriting bool
}

// scanned is one message's metadata as load keeps it until the generation is chosen.
type scanned struct {
	mirror.Line
	seq      uint64
	at       time.Time // stored at
	targetID string    // leaf entries
	data     []byte    // header lines only
}

// errNoConv is returned by load for a conversation with no message in the stream.
var errNoConv = errors.New("no such conversation")

// loadOut is what load tells open besides the state it rebuilt.
type loadOut struct {
	// msgs, when load read the conversation from scratch, is every message read, in
	// stream order, bodies included: open serves them without reading the stream again.
	msgs []mirror.Msg
	// counted, when load asked the stream's leader for the conversation's count, is that
	// count: open's next read of the conversation takes it (mirror.ScanOptions.Counted)
	// instead of asking again.
	counted *uint64
}

// load rebuilds c from the stream and the heads bucket: from scratch when c is not loaded,
// else from the newest sequence it has seen. The caller holds c.mu; out may be nil.
//
// On an R3 stream a direct get, or a consumer, may be answered by a replica behind its
// leader (one that has just come back): a state checked against one could miss what the
// leader acknowledged, or take the conversation for deleted. A loaded state is checked
// against the leader's count of the subject instead (mirror.Reader.Count, one request as
// the direct get of the newest sequence was), which c.count, the subject's messages the
// state has read or published (those at or below subjSeq), is compared with: as many, it
// is current; fewer, the conversation was deleted meanwhile (and perhaps created again)
// and is read from scratch, up to the leader's count; more, the rest is read from past
// subjSeq knowing how many lie below it (mirror.ScanOptions.Below), and read again with a
// new count and consumer while the read comes back short: a consumer on a replica that
// is catching up need not deliver, within the scan's wait, what that replica stores
// meanwhile. A conversation deleted and created again with exactly as many messages
// looks current to the count: its first append is refused on its expected sequence
// (c.refused), and the load that follows reads it from scratch.
func (s *Store) load(ctx context.Context, c *conv, out *loadOut) error {
	var counted *uint64
	for c.loaded {
		n, err := s.handles(c.c.Owner).reader.Count(ctx, c.c)
		if err != nil {
			return err
		}
		if out != nil {
			out.counted = &n
		}
		refused := c.refused
		c.refused = false
		switch {
		case n == c.count && !refused:
			return nil
		case n <= c.count: // deleted meanwhile (and perhaps created again)
			c.loaded, counted = false, &n
			continue
		}
		if err := s.readOn(ctx, c, n, out); err != nil || c.count >= n {
			return err
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read conversation %s: %d of the %d messages the stream's leader holds: %w", c.c.Key, c.count, n, err)
		}
	}
	return s.readAll(ctx, c, counted, out)
}

// scanOne is what load keeps of one message it read (and a fork of one it copied).
func scanOne(m mirror.Msg) scanned {
	sc := scanned{Line: m.Line, seq: m.Seq, at: m.Time}
	switch {
	case m.Kind == mirror.KindHeader:
		sc.data = m.Data
	case m.Kind == mirror.KindEntry && m.EntryType == "leaf":
		if env, err := session.ScanEntry(m.Data); err == nil {
			sc.targetID = env.TargetID
		}
	}
	return sc
}

// readAll reads c from scratch and builds its state: the whole subject, up to the
// leader's count (counted, when load has just asked it). With out, out.msgs is set to
// every message read.
func (s *Store) readAll(ctx context.Context, c *conv, counted *uint64, out *loadOut) error {
	var msgs []scanned
	var all []mirror.Msg
	var skipped uint64
	opts := mirror.ScanOptions{Counted: counted, Skipped: &skipped, Expect: func(n int) {
		msgs = make([]scanned, 0, n)
		if out != nil {
			all = make([]mirror.Msg, 0, n)
		}
	}}
	err := s.handles(c.c.Owner).reader.Scan(ctx, c.c, opts, func(m mirror.Msg) error {
		if out != nil {
			all = append(all, m)
		}
		msgs = append(msgs, scanOne(m))
		return nil
	})
	if err != nil {
		return fmt.Errorf("read conversation %s: %w", c.c.Key, err)
	}
	if len(msgs) == 0 {
		return errNoConv
	}
	if err := s.build(ctx, c, msgs); err != nil {
		return err
	}
	c.count += skipped
	if out != nil {
		out.msgs = all
	}
	return nil
}

// readOn reads the messages of the subject past c.subjSeq, of which the stream's leader
// counts n in all, and applies them to c: once, however many it gets (see load).
func (s *Store) readOn(ctx context.Context, c *conv, n uint64, out *loadOut) error {
	var msgs []scanned
	below, skipped := c.count, uint64(0)
	opts := mirror.ScanOptions{FromSeq: c.subjSeq + 1, Below: &below, Counted: &n, Skipped: &skipped,
		Expect: func(n int) { msgs = make([]scanned, 0, n) }}
	err := s.handles(c.c.Owner).reader.Scan(ctx, c.c, opts, func(m mirror.Msg) error {
		msgs = append(msgs, scanOne(m))
		return nil
	})
	if err != nil {
		return fmt.Errorf("read conversation %s: %w", c.c.Key, err)
	}
	c.count += skipped
	for _, m := range msgs {
		c.subjSeq = max(c.subjSeq, m.seq)
		c.count++
		if m.Generation > c.gen && c.writer != mirror.WriterStore || m.Kind == mirror.KindHeader && m.Generation == c.gen && c.headerSeq != 0 {
			// The daemon rewrote the file, a new generation replaces the one we served; or
			// the conversation was deleted and created again.
			c.loaded = false
			return s.load(ctx, c, out)
		}
		if m.Generation == c.gen {
			c.apply(m)
		}
	}
	return nil
}

// build chooses the generation and applies its messages in ordinal order.
func (s *Store) build(ctx context.Context, c *conv, msgs []scanned) error {
	hd, rev, herr := s.handles(c.c.Owner).reader.Head(ctx, c.c)
	c.kvRev, c.kvHead, c.kvHasHead = 0, mirror.Head{}, false
	if herr == nil {
		c.kvRev, c.kvHead, c.kvHasHead = rev, hd, true
	} else if !errors.Is(herr, mirror.ErrNotFound) && !errors.Is(herr, mirror.ErrBadHead) {
		return herr
	} else if errors.Is(herr, mirror.ErrBadHead) {
		if e, err := s.kv.Get(ctx, c.c.HeadKey()); err == nil {
			c.kvRev = e.Revision() // overwrite the undecodable value by compare-and-set
		}
	}
	gen := 0
	for _, m := range msgs {
		gen = max(gen, m.Generation)
	}
	c.writer = ""
	if c.kvHasHead && c.kvHead.Writer == mirror.WriterStore && c.kvHead.Generation > 0 {
		gen, c.writer = c.kvHead.Generation, mirror.WriterStore
	}
	c.gen, c.subjSeq, c.count, c.genSeq, c.lastOrdinal, c.leaf = gen, 0, uint64(len(msgs)), 0, -1, session.Leaf{}
	c.ids, c.entries, c.meta, c.source, c.headerSHA, c.headerSeq = map[string]entryRef{}, 0, headerMeta{}, "", "", 0
	c.fork = nil
	sort.SliceStable(msgs, func(i, j int) bool { return msgs[i].Ordinal < msgs[j].Ordinal })
	for _, m := range msgs {
		c.subjSeq = max(c.subjSeq, m.seq)
		if m.Generation == gen {
			c.apply(m)
		}
	}
	c.loaded = true
	return nil
}

// apply advances c past one message of its generation.
func (c *conv) apply(m scanned) {
	if m.seq >= c.genSeq {
		c.genTime = m.at
	}
	c.genSeq = max(c.genSeq, m.seq)
	if m.Kind == mirror.KindHeader {
		c.headerSHA, c.headerSeq, c.source = m.SHA256, m.seq, m.Source
		c.fork = parseForkMark(m.Fork)
		if hm, err := parseHeaderMeta(m.data); err == nil {
			c.meta = hm
		}
		c.lastOrdinal = max(c.lastOrdinal, m.Ordinal)
		return
	}
	if _, dup := c.ids[m.EntryID]; dup && m.Kind != mirror.KindRaw {
		return // a second copy of a line (the reader drops those too)
	}
	env := m.envelope()
	if m.Kind != mirror.KindRaw {
		after := c.leaf
		after.Apply(env)
		c.ids[m.EntryID] = entryRef{seq: m.seq, ordinal: m.Ordinal, sha: m.SHA256, head: after.ID()}
		c.entries++
	}
	if m.Ordinal <= c.lastOrdinal {
		return // out of order: the head follows the last line in file order
	}
	c.lastOrdinal = m.Ordinal
	c.leaf.Apply(env)
}

// envelope is what Pi's leaf rule reads of m, as the daemon read it from the line:
// nothing of a raw line, nor of a v1 entry, else its type, id and target. An entry
// without an id (v1, or an id-less line of a later format) is stored under its ordinal
// (mirror.OrdinalID), which is no id to the rule.
func (m scanned) envelope() session.Envelope {
	if m.Kind == mirror.KindRaw || m.Format == string(session.FormatV1) {
		return session.Envelope{}
	}
	return session.Envelope{Type: m.EntryType, ID: m.OwnEntryID(), ParentID: m.ParentID, TargetID: m.targetID}
}

// incomplete reports whether c is a fork whose copy has not completed: no reader may see
// it, and only the fork request that made it continues it.
func (c *conv) incomplete() bool { return c.fork != nil && c.entries < c.fork.Entries }

// parseHeaderMeta reads the metadata of a header line.
func parseHeaderMeta(line []byte) (headerMeta, error) {
	h, err := session.ParseHeader(line)
	if err != nil {
		return headerMeta{}, err
	}
	var m map[string]json.RawMessage
	_ = json.Unmarshal(line, &m) // ParseHeader accepted it
	hm := headerMeta{id: h.ID, createdAt: h.Timestamp, cwd: h.Cwd, parentSession: h.ParentSession}
	if raw, ok := m["metadata"]; ok && string(raw) != "null" {
		hm.metadata = raw
	}
	return hm, nil
}

// headValue is the heads-bucket value of c.
func (s *Store) headValue(c *conv) mirror.Head {
	h := c.kvHead
	h.Conversation, h.Key = c.meta.id, c.c.Key
	if h.Conversation == "" {
		h.Conversation = c.c.Key
	}
	h.Tenant, h.Owner = c.c.Owner.Tenant, c.c.Owner.Name
	if h.Host == "" {
		h.Host = s.opts.Host
	}
	if h.Source == "" {
		h.Source = c.source
	}
	h.Cwd, h.Format, h.Generation = c.meta.cwd, string(session.FormatV3), c.gen
	h.Entries, h.LastOrdinal, h.LastSeq, h.Head = c.entries+1, c.lastOrdinal, c.genSeq, c.leaf.ID()
	h.Writer, h.CreatedAt, h.ParentSession, h.Metadata = mirror.WriterStore, c.meta.createdAt, c.meta.parentSession, c.meta.metadata
	h.UpdatedAt = time.Now().UTC()
	return h
}

// saveHead writes c's head by compare-and-set. The head is a cache of the stream: when
// another replica wrote a head at least as far along, that one stays.
func (s *Store) saveHead(ctx context.Context, c *conv) error {
	for attempt := 0; attempt < 5; attempt++ {
		val := mirror.EncodeHead(s.headValue(c))
		var rev uint64
		var err error
		if c.kvRev == 0 {
			rev, err = s.kv.Create(ctx, c.c.HeadKey(), val)
		} else {
			rev, err = s.kv.Update(ctx, c.c.HeadKey(), val, c.kvRev)
		}
		if err == nil {
			c.kvRev, c.kvHasHead = rev, true
			c.kvHead, _ = mirror.DecodeHead(val)
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return fmt.Errorf("put head %s: %w", c.c.Key, err)
		}
		e, gerr := s.kv.Get(ctx, c.c.HeadKey())
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound):
			c.kvRev = 0
			continue
		case gerr != nil:
			return fmt.Errorf("put head %s: %w", c.c.Key, gerr)
		}
		c.kvRev = e.Revision()
		if cur, derr := mirror.DecodeHead(e.Value()); derr == nil {
			c.kvHead = cur
			if cur.Writer == mirror.WriterStore && cur.Generation == c.gen && cur.LastSeq >= c.genSeq {
				return nil
			}
		}
	}
	return fmt.Errorf("put head %s: the revision kept changing", c.c.Key)
}

// writeHeads writes c's head by compare-and-set until it holds everything this replica
// has published, outside c.mu so that the next append publishes meanwhile; appends that
// came in the meantime are written together. The caller set c.headWriting (one request at
// a time writes) and does not hold c.mu. On an error it stops: the head stays behind the
// stream until the next open or append repairs it, as after a replica stopped between its
// publish and its head update.
func (s *Store) writeHeads(ctx context.Context, c *conv) {
	c.mu.Lock()
	defer func() {
		c.headWriting = false
		c.mu.Unlock()
	}()
	for fails := 0; c.headDirty && fails < attempts; {
		if !c.loaded || c.kvRev == 0 || ctx.Err() != nil {
			return
		}
		c.headDirty = false
		val, rev, headerSeq, genSeq := mirror.EncodeHead(s.headValue(c)), c.kvRev, c.headerSeq, c.genSeq
		c.mu.Unlock()
		newRev, err := s.kv.Update(ctx, c.c.HeadKey(), val, rev)
		var cur jetstream.KeyValueEntry
		lost := err != nil && (errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err))
		if lost {
			cur, err = s.kv.Get(ctx, c.c.HeadKey())
		}
		c.mu.Lock()
		if !c.loaded || c.headerSeq != headerSeq {
			return // deleted meanwhile (and perhaps created again): not this head to write
		}
		switch {
		case err != nil:
			s.log.Warn("append: head not updated", zapConv(c), zapErr(err))
			c.headDirty = true
			return
		case !lost:
			fails = 0
			if newRev > c.kvRev {
				c.kvRev, c.kvHasHead = newRev, true
				c.kvHead, _ = mirror.DecodeHead(val)
			}
		default: // another write came first: at least as far along, or written over
			fails++
			if cur.Revision() > c.kvRev {
				c.kvRev = cur.Revision()
			}
			h, derr := mirror.DecodeHead(cur.Value())
			if derr == nil {
				c.kvHead = h
			}
			if derr != nil || h.Writer != mirror.WriterStore || h.Generation != c.gen || h.LastSeq < genSeq {
				c.headDirty = true
			}
		}
	}
}

// repairHead rewrites the head of a store-written conversation when the stream is ahead
// of it (a replica stopped between its publish and its head update).
func (s *Store) repairHead(ctx context.Context, c *conv) {
	if c.writer != mirror.WriterStore || c.headWriting {
		return // not the store's, or being written by the request of an append
	}
	if c.kvHasHead && c.kvHead.Generation == c.gen && c.kvHead.LastSeq >= c.genSeq && c.kvHead.Head == c.leaf.ID() {
		return
	}
	if time.Since(c.genTime) < s.opts.HeadRepairGrace {
		// Most likely the replica that stored it writes the head after its reply: left to
		// it, so that a repair means what it says (a replica stopped before its head).
		return
	}
	if err := s.saveHead(ctx, c); err != nil {
		s.log.Warn("repair head", zapConv(c), zapErr(err))
		return
	}
	s.m.repairs.Inc()
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

func expectSubjectSeq(seq uint64) jetstream.PublishOpt {
	return jetstream.WithExpectLastSequencePerSubject(seq)
}

func purgeSubject(subject string) jetstream.StreamPurgeOpt {
	return jetstream.WithPurgeSubject(subject)
}

func isKeyNotFound(err error) bool { return errors.Is(err, jetstream.ErrKeyNotFound) }
