package publisher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// The conversation key a file mirrors under: the id of its header, or the key the file
// had (reopened, replaced, recorded, found again in the mirror), claimed against the
// other local files that carry the same id (chooseKey, chooseClaim decide; this file
// gathers what they need and keeps the claims).

// openKey picks the key f mirrors under (chooseKey), before its claim: it gathers the
// facts, looks up the costly ones only when the decision asks for them, and acts on the
// choice (a log line, the report of a clash still there).
//
// It also returns the divergence the head of a key found in the mirror records (keyDiverged).
func (p *Publisher) openKey(ctx context.Context, f watcher.File, why watcher.OpenReason, old *fileState, id, replacedKey string,
	rec checkpoint.Record, found bool, hdrSHA string, log *zap.Logger) (keyChoice, *mirror.Divergence) {
	k := keyFacts{id: id, reopened: reopenedKey(old, f, why, id), replaced: replacedKey, known: old != nil && !old.skipped,
		record: found, recordHeader: rec.HeaderSHA == hdrSHA, recordHere: rec.Root == f.Root && rec.Rel == f.Rel,
		recordKey: rec.ConvKey}
	var div *mirror.Divergence
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
			key, d, ok := p.previousClashKey(ctx, f, id)
			k.previous, k.previousDiverged, div = answer(key, ok), d != nil, d
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
		if c.why != keyDiverged {
			div = nil
		}
		return c, div
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
// clash is still reported (DESIGN §3.9), once per process. The caller holds p.mu.
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
	return derivedKey(key, f.Root+"\x00"+f.Rel)
}

// divergedKey is the key this host's copy of conversation key mirrors under once another
// host continued key past the lines they share (failover.go): derived like a clash key,
// from the host too, so that two hosts whose copies have one path get two keys, and the
// same at every start.
func divergedKey(key, host string, f watcher.File) string {
	return derivedKey(key, host+"\x00"+f.Root+"\x00"+f.Rel)
}

// derivedKey is key~<8 hex digits of place's digest>, which clashKeyID parses back.
func derivedKey(key, place string) string {
	sum := sha256.Sum256([]byte(place))
	return key + "~" + hex.EncodeToString(sum[:4])
}

// previousClashKey tells, for a file opened without a checkpoint (the state directory
// was lost), whether it was mirrored under its clash key before: the head of that key
// names this host and this file. Which of two copies claims the plain id first then
// does not decide their keys again (the other order would mirror both files under new
// keys, and leave two heads naming one path). It costs one head read per file opened
// without a checkpoint, next to the scan of its conversation that such an open makes.
//
// The key of the file's copy of a conversation another host continued (failover.go) is
// found the same way, among the id's derived keys, its head naming the file: it comes
// back with the divergence its head records.
func (p *Publisher) previousClashKey(ctx context.Context, f watcher.File, key string) (string, *mirror.Divergence, bool) {
	alt := clashKey(key, f)
	conv, err := mirror.NewConv(p.opts.Owner, alt)
	if err != nil {
		return "", nil, false
	}
	h, _, err := p.reader.Head(ctx, conv)
	switch {
	case errors.Is(err, mirror.ErrNotFound):
		if p.mirroredWithoutHead(ctx, conv, f) {
			return alt, nil, true
		}
	case err == nil && p.headNames(h, f):
		return alt, nil, true
	}
	// The file may have moved since it got its clash key: the key derived from its path
	// is then another.
	return p.movedClashKey(ctx, f, key, alt)
}

// headNames tells whether h places its conversation at f: this host, f's root and path.
func (p *Publisher) headNames(h mirror.Head, f watcher.File) bool {
	return h.Host == p.opts.Host && h.Root == f.Root && h.Source == f.Rel
}

// mirroredWithoutHead tells whether conversation c, which has no head, holds lines this
// host mirrored from a file at f's path: a daemon killed after it gave f its clash key
// and before its first head flush, then started without its state directory, must give f
// that key again, or f takes another and two keys hold its lines (and recover finds two
// conversations for one path). The key is derived from f's root and path, so a line of
// this host from f's relative path is the evidence. It asks the mirror only when the
// owner's view counts messages under the key (rare: most files opened without a
// checkpoint have no clash key), then reads one message's headers.
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
	old := p.replacedAt(f)
	if old == nil {
		return "", "", nil
	}
	return p.retire(ctx, old, f, id)
}

// replacedAt is the state of the file that was at f's path under another identity, or nil.
func (p *Publisher) replacedAt(f watcher.File) *fileState {
	p.mu.Lock()
	defer p.mu.Unlock()
	fid, known := p.byPath[f.Path]
	old := p.files[fid]
	if !known || fid == f.ID || old == nil || old.file.Root != f.Root || old.file.Rel != f.Rel {
		return nil
	}
	return old
}

// retire is retireReplaced once the replaced state is found. Waiting for its lines in
// flight can take a while (a large file being back-filled), and meanwhile the inode
// number the rename freed can be handed to a new file elsewhere, whose Open registers
// it under that number: only old itself is dropped, and its checkpoint record only if
// no other file has taken the number.
func (p *Publisher) retire(ctx context.Context, old *fileState, f watcher.File, id string) (key, oldID string, err error) {
	if err := p.waitQueueEmpty(ctx, old); err != nil {
		return "", "", err
	}
	if !old.skipped && sameSession(old, f, id) {
		key, oldID = old.conv.Key, old.id
	}
	p.mu.Lock()
	current := p.files[old.file.ID] == old
	p.drop(old)
	p.mu.Unlock()
	if current {
		p.opts.Checkpoints.Delete(checkpoint.Key(old.file.ID.Dev, old.file.ID.Ino))
	}
	return key, oldID, nil
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
