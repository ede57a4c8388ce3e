package store

import (
	"context"
	"encoding/json"
	"errors"
	"path"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// checkHeader applies the checks of Pi's parseHeaderLine to a v3 header line.
func checkHeader(line []byte) (headerMeta, *Error) {
	if err := stringified(line); err != nil {
		return headerMeta{}, errorf(CodeInvalid, "header line: %v", err)
	}
	h, err := session.ParseHeader(line)
	if err != nil {
		return headerMeta{}, errorf(CodeInvalid, "header line: %v", err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return headerMeta{}, errorf(CodeInvalid, "header line: %v", err)
	}
	isString := func(k string) bool {
		var s string
		return json.Unmarshal(m[k], &s) == nil && m[k] != nil && string(m[k]) != "null"
	}
	switch {
	case h.Version != 3:
		return headerMeta{}, errorf(CodeInvalid, "header line: version %d, want 3", h.Version)
	case !isString("timestamp") || h.Timestamp == "":
		return headerMeta{}, errorf(CodeInvalid, "header line: missing timestamp")
	case !isString("cwd") || h.Cwd == "":
		return headerMeta{}, errorf(CodeInvalid, "header line: missing cwd")
	case m["parentSession"] != nil && !isString("parentSession"):
		return headerMeta{}, errorf(CodeInvalid, "header line: parentSession must be a string")
	}
	if md, ok := m["metadata"]; ok {
		var obj map[string]json.RawMessage
		if json.Unmarshal(md, &obj) != nil || obj == nil {
			return headerMeta{}, errorf(CodeInvalid, "header line: metadata must be an object")
		}
	}
	hm, err := parseHeaderMeta(line)
	if err != nil {
		return headerMeta{}, errorf(CodeInvalid, "header line: %v", err)
	}
	for _, f := range [][2]string{{"id", hm.id}, {"timestamp", hm.createdAt}} {
		if err := pathSafe(f[0], f[1]); err != nil {
			return headerMeta{}, errorf(CodeInvalid, "header line: %v", err)
		}
	}
	return hm, nil
}

// headerLine checks the header line of a new conversation (create, fork).
func (s *Store) headerLine(line []byte) (headerMeta, *Error) {
	if n := int64(len(line)); n > s.opts.MaxHeaderBytes {
		s.m.quota.WithLabelValues(ReasonHeader).Inc()
		return headerMeta{}, tooLarge(ReasonHeader, "header line bytes (metadata, cwd, parentSession)", n, s.opts.MaxHeaderBytes)
	}
	return checkHeader(line)
}

// sourcePath is where Pi's JSONL backend would put the file, relative to its root.
func sourcePath(hm headerMeta) string {
	return path.Join(session.DirName(hm.cwd), session.FileName(hm.createdAt, hm.id))
}

// Create starts a conversation with its header line. The same line again answers with
// the original sequence; another line for an existing id is a conflict.
func (s *Store) Create(ctx context.Context, o mirror.Owner, line []byte) (uint64, Meta, *Error) {
	hm, e := s.headerLine(line)
	if e != nil {
		return 0, Meta{}, e
	}
	c, err := mirror.NewConv(o, hm.id)
	if err != nil {
		return 0, Meta{}, errorf(CodeInvalid, "session id %q: %v", hm.id, err)
	}
	st := s.conv(c)
	defer st.mu.Unlock()
	sum := session.Digest(line)
	for attempt := 0; attempt < attempts; attempt++ {
		err := s.load(ctx, st, nil)
		switch {
		case err == nil:
			if st.headerSHA == sum && st.gen == 1 && st.fork == nil {
				return st.headerSeq, s.meta(st), nil
			}
			s.m.conflicts.WithLabelValues(ReasonExists).Inc()
			return 0, Meta{}, conflict(ReasonExists, st.leaf.ID(), "conversation %s exists", hm.id)
		case !errors.Is(err, errNoConv):
			return 0, Meta{}, errorf(CodeUnavailable, "%v", err)
		}
		if e := s.checkQuotaConversations(ctx, o); e != nil {
			return 0, Meta{}, e
		}
		ok, e := s.publishHeader(ctx, st, hm, line, sum, "")
		if e != nil {
			return 0, Meta{}, e
		}
		if !ok {
			continue
		}
		s.countCreated(o)
		st.writer = mirror.WriterStore
		if err := s.saveHead(ctx, st); err != nil {
			s.log.Warn("create: head not written", zapConv(st), zapErr(err))
		}
		return st.headerSeq, s.meta(st), nil
	}
	return 0, Meta{}, errorf(CodeUnavailable, "conversation %s: JetStream did not answer; retry", hm.id)
}

// publishHeader publishes the header line of a conversation the stream does not hold
// (fork: the Pisync-Fork mark, "" for none) and reads the conversation back into st.
// ok is false when the publish may not have been stored, or lost to another one: the
// caller reads the stream again to know which.
func (s *Store) publishHeader(ctx context.Context, st *conv, hm headerMeta, line []byte, sum, fork string) (bool, *Error) {
	l := mirror.Line{Kind: mirror.KindHeader, EntryID: mirror.HeaderEntryType, EntryType: mirror.HeaderEntryType,
		Ordinal: 0, Generation: 1, SHA256: sum, Format: string(session.FormatV3), Host: s.opts.Host, Source: sourcePath(hm)}
	m := s.names.NewMsg(st.c, l, line)
	if fork != "" {
		m.Header.Set(mirror.HdrFork, fork)
	}
	if st.headerDup { // a header of a deleted conversation still in the duplicate window
		m.Header.Del(mirror.HdrMsgID)
	}
	ack, err := s.js.PublishMsg(ctx, m, expectSubjectSeq(0))
	if err != nil || ack.Duplicate {
		st.headerDup = st.headerDup || err == nil
		return false, nil // created meanwhile, or possibly stored: the stream says which
	}
	st.headerDup, st.loaded = false, false
	if err := s.load(ctx, st, nil); err != nil {
		return false, errorf(CodeUnavailable, "%v", err)
	}
	return true, nil
}

// meta is the wire metadata of st.
func (s *Store) meta(st *conv) Meta {
	writer := "daemon"
	if st.writer == mirror.WriterStore {
		writer = mirror.WriterStore
	}
	id := st.meta.id
	if id == "" {
		id = st.c.Key
	}
	p := st.source
	if st.kvHasHead && st.kvHead.Source != "" {
		p = st.kvHead.Source
	}
	return Meta{ID: id, CreatedAt: st.meta.createdAt, Cwd: st.meta.cwd, ParentSessionPath: st.meta.parentSession,
		Metadata: st.meta.metadata, Path: p, Writer: writer, Generation: st.gen, Entries: st.entries,
		Head: headPtr(st.leaf.ID()), LastSeq: st.subjSeq}
}

// Delete removes a conversation's messages and head. Blobs are shared by digest and stay.
func (s *Store) Delete(ctx context.Context, o mirror.Owner, id string) *Error {
	c, err := mirror.NewConv(o, id)
	if err != nil {
		return errorf(CodeNotFound, "conversation %q not found", id)
	}
	st := s.conv(c)
	defer st.mu.Unlock()
	if e := s.refresh(ctx, st, id); e != nil {
		return e
	}
	if err := s.bound.Stream.Purge(ctx, purgeSubject(s.names.Subject(c))); err != nil {
		return errorf(CodeUnavailable, "delete %s: %v", id, err)
	}
	if err := s.kv.Delete(ctx, c.HeadKey()); err != nil && !isKeyNotFound(err) {
		s.log.Warn("delete: head left", zapConv(st), zapErr(err))
	}
	st.loaded = false
	s.forget(c)
	return nil
}
