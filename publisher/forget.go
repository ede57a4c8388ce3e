package publisher

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// forgetGone returns the deleted files whose last state is recorded: every line read
// resolved, the checkpoint saying "deleted" staged, the head saying so in the mirror
// (or never written: nothing of the file was acknowledged). Their checkpoint records are
// staged for removal, to be committed with the checkpoints just staged; forget then
// drops them from memory once that commit succeeded. Without this, every file deleted
// while the daemon runs would keep its state and its record for ever.
func (p *Publisher) forgetGone() []*fileState {
	p.mu.Lock()
	cands := make([]*fileState, 0, len(p.goneFiles))
	for st := range p.goneFiles {
		cands = append(cands, st)
	}
	p.mu.Unlock()
	var done []*fileState
	for _, st := range cands {
		st.mu.Lock()
		settled := len(st.queue) == 0 && !st.cpDirty && !st.failed &&
			(st.goneHeadWritten || st.acked.StreamSeq == 0)
		id := st.file.ID
		st.mu.Unlock()
		if !settled {
			continue
		}
		p.mu.Lock()
		current := p.files[id] == st // not reopened meanwhile under the same identity
		p.mu.Unlock()
		if current {
			p.opts.Checkpoints.Delete(checkpoint.Key(id.Dev, id.Ino))
		}
		done = append(done, st)
	}
	return done
}

// forget drops the files forgetGone settled, their records' removal committed.
func (p *Publisher) forget(done []*fileState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range done {
		delete(p.goneFiles, st)
		if p.files[st.file.ID] == st {
			p.forgotten[st.file.Root]++
		}
		p.drop(st)
	}
}

// drop removes st from the indexes that still point at it. The caller holds p.mu.
func (p *Publisher) drop(st *fileState) {
	id := st.file.ID
	if p.files[id] != st {
		return // reopened under the same identity: the new state owns the entries
	}
	delete(p.files, id)
	p.unkeyed(st)
	if p.byPath[st.file.Path] == id {
		delete(p.byPath, st.file.Path)
	}
	if p.byConv[st.conv.Key] == id {
		delete(p.byConv, st.conv.Key)
	}
}

// PruneCheckpoints deals with the files deleted while the daemon was stopped. Call it
// once the watcher's first scan is over, when every file present has been opened or has
// failed once: a record under one of roots (an existing directory) whose path no longer
// exists and whose identity is not open is a file that left the roots. As Gone does for
// a file deleted while running, its head is marked deleted (when the head describes this
// host's file: another host's copy of the conversation is left alone) and its record is
// removed with the next checkpoint commit. A record whose head cannot be updated is kept
// for the next start. A file moved while stopped whose first opening failed looks deleted
// here; when it opens it resumes from the mirror and rewrites its head, as a file without
// a checkpoint does. It returns how many records it removes.
func (p *Publisher) PruneCheckpoints(ctx context.Context, roots []string) (int, error) {
	keys, err := p.opts.Checkpoints.Keys() // not the records: most belong to open files
	if err != nil {
		return 0, fmt.Errorf("list checkpoints: %w", err)
	}
	watched := map[string]bool{}
	for _, r := range roots {
		if fi, err := os.Stat(r); err == nil && fi.IsDir() {
			watched[r] = true
		}
	}
	pruned := 0
	for _, key := range keys {
		if ctx.Err() != nil {
			return pruned, ctx.Err()
		}
		dev, ino, err := checkpoint.ParseKey(key)
		if err != nil || p.isOpen(watcher.FileID{Dev: dev, Ino: ino}) {
			continue
		}
		rec, ok := p.opts.Checkpoints.Get(key)
		if !ok || !watched[rec.Root] {
			continue
		}
		path := filepath.Join(rec.Root, filepath.FromSlash(rec.Rel))
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := p.markDeleted(ctx, rec, path); err != nil {
			p.log.Warn("could not mark the head of a session deleted while stopped; retried at next start",
				zap.String("path", path), zap.String("conversation", rec.ConvKey), zap.Error(err))
			continue
		}
		p.opts.Checkpoints.Delete(key)
		pruned++
	}
	return pruned, nil
}

func (p *Publisher) isOpen(id watcher.FileID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.files[id]
	return ok
}

// markDeleted sets LocalDeleted in the head of rec's conversation if that head describes
// rec's file on this host.
func (p *Publisher) markDeleted(ctx context.Context, rec checkpoint.Record, path string) error {
	if rec.ConvKey == "" || rec.StreamSeq == 0 {
		return nil // nothing of it was acknowledged: no head
	}
	conv, err := mirror.NewConv(p.opts.Owner, rec.ConvKey)
	if err != nil {
		return nil // not a key of this owner's: nothing to mark
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h, _, err := p.reader.Head(hctx, conv)
	if errors.Is(err, mirror.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if h.LocalDeleted || h.Host != p.opts.Host || h.Root != rec.Root || h.Source != rec.Rel {
		return nil
	}
	h.LocalDeleted, h.UpdatedAt = true, time.Now().UTC()
	if err := p.writer.PutHead(hctx, conv, h); err != nil {
		return err
	}
	p.log.Info("session file removed while stopped; its mirror copy stays", zap.String("path", path))
	return nil
}
