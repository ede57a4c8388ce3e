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

	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/session"
)

// entryRef is what the store keeps of one line of the generation it serves: enough for
// idempotency (digest), parent checks (the id itself) and replies (seq, ordinal).
type entryRef struct {
	seq     uint64
	ordinal int64
	sha     string
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
	gen         int    // the generation served and extended
	writer      string // mirror.WriterStore or "" (daemon)
	subjSeq     uint64 // newest stream sequence on the subject, any generation
	genSeq      uint64 // newest stream sequence of gen
	lastOrdinal int64  // highest ordinal of gen (-1: none)
	head        string // Pi's leaf after the last line ("" = null)
	ids         map[string]entryRef
	entries     int64 // entry lines of gen, header excluded
	meta        headerMeta
	source      string // Pisync-Source of the header
	headerSHA   string
	headerSeq   uint64

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
	targetID string // leaf entries
	data     []byte // header lines only
}

// errNoConv is returned by load for a conversation with no message in the stream.
var errNoConv = errors.New("no such conversation")

// load rebuilds c from the stream and the heads bucket: from scratch when c is not loaded,
// else from the newest sequence it has seen. The caller holds c.mu. When it reads from
// scratch and read is not nil, *read is set to every message read, in stream order,
// bodies included: open serves them without reading the stream again.
func (s *Store) load(ctx context.Context, c *conv, read *[]mirror.Msg) error {
	h := s.handles(c.c.Owner)
	from := uint64(0)
	if c.loaded {
		last, err := h.reader.LastSeq(ctx, c.c)
		if err != nil {
			return err
		}
		if last == c.subjSeq {
			return nil
		}
		if last < c.subjSeq { // deleted meanwhile (and perhaps created again)
			c.loaded = false
			return s.load(ctx, c, read)
		}
		from = c.subjSeq + 1
	}
	var msgs []scanned
	var all []mirror.Msg
	keep := read != nil && from == 0
	expect := func(n int) {
		msgs = make([]scanned, 0, n)
		if keep {
			all = make([]mirror.Msg, 0, n)
		}
	}
	err := h.reader.Scan(ctx, c.c, mirror.ScanOptions{FromSeq: from, Expect: expect}, func(m mirror.Msg) error {
		if keep {
			all = append(all, m)
		}
		sc := scanned{Line: m.Line, seq: m.Seq}
		switch {
		case m.Kind == mirror.KindHeader:
			sc.data = m.Data
		case m.Kind == mirror.KindEntry && m.EntryType == "leaf":
			if env, err := session.ScanEntry(m.Data); err == nil {
				sc.targetID = env.TargetID
			}
		}
		msgs = append(msgs, sc)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read conversation %s: %w", c.c.Key, err)
	}
	if !c.loaded {
		if len(msgs) == 0 {
			return errNoConv
		}
		if err := s.build(ctx, c, msgs); err != nil {
			return err
		}
		if keep {
			*read = all
		}
		return nil
	}
	for _, m := range msgs {
		c.subjSeq = max(c.subjSeq, m.seq)
		if m.Generation > c.gen && c.writer != mirror.WriterStore || m.Kind == mirror.KindHeader && m.Generation == c.gen && c.headerSeq != 0 {
			// The daemon rewrote the file, a new generation replaces the one we served; or
			// the conversation was deleted and created again.
			c.loaded = false
			return s.load(ctx, c, read)
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
	c.gen, c.subjSeq, c.genSeq, c.lastOrdinal, c.head = gen, 0, 0, -1, ""
	c.ids, c.entries, c.meta, c.source, c.headerSHA, c.headerSeq = map[string]entryRef{}, 0, headerMeta{}, "", "", 0
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
	c.genSeq = max(c.genSeq, m.seq)
	if m.Kind == mirror.KindHeader {
		c.headerSHA, c.headerSeq, c.source = m.SHA256, m.seq, m.Source
		if hm, err := parseHeaderMeta(m.data); err == nil {
			c.meta = hm
		}
		c.lastOrdinal = max(c.lastOrdinal, m.Ordinal)
		return
	}
	if _, dup := c.ids[m.EntryID]; dup && m.Kind != mirror.KindRaw {
		return // a second copy of a line (the reader drops those too)
	}
	if m.Kind != mirror.KindRaw {
		c.ids[m.EntryID] = entryRef{seq: m.seq, ordinal: m.Ordinal, sha: m.SHA256}
		c.entries++
	}
	if m.Ordinal <= c.lastOrdinal {
		return // out of order: the head follows the last line in file order
	}
	c.lastOrdinal = m.Ordinal
	switch {
	case m.Kind == mirror.KindRaw || m.Format == string(session.FormatV1):
		// no id: Pi's leaf rule leaves the leaf where it was
	case m.EntryType == "leaf":
		c.head = m.targetID
	default:
		c.head = m.EntryID
	}
}

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
	h.Entries, h.LastOrdinal, h.LastSeq, h.Head = c.entries+1, c.lastOrdinal, c.genSeq, c.head
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
	if c.kvHasHead && c.kvHead.Generation == c.gen && c.kvHead.LastSeq >= c.genSeq && c.kvHead.Head == c.head {
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
