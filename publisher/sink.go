package publisher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/checkpoint"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/session"
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
	hdrSHA := hex.EncodeToString(hdrSum[:])

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
	kc := p.openKey(ctx, f, why, old, hdr.ID, replacedKey, rec, found, hdrSHA, log)
	key := p.claimKey(f, hdr.ID, kc.key, log)
	conv, err := mirror.NewConv(p.opts.Owner, key)
	if err != nil {
		log.Error("conversation id cannot be mirrored", zap.String("conversation", hdr.ID), zap.Error(err))
		return p.skip(f, session.ReasonBadID, log), nil
	}
	st := &fileState{file: withoutHeader(f), conv: conv, id: hdr.ID, cwd: hdr.Cwd, format: hdr.Format, hdrSum: hdrSum, liveFrom: f.Size,
		mtime: f.MTime, headerAt: lead.HeaderAt}
	start, err := p.openStart(f, why, rec, kc.record, st, log)
	if err != nil {
		return watcher.Start{}, err
	}
	// A file the checkpoint proves acknowledged costs the mirror no question, so that a
	// start costs O(changed files).
	if start.Offset == 0 || !p.provenByCheckpoint(ctx, f, why, rec, conv.Key) {
		if err := p.resume(ctx, st, start, log); err != nil {
			p.m.resumeQuery.WithLabelValues("error").Inc()
			return watcher.Start{}, err
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
	if st.headDirty {
		p.noteDirty(st)
	}
	p.trackShrink(st, rec, kc.record)
	log.Debug("tailing", zap.String("conversation", key), zap.Int("generation", st.acked.Generation),
		zap.Int64("offset", start.Offset), zap.Int64("ordinal", start.Ordinal), zap.Uint64("held", st.held.size()))
	return start, nil
}

// openKey picks the key f mirrors under (chooseKey), before its claim: it gathers the
// facts, looks up the costly ones only when the decision asks for them, and acts on the
// choice (a log line, the report of a clash still there).
func (p *Publisher) openKey(ctx context.Context, f watcher.File, why watcher.OpenReason, old *fileState, id, replacedKey string,
	rec checkpoint.Record, found bool, hdrSHA string, log *zap.Logger) keyChoice {
	k := keyFacts{id: id, reopened: reopenedKey(old, f, why, id), replaced: replacedKey, known: old != nil && !old.skipped,
		record: found, recordHeader: rec.HeaderSHA == hdrSHA, recordHere: rec.Root == f.Root && rec.Rel == f.Rel,
		recordKey: rec.ConvKey}
	logged := false
	for {
		c := chooseKey(k)
		if c.reusedHere && !logged {
			logged = true
			log.Info("the checkpoint of this file's inode names another path, and the file replaced one of its session here; comparing it with the mirror",
				zap.String("checkpoint_path", rec.Rel))
		}
		switch c.need {
		case needReplacedHere:
			k.replacedHere = answer("", p.replacedAtPath(f, id))
			continue
		case needRecorded:
			k.recorded = answer(p.recordedClashKey(f, id))
			continue
		case needPrevious:
			k.previous = answer(p.previousClashKey(ctx, f, id))
			continue
		}
		if c.why == keyPrevious {
			p.mu.Lock()
			p.clashesSeen[id] = true
			p.mu.Unlock()
			p.m.clashes.Inc()
			log.Warn("two local files carry one conversation id; mirroring this one under the key it had",
				zap.String("conversation", id), zap.String("key", c.key))
		}
		return c
	}
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

// claimKey returns the key this file mirrors under: the conversation id, unless another
// local file already carries it (a copied session), in which case a key derived from this
// file's path (contestedKey), so that neither overwrites the other (chooseClaim decides).
//
// A claim stays live from the moment its file claims it, through the rest of its Open
// (resume can take a while, and its state is registered only at the end), for as long
// as its state carries the key. Files with one id found in the same scan are opened by
// several workers at once: a claim whose state is not registered yet is not stale, or
// both files would mirror under one key. The file system is consulted (vanished) without
// the global lock, and the claim decided again if it changed meanwhile.
func (p *Publisher) claimKey(f watcher.File, id, key string, log *zap.Logger) string {
	for {
		p.mu.Lock()
		owner, taken := p.byConv[key]
		c := claimFacts{taken: taken, self: owner == f.ID, openingIt: p.opening[owner] > 0 && p.openingKeys[owner] == key}
		other := p.files[owner]
		var otherFile watcher.File
		if taken && !c.self && !c.openingIt && other != nil {
			other.mu.Lock()
			c.stateHolds = other.conv.Key == key && !other.gone && !other.skipped
			otherFile = other.file
			other.mu.Unlock()
		}
		choice := chooseClaim(c)
		if choice.needVanished {
			p.mu.Unlock()
			gone := vanished(otherFile)
			p.mu.Lock()
			if p.byConv[key] != owner || p.files[owner] != other {
				p.mu.Unlock()
				continue // changed while we looked: decide again
			}
			c.vanished = answer("", gone)
			choice = chooseClaim(c)
		}
		if choice.take {
			p.claimLocked(f, key)
			p.mu.Unlock()
			return key
		}
		alt := contestedKey(id, key, f)
		p.claimLocked(f, alt)
		p.clashesSeen[id] = true
		p.mu.Unlock()
		p.m.clashes.Inc()
		otherPath := otherFile.Path
		if otherPath == "" {
			otherPath = p.openingPath(owner)
		}
		log.Warn("two local files carry one conversation id; mirroring this one under its own key",
			zap.String("conversation", key), zap.String("key", alt), zap.String("other", otherPath))
		return alt
	}
}

// reopenedKey is the key of old, the state of f's identity, when f is that same file
// reopened (moved, rewritten in place): it keeps its key. An identity whose file was
// deleted, or that another file now holds at another path (inode numbers are reused at
// once), is not the same file.
func reopenedKey(old *fileState, f watcher.File, why watcher.OpenReason, id string) string {
	if old == nil || old.skipped {
		return ""
	}
	old.mu.Lock()
	defer old.mu.Unlock()
	if old.id != id || old.gone || (old.file.Path != f.Path && why != watcher.Moved) {
		return ""
	}
	return old.conv.Key
}

// overwrittenID is the conversation id f keeps when a header of another id was written
// over it in place (old: its state) or by a rename (replacedID: the id of the file it
// replaced, from retireReplaced), "" otherwise (see sameSession).
func overwrittenID(old *fileState, f watcher.File, id, replacedID string) string {
	if replacedID != "" && replacedID != id {
		return replacedID
	}
	if old == nil || old.skipped {
		return ""
	}
	old.mu.Lock()
	defer old.mu.Unlock()
	if old.id != id && old.file.Path == f.Path && sameSession(old, f, id) {
		return old.id
	}
	return ""
}

// sameSession reports whether f, now carrying header id, is still the session old was
// mirrored as: the same id, or a fresh header of another id written over a file whose
// name still names old's (Pi's SessionManager.open on a file it cannot parse, oh-my-pi's
// resume on a corrupt header): a new generation of old's conversation, which lacks its
// entries, rather than a new conversation that hides the loss.
func sameSession(old *fileState, f watcher.File, id string) bool {
	if old.id == id {
		return true
	}
	named, _, ok := session.ParseFileName(filepath.Base(f.Path))
	return ok && named == old.id && filepath.Base(old.file.Path) == filepath.Base(f.Path)
}

// keptClashLocked registers st's clash key, if it has one, and returns the path of
// another registered file that carries st's conversation id when this process has not
// reported that id's clash yet (then it counts as reported). After a restart both files
// of a clash get their keys back from their checkpoints, and no claim is contested: the
// clash is still reported, once per process (torture T8). The caller holds p.mu.
func (p *Publisher) keptClashLocked(st *fileState) string {
	id := st.id
	if st.conv.Key != id {
		p.clashKeyed[id]++
	}
	if p.clashesSeen[id] {
		return ""
	}
	other := ""
	if owner, ok := p.byConv[id]; ok && owner != st.file.ID {
		if o := p.files[owner]; o != nil {
			other = o.file.Path
		}
	}
	if other == "" && p.clashKeyed[id] > 0 && (st.conv.Key == id || p.clashKeyed[id] > 1) {
		for _, o := range p.files { // rare: only ids with clash keys get here
			if o != st && o.id == id && o.conv.Key != id && !o.skipped {
				other = o.file.Path
				break
			}
		}
	}
	if other != "" {
		p.clashesSeen[id] = true
	}
	return other
}

// unkeyed undoes keptClashLocked's count when st's state goes. The caller holds p.mu.
func (p *Publisher) unkeyed(st *fileState) {
	if st.conv.Key != st.id && st.id != "" {
		if p.clashKeyed[st.id]--; p.clashKeyed[st.id] <= 0 {
			delete(p.clashKeyed, st.id)
		}
	}
}

// clashKey is the key a file mirrors under when another local file carries its
// conversation id: derived from its path, so that it is the same at every start.
func clashKey(key string, f watcher.File) string {
	sum := sha256.Sum256([]byte(f.Root + "\x00" + f.Rel))
	return key + "~" + hex.EncodeToString(sum[:4])
}

// previousClashKey tells, for a file opened without a checkpoint (the state directory
// was lost), whether it was mirrored under its clash key before: the head of that key
// names this host and this file. Which of two copies claims the plain id first then
// does not decide their keys again (the other order would mirror both files under new
// keys, and leave two heads naming one path). It costs one head read per file opened
// without a checkpoint, next to the scan of its conversation that such an open makes.
func (p *Publisher) previousClashKey(ctx context.Context, f watcher.File, key string) (string, bool) {
	alt := clashKey(key, f)
	conv, err := mirror.NewConv(p.opts.Owner, alt)
	if err != nil {
		return "", false
	}
	h, _, err := p.reader.Head(ctx, conv)
	switch {
	case errors.Is(err, mirror.ErrNotFound):
		if p.mirroredWithoutHead(ctx, conv, f) {
			return alt, true
		}
	case err == nil && p.headNames(h, f):
		return alt, true
	}
	// The file may have moved since it got its clash key (torture T15).
	return p.movedClashKey(ctx, f, key, alt)
}

// headNames tells whether h places its conversation at f: this host, f's root and path.
func (p *Publisher) headNames(h mirror.Head, f watcher.File) bool {
	return h.Host == p.opts.Host && h.Root == f.Root && h.Source == f.Rel
}

// mirroredWithoutHead tells whether conversation c, which has no head, holds lines this
// host mirrored from a file at f's path: a daemon killed after it gave f its clash key
// and before its first head flush, then started without its state directory, must give
// f that key again, or f takes another and two keys hold its lines (torture T3, seed
// 410889947860). The key is derived from f's root and path, so a line of this host from
// f's relative path is the evidence. It asks the mirror only when the owner's view counts
// messages under the key (rare: most files opened without a checkpoint have no clash
// key), then reads one message's headers.
func (p *Publisher) mirroredWithoutHead(ctx context.Context, c mirror.Conv, f watcher.File) bool {
	counts, _, ok := p.view.get(ctx, p)
	if !ok || counts[c.Key] == 0 {
		return false
	}
	errFound := errors.New("found")
	var first mirror.Line
	err := p.reader.Scan(ctx, c, mirror.ScanOptions{HeadersOnly: true}, func(m mirror.Msg) error {
		first = m.Line
		return errFound
	})
	return errors.Is(err, errFound) && first.Host == p.opts.Host && first.Source == f.Rel
}

// claimLocked gives key to f; an Open in progress of f keeps it until it ends. The caller
// holds p.mu.
func (p *Publisher) claimLocked(f watcher.File, key string) {
	p.byConv[key] = f.ID
	if p.opening[f.ID] > 0 {
		p.openingKeys[f.ID] = key
	}
}

// beginOpen marks f as being opened: a conversation key it claims stays its own until
// endOpen, although its state is registered only at the end of Open.
func (p *Publisher) beginOpen(f watcher.File) {
	p.mu.Lock()
	p.opening[f.ID]++
	p.openingAt[f.ID] = withoutHeader(f)
	p.mu.Unlock()
}

func (p *Publisher) endOpen(f watcher.File) {
	p.mu.Lock()
	if p.opening[f.ID]--; p.opening[f.ID] <= 0 {
		delete(p.opening, f.ID)
		delete(p.openingAt, f.ID)
		delete(p.openingKeys, f.ID)
	}
	p.mu.Unlock()
}

// openingPath is the path of a file being opened, for log lines.
func (p *Publisher) openingPath(id watcher.FileID) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.openingAt[id].Path
}

// retireReplaced forgets the file that used to be at f's path under another identity
// (an atomic rename replaced it), once its lines in flight are resolved, so that its
// conversation key passes to the new file instead of looking like a copy. When that file
// carried conversation id (the replacement of a session by a rewrite of it), it returns
// the key it mirrored under: the new file keeps it.
func (p *Publisher) retireReplaced(ctx context.Context, f watcher.File, id string) (key, oldID string, err error) {
	p.mu.Lock()
	fid, known := p.byPath[f.Path]
	old := p.files[fid]
	p.mu.Unlock()
	if !known || fid == f.ID || old == nil || old.file.Root != f.Root || old.file.Rel != f.Rel {
		return "", "", nil
	}
	if err := p.waitQueueEmpty(ctx, old); err != nil {
		return "", "", err
	}
	if !old.skipped && sameSession(old, f, id) {
		key, oldID = old.conv.Key, old.id
	}
	p.mu.Lock()
	delete(p.files, old.file.ID)
	p.unkeyed(old)
	if p.byConv[old.conv.Key] == old.file.ID {
		delete(p.byConv, old.conv.Key)
	}
	p.mu.Unlock()
	p.opts.Checkpoints.Delete(checkpoint.Key(old.file.ID.Dev, old.file.ID.Ino))
	return key, oldID, nil
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

// vanished reports whether f is no longer at its path (the watcher reports Gone only
// after a grace period, in case the file was moved).
func vanished(f watcher.File) bool {
	fi, err := os.Stat(f.Path)
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	id := watcher.FileIDOf(fi)
	return id != (watcher.FileID{}) && id != f.ID
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
