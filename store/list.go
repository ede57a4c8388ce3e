package store

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/mirror"
)

// listPage is the most conversations one list reply holds.
const listPage = 500

// List returns the metadata of the owner's conversations, newest first.
func (s *Store) List(ctx context.Context, o mirror.Owner, req listReq) ([]Meta, int, *Error) {
	list, err := s.handles(o).reader.Conversations(ctx)
	if err != nil {
		return nil, 0, errorf(CodeUnavailable, "%v", err)
	}
	heads, counts := list.ByKey(), list.Counts
	var out []Meta
	// The conversations the stream holds messages of: a head left without them lists nothing.
	for key := range counts {
		// A head the store wrote stands for the conversation only if it accounts for every
		// message the stream holds for it: a replica stopped between its acknowledgement
		// and its head update leaves it behind (and a generation of a local file beside
		// the store's adds messages it does not count). Else the stream is read.
		if h, ok := heads[key]; ok && h.Writer == mirror.WriterStore && h.CreatedAt != "" && uint64(h.Entries) == counts[key] {
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
		if err := s.load(ctx, st, nil); err == nil && st.meta.createdAt != "" && !st.incomplete() {
			s.repairHead(ctx, st)
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
	rest := out[req.Offset:]
	page, n := s.listFit(rest)
	next := 0
	if n < len(rest) {
		next = req.Offset + n
	}
	return page, next, nil
}

// listReserve is what a list reply holds besides its sessions: {"ok":true,"sessions":[],"next":N}.
const listReserve = 128

// listFit returns the sessions of out that one reply carries under max_payload (at most
// listPage), and how many of out they stand for: a session whose metadata alone would not
// fit a reply is sent without it (metadataOmitted), one that would not fit even so is left
// out with a warning.
func (s *Store) listFit(out []Meta) ([]Meta, int) {
	room := s.opts.MaxPayload - listReserve
	page := make([]Meta, 0, min(len(out), listPage))
	n := 0
	for ; n < len(out) && len(page) < listPage; n++ {
		m, size, ok := fitMeta(out[n], s.opts.MaxPayload-listReserve-1)
		if !ok {
			s.log.Warn("list: a session's metadata does not fit a reply", zap.String("conversation", m.ID), zap.Int64("bytes", size))
			continue
		}
		if size+1 > room {
			break
		}
		room -= size + 1
		page = append(page, m)
	}
	return page, n
}

// fitMeta returns m, or m without its metadata (metadataOmitted) if m is larger than room
// encoded, with its encoded size; ok is false if it is larger than room even so.
func fitMeta(m Meta, room int64) (Meta, int64, bool) {
	b, err := json.Marshal(m)
	if err == nil && int64(len(b)) <= room {
		return m, int64(len(b)), true
	}
	m.Metadata, m.MetadataOmitted = nil, true
	b, err = json.Marshal(m)
	return m, int64(len(b)), err == nil && int64(len(b)) <= room
}

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}
