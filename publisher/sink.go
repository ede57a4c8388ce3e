package publisher

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

var _ watcher.Sink = (*Publisher)(nil)

// Open decides where to read a file from: the checkpointed frontier when the checkpoint
// still describes this file, else the start; in both cases after learning from the
// mirror what it already holds beyond that point.
func (p *Publisher) Open(ctx context.Context, f watcher.File, why watcher.OpenReason) (watcher.Start, error) {
	log := p.log.With(zap.String("path", f.Path))
	var lines [][]byte
	more := false
	if f.Lead != nil {
		lines, more = f.Lead.Lines, f.Lead.More
	}
	lead := session.Identify(filepath.Base(f.Path), lines, more)
	if lead.Kind == session.LeadWait || lead.Kind == session.LeadNotSession {
		if known, ok := p.knownSession(f); ok {
			// A session cut back to the records before its header, or whose beginning was
			// damaged: the damage is a generation of that session, mirrored as it is and
			// found shrunk, not a file that leaves the mirror holding the old content.
			log.Warn("a session's file no longer begins like one (cut back, or damaged); mirrored as it is, as a generation of that session",
				zap.String("conversation", known.ID), zap.String("seen_as", lead.Kind.String()), zap.String("reason", lead.Reason))
			lead = session.Lead{Kind: session.LeadHeaderless, HeaderAt: -1, Header: known}
		}
	}
	switch lead.Kind {
	case session.LeadWait:
		return watcher.Start{Wait: true}, nil
	case session.LeadNotSession:
		return p.skip(f, lead.Reason, log), nil
	case session.LeadHeaderless:
		if lead.Header.Cwd == "" {
			lead.Header.Cwd, _ = session.CwdFromDirName(filepath.Base(filepath.Dir(f.Path)))
		}
		log.Warn("session file without its header line: mirrored as it is, under the id of its name; recover writes it after a header",
			zap.String("conversation", lead.Header.ID))
	}
	hdr := lead.Header
	p.beginOpen(f)
	defer p.endOpen(f)
	if why != watcher.Discovered && why != watcher.Rechecked {
		p.m.rewrites.WithLabelValues(reasonLabel(why)).Inc()
	}
	hdrSum := sha256.Sum256(f.Header())
	hdrSHA := session.HexDigest(hdrSum)

	// Whatever the watcher saw (an atomic rename over the path can also look like a
	// new file), a file we knew at this path under another identity is replaced.
	replacedKey, replacedID, err := p.retireReplaced(ctx, f, hdr.ID)
	if err != nil {
		return watcher.Start{}, err
	}
	p.mu.Lock()
	old := p.files[f.ID]
	p.mu.Unlock()
	if id := overwrittenID(old, f, hdr.ID, replacedID); id != "" {
		log.Warn("a fresh header of another session was written over this session's file; mirrored as a new generation of its conversation",
			zap.String("conversation", id), zap.String("header_id", hdr.ID))
		hdr.ID = id
	}
	if old != nil && !old.skipped {
		// A file we already track is reopened (moved, truncated, replaced): its lines
		// still in flight finish first, so that the frontier we resume from is final.
		if err := p.waitQueueEmpty(ctx, old); err != nil {
			return watcher.Start{}, err
		}
		// The store must describe the frontier as it is now, not as of the last commit.
		old.mu.Lock()
		if old.cpDirty {
			old.cpDirty = false
			rec := old.record()
			p.recordShrink(&rec)
			p.opts.Checkpoints.Put(rec)
		}
		old.mu.Unlock()
	}

	rec, found := p.opts.Checkpoints.Get(checkpoint.Key(f.ID.Dev, f.ID.Ino))
	kc, div := p.openKey(ctx, f, why, old, hdr.ID, replacedKey, rec, found, hdrSHA, log)
	key := p.claimKey(f, hdr.ID, kc.key, log)
	conv, err := mirror.NewConv(p.opts.Owner, key)
	if err != nil {
		log.Error("conversation id cannot be mirrored", zap.String("conversation", hdr.ID), zap.Error(err))
		return p.skip(f, session.ReasonBadID, log), nil
	}
	prior := knownOf(old, rec, kc.record, key)
	switch {
	case old != nil && !old.skipped && old.conv.Key == key:
		div = old.diverged
	case kc.record && rec.ConvKey == key:
		div = divergenceOf(rec)
	}
	st := &fileState{file: withoutHeader(f), conv: conv, id: hdr.ID, cwd: hdr.Cwd, format: hdr.Format, hdrSum: hdrSum, liveFrom: f.Size,
		mtime: f.MTime, headerAt: lead.HeaderAt, diverged: div}
	if div == nil && (kc.why == keyReplaced || kc.why == keyRecorded) {
		st.diverged = p.divergenceFor(ctx, st)
	}
	start, err := p.openStart(f, why, rec, kc.record, st, log)
	if err != nil {
		return watcher.Start{}, err
	}
	// A file the checkpoint proves acknowledged costs the mirror no question, so that a
	// start costs O(changed files).
	if start.Offset == 0 || !p.provenByCheckpoint(ctx, f, why, rec, conv.Key) {
		r, err := p.resume(ctx, st, start, prior, log)
		if err == nil && r.diverged != nil {
			st, err = p.diverge(ctx, f, st, r.diverged, log)
		}
		if err != nil {
			p.m.resumeQuery.WithLabelValues("error").Inc()
			return watcher.Start{}, err
		}
		key = st.conv.Key
		if r.behind {
			start = watcher.Start{Offset: st.acked.Offset, Ordinal: st.acked.Ordinal}
		}
	}
	if st.acked.Offset == 0 {
		start = watcher.Start{}
	}
	if st.acked.StreamSeq > st.headSeq {
		// The head was not written after the lines the checkpoint (or the mirror) says
		// are acknowledged: the daemon died in between. Write it now, or it stays behind
		// (or missing) until the file grows again.
		st.headDirty = true
	}
	movedWhileAway := kc.record && (rec.Root != f.Root || rec.Rel != f.Rel)
	if (old != nil && old.file.Path != f.Path || movedWhileAway) && st.acked.StreamSeq > 0 {
		// Moved (seen, or while no daemon ran: found by its checkpoint at another path):
		// the head and the checkpoint name the old path until the file grows again, and
		// recovery writes where the head says; a restart looks for the key whose head
		// names the file's path.
		st.headDirty, st.cpDirty = true, true
	}
	// Read before the state is registered: from then on other goroutines change it under
	// its mutex (locksordering.txt).
	headDirty, gen, held := st.headDirty, st.acked.Generation, st.held.size()
	p.mu.Lock()
	if prev := p.files[f.ID]; prev != nil {
		p.drop(prev) // reopened: the old path of a move, the old key of a rewrite go
	}
	p.files[f.ID] = st
	p.byPath[f.Path] = f.ID
	p.byConv[st.conv.Key] = f.ID // claimed above, dropped again if prev had the same key
	other := p.keptClashLocked(st)
	p.mu.Unlock()
	if other != "" {
		p.m.clashes.Inc()
		log.Warn("two local files carry one conversation id; each keeps the key it had",
			zap.String("conversation", hdr.ID), zap.String("key", key), zap.String("other", other))
	}
	if headDirty {
		p.noteDirty(st)
	}
	p.trackShrink(st, rec, kc.record)
	log.Debug("tailing", zap.String("conversation", key), zap.Int("generation", gen),
		zap.Int64("offset", start.Offset), zap.Int64("ordinal", start.Ordinal), zap.Uint64("held", held))
	return start, nil
}

// openStart decides where f starts (chooseStart), reading the record's last line only
// when the decision asks for it, and gives st the record's frontier when f resumes from it.
func (p *Publisher) openStart(f watcher.File, why watcher.OpenReason, rec checkpoint.Record, record bool, st *fileState,
	log *zap.Logger) (watcher.Start, error) {
	s := startFacts{record: record, why: why, deleted: rec.Deleted, offset: rec.Offset, unsettled: rec.Unsettled,
		recMTime: rec.MTime, size: f.Size, mtime: f.MTime}
	for {
		c := chooseStart(s)
		if c.needLastLine {
			ok, err := verifyLastLine(f.Path, rec)
			if err != nil {
				return watcher.Start{}, fmt.Errorf("verify %s at offset %d: %w", f.Path, rec.Offset, err)
			}
			s.lastLine = answer("", ok)
			continue
		}
		switch c.why {
		case startUnsettled:
			log.Info("the daemon stopped before a change of this file was checked; comparing it with the mirror")
		case startWrittenSince:
			log.Info("file written since its checkpoint; comparing it with the mirror")
		case startChanged:
			p.m.rewrites.WithLabelValues("changed").Inc()
			log.Info("file changed under its checkpoint; comparing it with the mirror")
		case startCheckpoint:
			st.acked = frontierOf(rec)
			st.headSeq, st.recordedHeadSeq = rec.HeadSeq, rec.HeadSeq
			st.leaf.Set(rec.Leaf)
			return watcher.Start{Offset: rec.Offset, Ordinal: rec.Ordinal}, nil
		}
		return watcher.Start{}, nil
	}
}

// knownSession is what the publisher knows of the session f was mirrored as: its state
// (this identity, or the file it replaced at this path), or its checkpoint record. false
// for a file never mirrored.
func (p *Publisher) knownSession(f watcher.File) (session.Header, bool) {
	p.mu.Lock()
	st := p.files[f.ID]
	if st == nil || st.skipped {
		st = p.files[p.byPath[f.Path]]
	}
	p.mu.Unlock()
	if st != nil && !st.skipped {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.file.Path == f.Path && st.id != "" {
			return session.Header{ID: st.id, Cwd: st.cwd, Format: st.format, Version: 3}, true
		}
		return session.Header{}, false
	}
	rec, found := p.opts.Checkpoints.Get(checkpoint.Key(f.ID.Dev, f.ID.Ino))
	if found && rec.Root == f.Root && rec.Rel == f.Rel && rec.Conversation != "" {
		return session.Header{ID: rec.Conversation, Cwd: rec.Cwd, Format: session.Format(rec.Format), Version: 3}, true
	}
	return session.Header{}, false
}

// skip records f as a .jsonl that is no session (reason: a session.Reason*), counted
// and logged once, listed by Skipped.
func (p *Publisher) skip(f watcher.File, reason string, log *zap.Logger) watcher.Start {
	p.mu.Lock()
	st, seen := p.files[f.ID]
	if !seen || !st.skipped {
		st = &fileState{file: withoutHeader(f), skipped: true}
		p.files[f.ID] = st
	}
	known := p.skipped[f.ID] == reason
	p.skipped[f.ID] = reason
	p.mu.Unlock()
	if !known {
		p.m.notSession.WithLabelValues(reason).Inc()
		log.Warn("skipping a .jsonl that is not a Pi session in any form", zap.Int("line", 1), zap.String("reason", reason))
	}
	return watcher.Start{Skip: true}
}

// SkippedFile is a .jsonl under a root that is not a session in any form.
type SkippedFile struct {
	Path   string `json:"path"`
	Reason string `json:"reason"` // session.ReasonNotJSON, ReasonNotEntries, ReasonNoID, ReasonBadID
}

// Skipped lists the files skipped as no session, by path.
func (p *Publisher) Skipped() []SkippedFile {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := []SkippedFile{}
	for id, reason := range p.skipped {
		if st := p.files[id]; st != nil && st.skipped {
			out = append(out, SkippedFile{Path: st.file.Path, Reason: reason})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// withoutHeader is f as a fileState keeps it: the header bytes are read once, by Open.
func withoutHeader(f watcher.File) watcher.File {
	f.Lead = nil
	return f
}

func reasonLabel(why watcher.OpenReason) string {
	switch why {
	case watcher.Moved:
		return "moved"
	case watcher.Truncated:
		return "truncated"
	case watcher.Replaced:
		return "replaced"
	}
	return "changed"
}

// Torn records a held torn tail (reported, never published half).
func (p *Publisher) Torn(f watcher.File, offset, n int64) {
	if st := p.state(f.ID); st != nil {
		st.mu.Lock()
		st.torn = n
		st.mu.Unlock()
	}
	if n > 0 {
		p.log.Debug("torn tail held", zap.String("path", f.Path), zap.Int64("offset", offset), zap.Int64("bytes", n))
	}
}

// Gone marks a file deleted locally: its mirror copy stays, its state says so.
func (p *Publisher) Gone(f watcher.File) {
	st := p.state(f.ID)
	if st == nil || st.file.Path != f.Path {
		return // unknown, or the inode number now belongs to another file
	}
	if st.skipped { // not a session: nothing to record
		p.mu.Lock()
		p.drop(st)
		p.mu.Unlock()
		return
	}
	st.mu.Lock()
	st.gone = true
	st.torn = 0
	st.cpDirty, st.headDirty = true, true
	st.mu.Unlock()
	p.mu.Lock()
	p.goneFiles[st] = struct{}{}
	p.mu.Unlock()
	p.noteDirty(st)
	p.log.Info("session file removed; its mirror copy stays", zap.String("path", f.Path))
}

func (p *Publisher) state(id watcher.FileID) *fileState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.files[id]
}

// waitQueueEmpty waits until every line of st read so far is resolved.
func (p *Publisher) waitQueueEmpty(ctx context.Context, st *fileState) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		st.mu.Lock()
		n := len(st.queue)
		st.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.closing:
			return errors.New("publisher closing")
		case <-t.C:
		}
	}
}
