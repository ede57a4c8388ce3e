package store

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/session"
)

// OpenReply is one reply of open.
type OpenReply struct {
	OK         bool        `json:"ok"`
	Meta       Meta        `json:"meta"`
	Head       *string     `json:"head"`
	Generation int         `json:"generation"`
	LastSeq    uint64      `json:"lastSeq"`
	Entries    []OpenEntry `json:"entries"`
	Next       *OpenNext   `json:"next,omitempty"`
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

// replyReserve is what an open reply keeps free of entries below max_payload: its other
// fields and the headers of the reply message.
const replyReserve = 64 << 10

// Open answers one open request: the metadata, head and the entries after req.After of
// the generation the store serves, as many as fit one reply.
func (s *Store) Open(ctx context.Context, o mirror.Owner, req openReq) (OpenReply, *Error) {
	c, err := mirror.NewConv(o, req.ID)
	if err != nil {
		return OpenReply{}, errorf(CodeNotFound, "conversation %q not found", req.ID)
	}
	st := s.conv(c)
	if e := s.refresh(ctx, st, req.ID); e != nil {
		st.mu.Unlock()
		return OpenReply{}, e
	}
	s.repairHead(ctx, st)
	rep := OpenReply{OK: true, Meta: s.meta(st), Head: headPtr(st.head), Generation: st.gen, LastSeq: st.genSeq}
	st.mu.Unlock()
	if req.Generation != 0 {
		rep.Generation, rep.LastSeq = req.Generation, req.LastSeq
	}
	msgs, e := s.readGen(ctx, c, rep.Generation, rep.LastSeq)
	if e != nil {
		return OpenReply{}, e
	}
	after := int64(0)
	if req.After != nil {
		after = *req.After
	}
	budget := s.opts.MaxPayload - replyReserve
	metaJSON, _ := json.Marshal(rep.Meta)
	used := int64(len(metaJSON)) + 256
	rep.Entries = []OpenEntry{}
	last := after
	for _, m := range msgs {
		if m.Ordinal <= after || m.Kind == mirror.KindHeader {
			continue
		}
		if m.Kind == mirror.KindRaw && session.IsBlank(m.Data) {
			last = m.Ordinal
			continue
		}
		e := OpenEntry{Ordinal: m.Ordinal, Raw: m.Kind == mirror.KindRaw}
		size := int64(100)
		if m.Kind == mirror.KindBlob || !utf8.Valid(m.Data) {
			e.Size, e.SHA256 = lineSize(m), m.SHA256
		} else {
			enc, _ := json.Marshal(string(m.Data))
			if int64(len(enc)) > budget-1024 {
				e.Size, e.SHA256 = lineSize(m), m.SHA256
			} else {
				line := string(m.Data)
				e.Line = &line
				size += int64(len(enc))
			}
		}
		if used+size > budget && len(rep.Entries) > 0 {
			rep.Next = &OpenNext{After: last}
			break
		}
		used += size
		rep.Entries = append(rep.Entries, e)
		last = m.Ordinal
	}
	return rep, nil
}

func lineSize(m mirror.Msg) int64 {
	if m.Kind == mirror.KindBlob {
		return m.BlobSize
	}
	return int64(len(m.Data))
}

// OpenPart returns part of a large entry, from a snapshot named by open's reply.
func (s *Store) OpenPart(ctx context.Context, o mirror.Owner, req openReq) (PartReply, *Error) {
	c, err := mirror.NewConv(o, req.ID)
	if err != nil || req.Generation <= 0 {
		return PartReply{}, errorf(CodeInvalid, "a part request names the conversation, generation and lastSeq of an open reply")
	}
	msgs, e := s.readGen(ctx, c, req.Generation, req.LastSeq)
	if e != nil {
		return PartReply{}, e
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
	end := min(req.Offset+PartSize, int64(len(data)))
	return PartReply{OK: true, Ordinal: m.Ordinal, Offset: req.Offset, Size: int64(len(data)),
		Data: data[req.Offset:end], EOF: end == int64(len(data))}, nil
}

// readGen reads generation gen of c up to stream sequence last, in ordinal order. The
// continuations of one open read the same snapshot, so a replica keeps the last few.
func (s *Store) readGen(ctx context.Context, c mirror.Conv, gen int, last uint64) ([]mirror.Msg, *Error) {
	key := c.HeadKey() + "/" + strconv.Itoa(gen) + "/" + strconv.FormatUint(last, 10)
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
	s.opened.put(key, msgs)
	return msgs, nil
}

// openCache keeps the generations recently read by open, bounded in bytes.
type openCache struct {
	mu    sync.Mutex
	max   int64
	size  int64
	items map[string]openItem
}

type openItem struct {
	msgs  []mirror.Msg
	bytes int64
	at    time.Time
}

func newOpenCache(max int64) *openCache { return &openCache{max: max, items: map[string]openItem{}} }

func (oc *openCache) get(key string) ([]mirror.Msg, bool) {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	it, ok := oc.items[key]
	if ok && time.Since(it.at) > time.Minute {
		delete(oc.items, key)
		oc.size -= it.bytes
		return nil, false
	}
	return it.msgs, ok
}

func (oc *openCache) put(key string, msgs []mirror.Msg) {
	var n int64
	for _, m := range msgs {
		n += int64(len(m.Data)) + 200
	}
	if n > oc.max/4 {
		return
	}
	oc.mu.Lock()
	defer oc.mu.Unlock()
	for oc.size+n > oc.max && len(oc.items) > 0 {
		oldest := ""
		for k, it := range oc.items {
			if oldest == "" || it.at.Before(oc.items[oldest].at) {
				oldest = k
			}
		}
		oc.size -= oc.items[oldest].bytes
		delete(oc.items, oldest)
	}
	oc.items[key] = openItem{msgs: msgs, bytes: n, at: time.Now()}
	oc.size += n
}

// listPage is the most conversations one list reply holds.
const listPage = 500

// List returns the metadata of the owner's conversations, newest first.
func (s *Store) List(ctx context.Context, o mirror.Owner, req listReq) ([]Meta, int, *Error) {
	r := s.handles(o).reader
	counts, err := r.Counts(ctx)
	if err != nil {
		return nil, 0, errorf(CodeUnavailable, "%v", err)
	}
	hl, err := r.ListHeads(ctx)
	if err != nil {
		return nil, 0, errorf(CodeUnavailable, "%v", err)
	}
	heads := map[string]mirror.Head{}
	for _, h := range hl.Heads {
		heads[h.ConvKey()] = h
	}
	var out []Meta
	for key := range counts {
		if h, ok := heads[key]; ok && h.Writer == mirror.WriterStore && h.CreatedAt != "" {
			out = append(out, Meta{ID: h.Conversation, CreatedAt: h.CreatedAt, Cwd: h.Cwd, ParentSessionPath: h.ParentSession,
				Metadata: h.Metadata, Path: h.Source, Writer: mirror.WriterStore, Generation: h.Generation,
				Entries: h.Entries - 1, Head: headPtr(h.Head), LastSeq: h.LastSeq})
			continue
		}
		c, err := mirror.NewConv(o, key)
		if err != nil {
			continue
		}
		st := s.conv(c)
		if err := s.load(ctx, st); err == nil && st.meta.createdAt != "" {
			out = append(out, s.meta(st))
		} else if err != nil && !errors.Is(err, errNoConv) {
			s.log.Warn("list: conversation skipped", zapConv(st), zapErr(err))
		}
		st.mu.Unlock()
	}
	if req.Cwd != "" {
		kept := out[:0]
		for _, m := range out {
			if m.Cwd == req.Cwd {
				kept = append(kept, m)
			}
		}
		out = kept
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := parseTime(out[i].CreatedAt), parseTime(out[j].CreatedAt)
		if !a.Equal(b) {
			return a.After(b)
		}
		return out[i].ID < out[j].ID
	})
	if req.Offset < 0 || req.Offset > len(out) {
		return nil, 0, errorf(CodeInvalid, "offset %d of %d conversations", req.Offset, len(out))
	}
	out = out[req.Offset:]
	next := 0
	if len(out) > listPage {
		out, next = out[:listPage], req.Offset+listPage
	}
	return out, next, nil
}

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}
