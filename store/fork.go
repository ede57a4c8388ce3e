package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
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
	v := string(bytes.TrimSpace(raw))
	switch v {
	case "", "null", "false", `""`:
		return false
	}
	if v[0] == '-' || v[0] >= '0' && v[0] <= '9' {
		// Every spelling of zero (0.0, -0, 0e5, 1e-400) is the number 0, which is false.
		f, err := strconv.ParseFloat(v, 64)
		return err != nil || f != 0 // out of range: ±Infinity, true
	}
	return true
}

// forkMark is the Pisync-Fork header of a fork's header message: the request and the
// snapshot of the source it copies. A fork whose generation holds fewer entries than the
// mark says is incomplete: open, list and append do not see it, and the same fork request
// again resumes the copy from the same snapshot, whatever the source became meanwhile.
type forkMark struct {
	Entries    int64  `json:"entries"`             // entries the copy makes
	Source     string `json:"source"`              // the source conversation's id
	Generation int    `json:"generation"`          // its generation copied
	LastSeq    uint64 `json:"lastSeq"`             // up to this stream sequence
	HeaderSeq  uint64 `json:"headerSeq,omitempty"` // its header then (0: it had none)
	EntryID    string `json:"entryId,omitempty"`
	Position   string `json:"position,omitempty"`
}

// parseForkMark reads a Pisync-Fork value ("" for a conversation that is no fork). A
// mark that does not decode says nothing about what the fork holds: such a fork never
// counts as complete, and a delete removes it.
func parseForkMark(v string) *forkMark {
	if v == "" {
		return nil
	}
	var f forkMark
	if err := json.Unmarshal([]byte(v), &f); err != nil || f.Entries < 0 {
		return &forkMark{Entries: math.MaxInt64}
	}
	return &f
}

// sameRequest reports whether a fork request (normalized) is the one f was made for.
func (f *forkMark) sameRequest(req forkReq) bool {
	return f.Source == req.Source && f.EntryID == req.EntryID && f.Position == req.Position
}

// Fork creates the conversation of header line from entries of source, as Pi's
// JsonlSessionRepo.fork does (getEntriesToFork), copying each line's exact bytes.
//
// A fork writes many messages and cannot be one publish: its header carries a mark
// (forkMark) until the copy is complete, which makes it invisible to every reader. The
// same request again, after a lost reply or a failure mid-copy on any replica, finds the
// mark and copies what is missing from the snapshot the mark names, so it answers ok with
// the complete fork or fails, never with part of it.
func (s *Store) Fork(ctx context.Context, o mirror.Owner, req forkReq) (Meta, *Error) {
	if req.Source == "" {
		return Meta{}, errorf(CodeInvalid, "fork: source is required")
	}
	src, err := mirror.NewConv(o, req.Source)
	if err != nil {
		return Meta{}, errorf(CodeNotFound, "conversation %q not found", req.Source)
	}
	switch {
	case req.EntryID == "":
		req.Position = ""
	case req.Position == "":
		req.Position = "before"
	case req.Position != "before" && req.Position != "at":
		return Meta{}, errorf(CodeInvalid, "position %q: want before or at", req.Position)
	}
	line := []byte(req.Line)
	hm, e := s.headerLine(line)
	if e != nil {
		return Meta{}, e
	}
	dst, err := mirror.NewConv(o, hm.id)
	if err != nil {
		return Meta{}, errorf(CodeInvalid, "session id %q: %v", hm.id, err)
	}
	sum := session.Digest(line)
	for attempt := 0; attempt < attempts; attempt++ {
		mark, e := s.forkInProgress(ctx, dst, sum, req)
		if e != nil {
			return Meta{}, e
		}
		resumed := mark != nil
		if !resumed {
			if e := s.checkQuotaConversations(ctx, o); e != nil {
				return Meta{}, e
			}
			if mark, e = s.forkSnapshot(ctx, src, req); e != nil {
				return Meta{}, e
			}
		}
		if resumed {
			e = s.forkSourceKept(ctx, src, mark)
		}
		var picked []mirror.Msg
		if e == nil {
			picked, e = s.forkPicks(ctx, o, src, mark, req)
		}
		if e == nil && resumed && int64(len(picked)) != mark.Entries {
			e = errorf(CodeNotFound, "conversation %q changed before the fork completed", req.Source)
		}
		if e != nil {
			if resumed && e.Code == CodeNotFound {
				// The snapshot the fork copies is gone: the fork can never complete.
				s.abandonFork(ctx, dst, sum)
			}
			return Meta{}, e
		}
		mark.Entries = int64(len(picked))
		meta, again, e := s.forkCopy(ctx, dst, line, sum, hm, mark, req, picked)
		if !again {
			return meta, e
		}
	}
	return Meta{}, errorf(CodeUnavailable, "fork into %s: the conversation kept changing, or JetStream did not answer; retry", hm.id)
}

// forkInProgress reads the fork's conversation: nil if there is none, its mark if it is a
// fork made by this very request (complete or not), conflict if it is anything else.
func (s *Store) forkInProgress(ctx context.Context, dst mirror.Conv, sum string, req forkReq) (*forkMark, *Error) {
	nst := s.conv(dst)
	defer nst.mu.Unlock()
	err := s.load(ctx, nst, nil)
	switch {
	case errors.Is(err, errNoConv):
		return nil, nil
	case err != nil:
		return nil, errorf(CodeUnavailable, "%v", err)
	case nst.headerSHA == sum && nst.gen == 1 && nst.fork != nil && nst.fork.sameRequest(req):
		m := *nst.fork
		return &m, nil
	}
	s.m.conflicts.WithLabelValues(ReasonExists).Inc()
	return nil, conflict(ReasonExists, nst.leaf.ID(), "conversation %s exists", dst.Key)
}

// forkSnapshot names the source's state a new fork copies: its generation up to now.
func (s *Store) forkSnapshot(ctx context.Context, src mirror.Conv, req forkReq) (*forkMark, *Error) {
	st := s.conv(src)
	defer st.mu.Unlock()
	if e := s.refresh(ctx, st, req.Source); e != nil {
		return nil, e
	}
	if st.incomplete() {
		return nil, errorf(CodeNotFound, "conversation %q not found", req.Source)
	}
	return &forkMark{Entries: -1, Source: req.Source, Generation: st.gen, LastSeq: st.genSeq, HeaderSeq: st.headerSeq,
		EntryID: req.EntryID, Position: req.Position}, nil
}

// forkSourceKept checks that the source of a fork being resumed is the conversation whose
// snapshot the fork copies: a source deleted meanwhile (perhaps created again) fails it,
// as it would have failed the fork had the request come after the delete.
func (s *Store) forkSourceKept(ctx context.Context, src mirror.Conv, mark *forkMark) *Error {
	st := s.conv(src)
	defer st.mu.Unlock()
	if e := s.refresh(ctx, st, mark.Source); e != nil {
		return e
	}
	if st.incomplete() || mark.HeaderSeq != 0 && st.headerSeq != mark.HeaderSeq {
		return errorf(CodeNotFound, "conversation %q not found", mark.Source)
	}
	return nil
}

// forkPicks reads the snapshot of mark and picks the entries the fork copies.
func (s *Store) forkPicks(ctx context.Context, o mirror.Owner, src mirror.Conv, mark *forkMark, req forkReq) ([]mirror.Msg, *Error) {
	msgs, e := s.readGen(ctx, src, mark.Generation, mark.LastSeq, snapshotOrigin{})
	if e != nil {
		return nil, e
	}
	if mark.HeaderSeq != 0 && (len(msgs) == 0 || msgs[0].Kind != mirror.KindHeader || msgs[0].Seq != mark.HeaderSeq) {
		// Deleted (and perhaps created again) since the snapshot was taken.
		return nil, errorf(CodeNotFound, "conversation %q not found", req.Source)
	}
	if incompleteIn(msgs) {
		return nil, errorf(CodeNotFound, "conversation %q not found", req.Source)
	}
	return s.forkEntries(ctx, o, msgs, req)
}

// forkCopy writes the fork: its header with the mark if it has none, then the entries it
// lacks. again says that the fork was changed by another request meanwhile (another
// replica serving a retry of the same fork): the caller starts over from the stream.
func (s *Store) forkCopy(ctx context.Context, dst mirror.Conv, line []byte, sum string, hm headerMeta, mark *forkMark,
	req forkReq, picked []mirror.Msg) (Meta, bool, *Error) {
	nst := s.conv(dst)
	defer nst.mu.Unlock()
	// Replicas copying the same fork at once each lose a publish to the other now and
	// then; a loss after which the fork holds more than before is progress, not a reason
	// to give up.
	for losses, had := 0, int64(-1); losses < attempts; {
		err := s.load(ctx, nst, nil)
		switch {
		case errors.Is(err, errNoConv):
			markJSON, _ := json.Marshal(mark)
			ok, e := s.publishHeader(ctx, nst, hm, line, sum, string(markJSON))
			if e != nil {
				return Meta{}, false, e
			}
			if !ok {
				losses++
				continue
			}
			s.countCreated(dst.Owner)
		case err != nil:
			return Meta{}, false, errorf(CodeUnavailable, "%v", err)
		case nst.headerSHA != sum || nst.gen != 1 || nst.fork == nil || !nst.fork.sameRequest(req):
			s.m.conflicts.WithLabelValues(ReasonExists).Inc()
			return Meta{}, false, conflict(ReasonExists, nst.leaf.ID(), "conversation %s exists", hm.id)
		case *nst.fork != *mark:
			return Meta{}, true, nil // made by a retry that read the source later: copy its snapshot
		}
		have := nst.entries
		if have <= had {
			losses++
		}
		had = have
		for i := int64(0); i < min(have, int64(len(picked))); i++ {
			if ref, ok := nst.ids[picked[i].EntryID]; !ok || ref.ordinal != i+1 {
				return Meta{}, false, errorf(CodeUnavailable, "fork %s holds entries its source's snapshot lacks", hm.id)
			}
		}
		done, e := s.forkCopyFrom(ctx, dst, nst, picked, have)
		if e != nil {
			return Meta{}, false, e
		}
		if done {
			nst.writer = mirror.WriterStore
			if err := s.saveHead(ctx, nst); err != nil {
				s.log.Warn("fork: head not written", zapConv(nst), zapErr(err))
			}
			return s.meta(nst), false, nil
		}
	}
	return Meta{}, true, nil
}

// forkCopyFrom publishes picked[have:] into the fork nst. done is false when another
// request (a retry of the same fork on another replica) published first: the caller
// reads the fork again.
func (s *Store) forkCopyFrom(ctx context.Context, dst mirror.Conv, nst *conv, picked []mirror.Msg, have int64) (bool, *Error) {
	for i := have; i < int64(len(picked)); i++ {
		if f := s.faults.forkCopy.Load(); f != nil {
			if err := (*f)(int(i)); err != nil {
				return false, errorf(CodeUnavailable, "fork into %s: %v", dst.Key, err)
			}
		}
		m := picked[i]
		l := m.Line
		l.Ordinal, l.Generation, l.Host, l.Source, l.Fork = nst.lastOrdinal+1, nst.gen, s.opts.Host, nst.source, ""
		msg := s.names.NewMsg(dst, l, m.Data)
		ack, err := s.js.PublishMsg(ctx, msg, expectSubjectSeq(nst.subjSeq))
		if err == nil && ack.Duplicate {
			// The id of a deleted conversation's message, still in the duplicate window:
			// the fence alone keeps this publish once (see publish).
			msg.Header.Del(mirror.HdrMsgID)
			ack, err = s.js.PublishMsg(ctx, msg, expectSubjectSeq(nst.subjSeq))
		}
		if isWrongSequence(err) {
			nst.refused = true
			return false, nil
		}
		if err != nil {
			return false, errorf(CodeUnavailable, "fork into %s: %v", dst.Key, err)
		}
		nst.subjSeq = ack.Sequence
		nst.count++
		nst.apply(scanOne(mirror.Msg{Line: l, Seq: ack.Sequence, Time: time.Now(), Data: m.Data}))
	}
	return true, nil
}

// abandonFork removes an incomplete fork that can never complete (its source's snapshot
// is gone), if it is still the one whose header has digest sum.
func (s *Store) abandonFork(ctx context.Context, dst mirror.Conv, sum string) {
	nst := s.conv(dst)
	defer nst.mu.Unlock()
	if err := s.load(ctx, nst, nil); err != nil || nst.headerSHA != sum || !nst.incomplete() {
		return
	}
	if err := s.bound.Stream.Purge(ctx, purgeSubject(s.names.Subject(dst))); err != nil {
		s.log.Warn("fork: incomplete fork left", zapConv(nst), zapErr(err))
		return
	}
	nst.loaded = false
	s.forget(dst)
}

// incompleteIn reports whether msgs, a generation in ordinal order, are an incomplete fork.
func incompleteIn(msgs []mirror.Msg) bool {
	if len(msgs) == 0 || msgs[0].Kind != mirror.KindHeader {
		return false
	}
	f := parseForkMark(msgs[0].Fork)
	if f == nil {
		return false
	}
	n := int64(0)
	for _, m := range msgs[1:] {
		if m.Kind != mirror.KindRaw && m.Kind != mirror.KindHeader {
			n++
		}
	}
	return n < f.Entries
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
