package store

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// OpenReply is one reply of open. Its entries are kept encoded (openjson.go): the reply
// is written as JSON by replyJSON, in the field order of the protocol's example.
type OpenReply struct {
	OK         bool
	Meta       Meta
	Head       *string
	Generation int
	LastSeq    uint64
	Next       *OpenNext

	entries []byte // the entries' JSON objects, comma-separated
	count   int    // how many
	// body, when not nil, is the reply written so far: its head, then entries (at its end),
	// with room for the rest, so that the reply is not copied once more to be sent.
	body []byte
}

// OpenNext is where the next open request continues.
type OpenNext struct {
	After int64 `json:"after"`
}

// PartReply is one part of a large entry read by open.
type PartReply struct {
	OK      bool   `json:"ok"`
	Ordinal int64  `json:"ordinal"`
	Offset  int64  `json:"offset"`
	Size    int64  `json:"size"`
	Data    []byte `json:"data"`
	EOF     bool   `json:"eof"`
}

// What an open reply keeps free below max_payload besides its head and entries: the tail
// after the entries (`],"next":{"after":N}}`); room for one entry by reference; room for
// the head's fields but meta.
const (
	openTail     = 64
	openRefRoom  = 256
	openHeadRoom = 512
)

// Open answers one open request: the metadata, head and the entries after req.After of
// the generation the store serves, as many as fit one reply. A replica that has to read
// the conversation from the stream to answer (it has not seen it, or it changed) keeps
// what it read as the snapshot the continuations read, so that the stream is read once.
func (s *Store) Open(ctx context.Context, o mirror.Owner, req openReq) (OpenReply, *Error) {
	c, err := mirror.NewConv(o, req.ID)
	if err != nil {
		return OpenReply{}, errorf(CodeNotFound, "conversation %q not found", req.ID)
	}
	st := s.conv(c)
	var read loadOut
	if e := s.refreshRead(ctx, st, req.ID, &read); e != nil {
		st.mu.Unlock()
		return OpenReply{}, e
	}
	if st.incomplete() {
		st.mu.Unlock()
		return OpenReply{}, errorf(CodeNotFound, "conversation %q not found", req.ID)
	}
	s.repairHead(ctx, st)
	rep := OpenReply{OK: true, Meta: s.meta(st), Head: headPtr(st.leaf.ID()), Generation: st.gen, LastSeq: st.genSeq}
	of := snapshotOrigin{conv: c.HeadKey(), gen: st.gen, headerSeq: st.headerSeq, last: st.genSeq}
	if req.Generation == 0 {
		key := snapshotKey(c, st.gen, st.genSeq)
		if read.msgs != nil {
			s.opened.put(key, snapshotOf(read.msgs, st.gen, st.genSeq), of)
		} else if _, ok := s.opened.get(key); !ok {
			s.extendSnapshot(ctx, c, key, of, read.counted)
		}
	}
	st.mu.Unlock()
	if req.Generation != 0 {
		rep.Generation, rep.LastSeq = req.Generation, req.LastSeq
		of = snapshotOrigin{} // a continuation: the snapshot it names is not the newest
	}
	msgs, e := s.readGen(ctx, c, rep.Generation, rep.LastSeq, of)
	if e != nil {
		return OpenReply{}, e
	}
	if incompleteIn(msgs) { // a continuation that names an incomplete fork's snapshot
		return OpenReply{}, errorf(CodeNotFound, "conversation %q not found", req.ID)
	}
	after := int64(0)
	if req.After != nil {
		after = *req.After
	}
	// Every reply of the open carries the head (meta included): an entry goes inline if it
	// fits beside it, else by reference; the first entry of a reply always fits, at worst
	// by reference, so that each reply moves on.
	m, size, ok := fitMeta(rep.Meta, s.opts.MaxPayload-openTail-openRefRoom-openHeadRoom)
	if !ok {
		return OpenReply{}, errorf(CodeUnavailable, "the metadata of %q (%d bytes) does not fit a reply", req.ID, size)
	}
	rep.Meta = m
	budget := s.opts.MaxPayload - openTail
	last := after
	first := sort.Search(len(msgs), func(i int) bool { return msgs[i].Ordinal > after })
	var buf []byte
	head, err := json.Marshal(rep.head())
	if err != nil {
		return OpenReply{}, errorf(CodeUnavailable, "open %q: %v", req.ID, err)
	}
	buf = make([]byte, 0, int64(len(head))+replySize(msgs[first:], budget)+64)
	buf = append(buf, head[:len(head)-1]...) // without its closing brace
	buf = append(buf, `,"entries":[`...)
	start := len(buf)
	inlineMax := budget - int64(start) - 1
	for _, m := range msgs[first:] {
		if m.Kind == mirror.KindHeader {
			continue
		}
		if m.Kind == mirror.KindRaw && session.IsBlank(m.Data) {
			last = m.Ordinal
			continue
		}
		mark := len(buf)
		if rep.count > 0 {
			buf = append(buf, ',')
		}
		sep := len(buf)
		e := OpenEntry{Ordinal: m.Ordinal, Raw: m.Kind == mirror.KindRaw}
		inlined := false
		if m.Kind != mirror.KindBlob {
			// The line itself, unless it is not UTF-8 or would not fit a reply alone.
			line := m.Data
			if line == nil {
				line = []byte{}
			}
			buf, inlined = appendOpenEntry(buf, e, line)
			if inlined && int64(len(buf)-sep) > inlineMax {
				buf, inlined = buf[:sep], false
			}
		}
		if !inlined {
			e.Size, e.SHA256 = lineSize(m), m.SHA256
			buf, _ = appendOpenEntry(buf, e, nil)
		}
		if int64(len(buf)) > budget && rep.count > 0 {
			buf = buf[:mark]
			rep.Next = &OpenNext{After: last}
			break
		}
		rep.count++
		last = m.Ordinal
	}
	rep.entries = buf[start:]
	rep.body = buf
	return rep, nil
}

func lineSize(m mirror.Msg) int64 {
	if m.Kind == mirror.KindBlob {
		return m.BlobSize
	}
	return int64(len(m.Data))
}

// replySize is about the bytes the entries of one reply take: what its buffer is made
// with, so that it does not grow by copies.
func replySize(msgs []mirror.Msg, budget int64) int64 {
	n := int64(0)
	for _, m := range msgs {
		if n += int64(len(m.Data)) + 64; n > budget {
			return budget + 4096
		}
	}
	return n
}

// OpenPart returns part of a large entry, from a snapshot named by open's reply.
func (s *Store) OpenPart(ctx context.Context, o mirror.Owner, req openReq) (PartReply, *Error) {
	c, err := mirror.NewConv(o, req.ID)
	if err != nil || req.Generation <= 0 {
		return PartReply{}, errorf(CodeInvalid, "a part request names the conversation, generation and lastSeq of an open reply")
	}
	msgs, e := s.readGen(ctx, c, req.Generation, req.LastSeq, snapshotOrigin{})
	if e != nil {
		return PartReply{}, e
	}
	if incompleteIn(msgs) {
		return PartReply{}, errorf(CodeNotFound, "conversation %q not found", req.ID)
	}
	i := sort.Search(len(msgs), func(i int) bool { return msgs[i].Ordinal >= *req.Ordinal })
	if i == len(msgs) || msgs[i].Ordinal != *req.Ordinal {
		return PartReply{}, errorf(CodeNotFound, "entry at ordinal %d not found", *req.Ordinal)
	}
	m := msgs[i]
	data := m.Data
	if m.Kind == mirror.KindBlob {
		if data, err = s.storedBlob(ctx, o, m.SHA256); err != nil {
			if errors.Is(err, mirror.ErrNotFound) {
				return PartReply{}, errorf(CodeNotFound, "blob %s of ordinal %d: %v", m.SHA256, m.Ordinal, err)
			}
			return PartReply{}, errorf(CodeUnavailable, "blob %s: %v", m.SHA256, err)
		}
	}
	if req.Offset < 0 || req.Offset > int64(len(data)) {
		return PartReply{}, errorf(CodeInvalid, "offset %d outside the entry's %d bytes", req.Offset, len(data))
	}
	// A part is at most PartSize, and less when its base64 would not fit max_payload.
	end := min(req.Offset+min(PartSize, (s.opts.MaxPayload-1024)/4*3), int64(len(data)))
	return PartReply{OK: true, Ordinal: m.Ordinal, Offset: req.Offset, Size: int64(len(data)),
		Data: data[req.Offset:end], EOF: end == int64(len(data))}, nil
}

// readGen reads generation gen of c up to stream sequence last, in ordinal order. The
// continuations of one open read the same snapshot, so a replica keeps the last few.
func (s *Store) readGen(ctx context.Context, c mirror.Conv, gen int, last uint64, of snapshotOrigin) ([]mirror.Msg, *Error) {
	key := snapshotKey(c, gen, last)
	if msgs, ok := s.opened.get(key); ok {
		return msgs, nil
	}
	g, err := s.handles(c.Owner).reader.ReadGeneration(ctx, c, gen)
	if errors.Is(err, mirror.ErrNotFound) {
		return nil, errorf(CodeNotFound, "conversation %q not found", c.Key)
	}
	if err != nil {
		return nil, errorf(CodeUnavailable, "%v", err)
	}
	msgs := g.Msgs[:0]
	for _, m := range g.Msgs {
		if last == 0 || m.Seq <= last {
			msgs = append(msgs, m)
		}
	}
	s.opened.put(key, msgs, of)
	return msgs, nil
}

// extendSnapshot makes the snapshot of generation of.gen up to of.last from the newest one
// kept of that generation, reading from the stream only the messages that follow it: an
// open on a replica that served the conversation a moment ago (and has appended to it
// since) costs the new entries, not the whole conversation. Without such a snapshot, or
// on an error, it keeps nothing and readGen reads the generation whole.
//
// of.last is the newest sequence of the generation the state holds, read from the stream
// or acknowledged to this replica: stored, so the read waits for it (Through) however far
// behind its leader the replica serving it is, up to snapshotWait; counted, if not nil,
// is the leader's count of the conversation load has just asked (Scan asks it else).
func (s *Store) extendSnapshot(ctx context.Context, c mirror.Conv, key string, of snapshotOrigin, counted *uint64) {
	base, last, ok := s.opened.base(of.conv, of.gen, of.headerSeq)
	if !ok || last >= of.last {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, snapshotWait)
	defer cancel()
	msgs := slices.Clone(base) // continuations of an earlier open may still read base
	opts := mirror.ScanOptions{FromSeq: last + 1, Through: of.last, Counted: counted}
	err := s.handles(c.Owner).reader.Scan(ctx, c, opts, func(m mirror.Msg) error {
		if m.Generation == of.gen && m.Seq <= of.last {
			msgs = append(msgs, m)
		}
		return nil
	})
	if err != nil {
		s.log.Debug("open: snapshot not extended", zap.String("conversation", c.Key), zap.Error(err))
		return
	}
	msgs, _ = mirror.OrderByOrdinal(msgs)
	s.opened.put(key, msgs, of)
}

// snapshotWait bounds extendSnapshot's wait for a sequence it knows stored: should it not
// come (the conversation deleted meanwhile), readGen reads the generation whole, which
// finds what the stream's leader holds.
const snapshotWait = 10 * time.Second

// snapshotKey names the snapshot of generation gen of c up to stream sequence last.
func snapshotKey(c mirror.Conv, gen int, last uint64) string {
	return c.HeadKey() + "/" + strconv.Itoa(gen) + "/" + strconv.FormatUint(last, 10)
}

// snapshotOf is what readGen returns for generation gen up to last, made from every
// message of the conversation read in stream order (by load). It takes msgs over.
func snapshotOf(msgs []mirror.Msg, gen int, last uint64) []mirror.Msg {
	kept := msgs[:0]
	for _, m := range msgs {
		if m.Generation == gen && m.Seq <= last {
			kept = append(kept, m)
		}
	}
	kept, _ = mirror.OrderByOrdinal(kept)
	return kept
}
