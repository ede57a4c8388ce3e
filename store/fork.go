package store

import (
	"context"
	"encoding/json"

	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/session"
)

// forkFields are the fields of an entry Pi's fork rules read.
type forkFields struct {
	Type             string          `json:"type"`
	RetainedTail     json.RawMessage `json:"retainedTail"`
	FirstKeptEntryID *string         `json:"firstKeptEntryId"`
	Message          struct {
		Role string `json:"role"`
	} `json:"message"`
}

// truthy is JavaScript's truthiness of a JSON value.
func truthy(raw json.RawMessage) bool {
	switch string(raw) {
	case "", "null", "false", "0", `""`, "-0":
		return false
	}
	return true
}

// Fork creates the conversation of header line from entries of source, as Pi's
// JsonlSessionRepo.fork does (getEntriesToFork), copying each line's exact bytes.
func (s *Store) Fork(ctx context.Context, o mirror.Owner, req forkReq) (Meta, *Error) {
	src, err := mirror.NewConv(o, req.Source)
	if err != nil {
		return Meta{}, errorf(CodeNotFound, "conversation %q not found", req.Source)
	}
	st := s.conv(src)
	if e := s.refresh(ctx, st, req.Source); e != nil {
		st.mu.Unlock()
		return Meta{}, e
	}
	gen, last := st.gen, st.genSeq
	st.mu.Unlock()
	msgs, e := s.readGen(ctx, src, gen, last, snapshotOrigin{})
	if e != nil {
		return Meta{}, e
	}
	picked, e := s.forkEntries(ctx, o, msgs, req)
	if e != nil {
		return Meta{}, e
	}
	hm, e := checkHeader([]byte(req.Line))
	if e != nil {
		return Meta{}, e
	}
	if _, _, e := s.Create(ctx, o, []byte(req.Line)); e != nil {
		return Meta{}, e
	}
	dst, _ := mirror.NewConv(o, hm.id)
	nst := s.conv(dst)
	defer nst.mu.Unlock()
	if nst.entries > 0 || nst.lastOrdinal > 0 {
		return Meta{}, conflict(ReasonExists, nst.head, "conversation %s exists", hm.id)
	}
	for _, m := range picked {
		l := m.Line
		l.Ordinal, l.Generation, l.Host, l.Source = nst.lastOrdinal+1, nst.gen, s.opts.Host, nst.source
		msg := s.names.NewMsg(dst, l, m.Data)
		ack, err := s.js.PublishMsg(ctx, msg, expectSubjectSeq(nst.subjSeq))
		if err == nil && ack.Duplicate {
			// The id of a deleted conversation's message, still in the duplicate window:
			// the fence alone keeps this publish once (see publish).
			msg.Header.Del(mirror.HdrMsgID)
			ack, err = s.js.PublishMsg(ctx, msg, expectSubjectSeq(nst.subjSeq))
		}
		if err != nil {
			return Meta{}, errorf(CodeUnavailable, "fork into %s: %v", hm.id, err)
		}
		target := ""
		if l.EntryType == "leaf" {
			if env, err := session.ScanEntry(m.Data); err == nil {
				target = env.TargetID
			}
		}
		nst.subjSeq = ack.Sequence
		nst.count++
		nst.apply(scanned{Line: l, seq: ack.Sequence, targetID: target})
	}
	if err := s.saveHead(ctx, nst); err != nil {
		s.log.Warn("fork: head not written", zapConv(nst), zapErr(err))
	}
	return s.meta(nst), nil
}

// forkEntries picks the entries to copy: all of them without an entry id, else the path
// to root (or to the compaction that cuts it) of the entry ("at") or of its parent
// ("before", which must name a user message).
func (s *Store) forkEntries(ctx context.Context, o mirror.Owner, msgs []mirror.Msg, req forkReq) ([]mirror.Msg, *Error) {
	var entries []mirror.Msg
	byID := map[string]mirror.Msg{}
	for _, m := range msgs {
		if m.Kind == mirror.KindHeader || m.Kind == mirror.KindRaw {
			continue
		}
		entries = append(entries, m)
		byID[m.EntryID] = m
	}
	if req.EntryID == "" {
		return entries, nil
	}
	fields := func(m mirror.Msg) (forkFields, *Error) {
		data := m.Data
		if m.Kind == mirror.KindBlob {
			b, err := s.storedBlob(ctx, o, m.SHA256)
			if err != nil {
				return forkFields{}, errorf(CodeUnavailable, "blob %s: %v", m.SHA256, err)
			}
			data = b
		}
		var f forkFields
		_ = json.Unmarshal(data, &f) // a line that does not decode has none of the fields
		return f, nil
	}
	target, ok := byID[req.EntryID]
	if !ok {
		return nil, errorf(CodeNotFound, "entry %s not found", req.EntryID)
	}
	leaf := target.EntryID
	switch req.Position {
	case "at":
	case "", "before":
		f, e := fields(target)
		if e != nil {
			return nil, e
		}
		if f.Type != "message" || f.Message.Role != "user" {
			return nil, errorf(CodeInvalid, "entry %s is not a user message", req.EntryID)
		}
		leaf = target.ParentID
	default:
		return nil, errorf(CodeInvalid, "position %q: want before or at", req.Position)
	}
	// getPathToRootOrCompaction
	var path []mirror.Msg
	if leaf == "" {
		return nil, nil
	}
	cur, ok := byID[leaf]
	if !ok {
		return nil, errorf(CodeNotFound, "entry %s not found", leaf)
	}
	stopAt, stopSet := "", false
	for {
		path = append(path, cur)
		if stopSet && cur.EntryID == stopAt {
			break
		}
		if cur.EntryType == "compaction" {
			f, e := fields(cur)
			if e != nil {
				return nil, e
			}
			if truthy(f.RetainedTail) {
				break
			}
			stopAt, stopSet = "", f.FirstKeptEntryID != nil
			if stopSet {
				stopAt = *f.FirstKeptEntryID
			}
		}
		if cur.ParentID == "" {
			break
		}
		parent, ok := byID[cur.ParentID]
		if !ok {
			return nil, errorf(CodeInvalid, "entry %s not found", cur.ParentID)
		}
		cur = parent
	}
	for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
		path[i], path[j] = path[j], path[i]
	}
	return path, nil
}
