package publisher

import (
	"context"
	"sync"

	"go.uber.org/zap"

	"github.com/pisync/pisync/checkpoint"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// recordedClashKeys are the clash keys of the checkpoint records found at start, by the
// path of their file: a path keeps its key when its file is replaced (one path, one key).
//
// A replacement the daemon sees keeps the replaced file's key (retireReplaced). One it
// does not see (made while the daemon was stopped, or before the new file's checkpoint
// was committed when the daemon was killed) is opened without a checkpoint of its own,
// while the record of the file it replaced, under the old identity, still names the
// path. The key derived from the path (previousClashKey) is not that key when the file
// moved after it got it, and the plain id may be another file's: the replacement took a
// new key, and two keys named the path (torture T3). Only clash keys are kept here: a
// file that mirrored under the plain id gets it back from claimKey whenever it is free.
type recordedClashKeys struct {
	once   sync.Once
	byPath map[string]checkpoint.Record // root + "\x00" + rel → the record holding a clash key there
}

// recordedClashKey returns the clash key of conversation id that a checkpoint record of
// another identity holds for f's path, if any; that record is removed (the path is f's
// now) unless its identity is open. The records are read once, at the first file opened
// without a checkpoint: a local pass, no question to the mirror.
func (p *Publisher) recordedClashKey(f watcher.File, id string) (string, bool) {
	p.pathKeys.once.Do(func() {
		byPath := map[string]checkpoint.Record{}
		err := p.opts.Checkpoints.Each(func(r checkpoint.Record) error {
			if r.ConvKey != "" && r.ConvKey != r.Conversation && !r.Deleted {
				byPath[r.Root+"\x00"+r.Rel] = r
			}
			return nil
		})
		if err != nil {
			p.log.Warn("cannot read the checkpoints for the keys of replaced files", zap.Error(err))
		}
		p.pathKeys.byPath = byPath
	})
	p.mu.Lock()
	rec, ok := p.pathKeys.byPath[f.Root+"\x00"+f.Rel]
	if ok {
		delete(p.pathKeys.byPath, f.Root+"\x00"+f.Rel)
	}
	old := watcher.FileID{Dev: rec.Dev, Ino: rec.Ino}
	_, open := p.files[old]
	open = open || p.opening[old] > 0
	p.mu.Unlock()
	if !ok || rec.Conversation != id || old == f.ID {
		return "", false
	}
	if !open {
		p.opts.Checkpoints.Delete(rec.Key())
	}
	return rec.ConvKey, true
}

// movedClashKey returns the clash key of conversation id (other than derived, the key
// derived from f's path) whose head names f, for a file opened without a checkpoint. A
// clash key is derived from the path the file had when it got it; the file keeps it
// when it moves, and its head follows it. After the state directory is lost the key
// derived from the new path is not that key: the moved file took the plain id when
// found before the file that owns it, started a new generation over that file's
// conversation, and the owner then took a new clash key (torture T15). The candidates
// are the id's clash keys with messages in the owner's view (the one request
// mirroredWithoutHead also makes), one head read each: only ids with clash keys pay.
func (p *Publisher) movedClashKey(ctx context.Context, f watcher.File, id, derived string) (string, bool) {
	for _, k := range p.view.clashKeysOf(ctx, p, id) {
		if k == derived {
			continue
		}
		conv, err := mirror.NewConv(p.opts.Owner, k)
		if err != nil {
			continue
		}
		if h, _, err := p.reader.Head(ctx, conv); err == nil && p.headNames(h, f) {
			return k, true
		}
	}
	return "", false
}

// clashKeyID is the conversation id of clash key k (see clashKey), if k is one.
func clashKeyID(k string) (string, bool) {
	i := len(k) - 9
	if i <= 0 || k[i] != '~' {
		return "", false
	}
	for _, c := range k[i+1:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", false
		}
	}
	return k[:i], true
}
