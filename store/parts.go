package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// Parts of a large entry's upload are objects of the blob store, named after the owner,
// the entry's digest and the offset, until the append that uses them deletes them. A
// client that gives up midway leaves them behind: they expire (PartTTL), and the bytes
// an owner has waiting in parts are bounded (MaxPartBytes), both by what each replica
// records of the parts it stored.

// partName is the object name of one uploaded part of a large entry.
func partName(o mirror.Owner, sha string, offset int64) string {
	return o.ObjectName(sha) + partInfix + strconv.FormatInt(offset, 10)
}

// partInfix is in the name of every part object, and of no blob (named by digest alone).
const partInfix = ".part."

// Part stores one part of a large entry's upload.
func (s *Store) Part(ctx context.Context, o mirror.Owner, id string, p partReq) (int64, *Error) {
	switch {
	case !shaPattern.MatchString(p.SHA256):
		return 0, errorf(CodeInvalid, "part: sha256 %q is not 64 lower-case hex digits", p.SHA256)
	case p.Size > s.opts.MaxEntryBytes:
		return 0, tooLarge(ReasonEntry, "entry bytes", int64(p.Size), s.opts.MaxEntryBytes)
	case p.Offset < 0 || len(p.Data) == 0 || len(p.Data) > PartSize || p.Offset+int64(len(p.Data)) > p.Size:
		return 0, errorf(CodeInvalid, "part at %d of %d bytes does not fit an entry of %d bytes (parts hold 1 to %d bytes)", p.Offset, len(p.Data), p.Size, PartSize)
	}
	if e := s.exists(ctx, o, id); e != nil {
		return 0, e
	}
	name := partName(o, p.SHA256, p.Offset)
	if e := s.parts.reserve(o, name, int64(len(p.Data)), s.opts.MaxPartBytes); e != nil {
		s.m.quota.WithLabelValues(ReasonParts).Inc()
		return 0, e
	}
	if _, err := s.obj.Put(ctx, jetstream.ObjectMeta{Name: name}, bytes.NewReader(p.Data)); err != nil {
		s.parts.drop(name)
		return 0, errorf(CodeUnavailable, "store part: %v", err)
	}
	return p.Offset + int64(len(p.Data)), nil
}

// assemble reads back the parts of an upload (or the blob itself, when a retried append
// finds it stored and its parts removed) and checks size and digest.
func (s *Store) assemble(ctx context.Context, o mirror.Owner, ref blobRef) ([]byte, []string, *Error) {
	if !shaPattern.MatchString(ref.SHA256) || ref.Size <= 0 {
		return nil, nil, errorf(CodeInvalid, "blob: sha256 %q, size %d", ref.SHA256, ref.Size)
	}
	if ref.Size > s.opts.MaxEntryBytes {
		return nil, nil, tooLarge(ReasonEntry, "entry bytes", int64(ref.Size), s.opts.MaxEntryBytes)
	}
	buf := make([]byte, 0, ref.Size)
	var names []string
	for int64(len(buf)) < ref.Size {
		name := partName(o, ref.SHA256, int64(len(buf)))
		b, err := s.obj.GetBytes(ctx, name)
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			// The entry may be stored: its append deletes the parts, perhaps while this
			// retry of it reads them.
			if whole, e := s.storedBlob(ctx, o, ref.SHA256); e == nil && int64(len(whole)) == ref.Size {
				return whole, nil, nil
			}
			return nil, nil, errorf(CodeNotFound, "part at %d of %s not uploaded", len(buf), ref.SHA256)
		}
		if err != nil || len(b) == 0 {
			return nil, nil, errorf(CodeUnavailable, "read part %s: %v", name, err)
		}
		buf = append(buf, b...)
		names = append(names, name)
	}
	if int64(len(buf)) != ref.Size || session.Digest(buf) != ref.SHA256 {
		return nil, nil, errorf(CodeInvalid, "the parts of %s are %d bytes with another digest", ref.SHA256, len(buf))
	}
	return buf, names, nil
}

func (s *Store) storedBlob(ctx context.Context, o mirror.Owner, sha string) ([]byte, error) {
	r, err := s.handles(o).reader.Blob(ctx, sha)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, s.opts.MaxEntryBytes+1))
}

// AppendBlob appends an entry uploaded in parts.
func (s *Store) AppendBlob(ctx context.Context, o mirror.Owner, id, expected string, ref blobRef) (AppendReply, *Error) {
	if e := s.exists(ctx, o, id); e != nil {
		return AppendReply{}, e
	}
	line, parts, e := s.assemble(ctx, o, ref)
	if e != nil && e.Code == CodeNotFound {
		// Parts gone and no blob: an entry stored in the stream itself (below the blob
		// threshold) by an earlier attempt of this append deleted them.
		if rep, ok := s.storedEntry(ctx, o, id, ref.SHA256); ok {
			return rep, nil
		}
	}
	if e != nil {
		return AppendReply{}, e
	}
	rep, e := s.Append(ctx, o, id, expected, line)
	if e == nil {
		for _, name := range parts {
			s.parts.drop(name)
			_ = s.obj.Delete(ctx, name) // the entry is stored; a part left over expires
		}
	}
	return rep, e
}

// storedEntry is the duplicate reply of an entry of conversation id with digest sha, if
// the conversation holds one.
func (s *Store) storedEntry(ctx context.Context, o mirror.Owner, id, sha string) (AppendReply, bool) {
	c, err := mirror.NewConv(o, id)
	if err != nil {
		return AppendReply{}, false
	}
	st := s.conv(c)
	defer st.mu.Unlock()
	if e := s.refresh(ctx, st, id); e != nil || st.incomplete() {
		return AppendReply{}, false
	}
	for _, ref := range st.ids {
		if ref.sha == sha {
			return AppendReply{OK: true, Seq: ref.seq, Ordinal: ref.ordinal, Head: headPtr(ref.head), Duplicate: true}, true
		}
	}
	return AppendReply{}, false
}

// partLedger is what one replica knows of the parts it stored and that no append has
// used yet, by owner: what the parts quota counts. Replicas do not share it: an owner
// spreading uploads over n replicas may have n times the quota waiting.
type partLedger struct {
	mu     sync.Mutex
	parts  map[string]ledgerPart // object name → part
	owners map[string]int64      // owner's key prefix → bytes waiting
}

type ledgerPart struct {
	owner string
	size  int64
	at    time.Time
}

func newPartLedger() *partLedger {
	return &partLedger{parts: map[string]ledgerPart{}, owners: map[string]int64{}}
}

// reserve counts a part of o's against limit (bytes, 0: none), or refuses it.
func (l *partLedger) reserve(o mirror.Owner, name string, size, limit int64) *Error {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := o.KeyPrefix()
	waiting := l.owners[key]
	if old, ok := l.parts[name]; ok { // the same part sent again replaces itself
		waiting -= old.size
	}
	if limit > 0 && waiting+size > limit {
		return tooLarge(ReasonParts, "bytes of uploaded parts waiting for their append", waiting+size, limit)
	}
	l.dropLocked(name)
	l.parts[name] = ledgerPart{owner: key, size: size, at: time.Now()}
	l.owners[key] += size
	return nil
}

func (l *partLedger) drop(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropLocked(name)
}

func (l *partLedger) dropLocked(name string) {
	p, ok := l.parts[name]
	if !ok {
		return
	}
	delete(l.parts, name)
	if l.owners[p.owner] -= p.size; l.owners[p.owner] <= 0 {
		delete(l.owners, p.owner)
	}
}

// olderThan names the parts stored before t.
func (l *partLedger) olderThan(t time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var names []string
	for name, p := range l.parts {
		if p.at.Before(t) {
			names = append(names, name)
		}
	}
	return names
}

// bytes is what the ledger holds, for the gauge.
func (l *partLedger) bytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := int64(0)
	for _, b := range l.owners {
		n += b
	}
	return n
}

// expireParts deletes the parts this replica stored before now − PartTTL that no append
// used. Only its own: listing the blob store would need a permission on every tenant's
// object names (deploy/nats), which a store user must not have. Parts of a replica
// killed mid-upload are therefore left until the owner uploads that entry again.
func (s *Store) expireParts(ctx context.Context) {
	for _, name := range s.parts.olderThan(time.Now().Add(-s.opts.PartTTL)) {
		if err := s.obj.Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			s.log.Warn("expire parts: delete", zap.String("object", name), zap.Error(err))
			continue
		}
		s.parts.drop(name)
		s.m.partsExpired.Inc()
	}
	s.m.partBytes.Set(float64(s.parts.bytes()))
}

// sweepParts runs expireParts every PartSweep until ctx ends.
func (s *Store) sweepParts(ctx context.Context) {
	t := time.NewTicker(s.opts.PartSweep)
	defer t.Stop()
	for {
		s.expireParts(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
