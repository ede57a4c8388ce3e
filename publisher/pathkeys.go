package publisher

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// recordedClashKeys are the clash keys of the checkpoint records found at start, by the
// path of their file: a path keeps its key when its file is replaced (one path, one key).
//
// A replacement the daemon sees keeps the replaced file's key (retireReplaced). One it
// does not see (made while the daemon was stopped, or before the new file's checkpoint
// was committed when the daemon was killed) is opened without a checkpoint of its own,
// while the record of the file it replaced, under the old identity, still names the path.
// The key derived from the path (previousClashKey) is not that key when the file moved
// after it got it, and the plain id may be another file's: the replacement took a new
// key, and two keys would name the path. Only clash keys are kept here: a file that
// mirrored under the plain id gets it back from claimKey whenever it is free.
type recordedClashKeys struct {
	once   sync.Once
	byPath map[string]checkpoint.Record // root + "\x00" + rel → the record holding a clash key there

	// Every record (any key) by path, read once at the first file whose checkpoint names
	// another path (replacedAtPath); read-only once built.
	allOnce sync.Once
	all     map[string][]pathRecord
}

// pathRecord is the identity and conversation id of a checkpoint record naming a path.
type pathRecord struct {
	id   watcher.FileID
	conv string
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

// replacedAtPath tells whether a checkpoint record of another identity than f's, carrying
// conversation id, names f's path: f replaced a file of its session the daemon knew
// there. For a file whose checkpoint (found by its inode number, line 1 the same) names
// another path, that tells a reused inode number from a file moved while the daemon was
// stopped: line 1 cannot tell them apart when the inode's former file was a copy of this
// session (an original and its copy both replaced while the daemon was down, the copy's
// replacement given the original's freed inode number: taken as moved, it would take the
// original's key, while the key its path had kept a head naming it). The records are read
// once, when first needed: a file opened at another path than its checkpoint's is rare
// (moved while stopped).
func (p *Publisher) replacedAtPath(f watcher.File, id string) bool {
	p.pathKeys.allOnce.Do(func() {
		all := map[string][]pathRecord{}
		err := p.opts.Checkpoints.Each(func(r checkpoint.Record) error {
			if r.ConvKey != "" && !r.Deleted {
				k := r.Root + "\x00" + r.Rel
				all[k] = append(all[k], pathRecord{watcher.FileID{Dev: r.Dev, Ino: r.Ino}, r.Conversation})
			}
			return nil
		})
		if err != nil {
			p.log.Warn("cannot read the checkpoints for the files replaced while stopped", zap.Error(err))
		}
		p.pathKeys.all = all
	})
	for _, r := range p.pathKeys.all[f.Root+"\x00"+f.Rel] {
		if r.id != f.ID && r.conv == id {
			return true
		}
	}
	return false
}

// movedClashKey returns the clash key of conversation id (other than derived, the key
// derived from f's path) whose head names f, for a file opened without a checkpoint. A
// clash key is derived from the path the file had when it got it; the file keeps it when
// it moves, and its head follows it. After the state directory is lost the key derived
// from the new path is not that key: the moved file would take the plain id when found
// before the file that owns it, start a new generation over that file's conversation, and
// the owner then take a new clash key. The candidates are the id's clash keys with
// messages in the owner's view (the one request mirroredWithoutHead also makes), one head
// read each: only ids with clash keys pay.
//
// A head still names the old path when the file moved before its head followed (the
// daemon killed, or stopped, before it saw the move): then the key whose head names a
// file of this host that no longer exists, and whose mirrored lines begin f (same line
// count, bytes and leaf), is f's (a copy renamed, the daemon killed right after it gave
// the copy its key).
func (p *Publisher) movedClashKey(ctx context.Context, f watcher.File, id, derived string) (string, *mirror.Divergence, bool) {
	var gone []mirror.Head
	for _, k := range p.view.clashKeysOf(ctx, p, id) {
		if k == derived {
			continue
		}
		conv, err := mirror.NewConv(p.opts.Owner, k)
		if err != nil {
			continue
		}
		h, _, err := p.reader.Head(ctx, conv)
		switch {
		case err != nil:
		case p.headNames(h, f):
			return k, h.DivergedFrom, true
		case h.Host == p.opts.Host && namedFileGone(h):
			gone = append(gone, h)
		}
	}
	if len(gone) == 0 || p.plainKeyNames(ctx, f, id) {
		return "", nil, false // a file the id's own head names is no moved copy, whatever its lines
	}
	for _, h := range gone {
		if beginsWith(f.Path, h) {
			return h.Key, h.DivergedFrom, true
		}
	}
	return "", nil, false
}

// plainKeyNames tells whether the head of conversation id (the plain key) names f.
func (p *Publisher) plainKeyNames(ctx context.Context, f watcher.File, id string) bool {
	conv, err := mirror.NewConv(p.opts.Owner, id)
	if err != nil {
		return false
	}
	h, _, err := p.reader.Head(ctx, conv)
	return err == nil && p.headNames(h, f)
}

// namedFileGone tells whether the file a head of this host names no longer exists.
func namedFileGone(h mirror.Head) bool {
	_, err := os.Lstat(filepath.Join(h.Root, filepath.FromSlash(h.Source)))
	return errors.Is(err, fs.ErrNotExist)
}

// beginsWith tells whether the file at path begins with the lines head h says its
// generation holds: h.LastOrdinal+1 complete lines, h.Bytes bytes, ending on leaf h.Head.
func beginsWith(path string, h mirror.Head) bool {
	if h.Bytes <= 0 {
		return false
	}
	fh, err := os.Open(path)
	if err != nil {
		return false
	}
	defer fh.Close()
	var (
		leaf  session.Leaf
		lines int64
		bytes int64
	)
	_, err = session.ReadLines(io.LimitReader(fh, h.Bytes), func(l session.DigestedLine) error {
		lines, bytes = lines+1, bytes+l.Size+1
		if l.Ordinal > 0 && l.Prefix != nil {
			if env, err := session.ScanEntry(l.Prefix); err == nil {
				leaf.Apply(env)
			}
		}
		return nil
	})
	return err == nil && lines == h.LastOrdinal+1 && bytes == h.Bytes && leaf.ID() == h.Head
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
