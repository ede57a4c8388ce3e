package publisher

import (
	"context"
	"errors"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/pisync/pisync/mirror"
)

// One writer at a time (DESIGN §8). Once the session store has written a conversation
// (its head says so), the daemon never extends the generation the store extends: lines
// appended to the local file afterwards are mirrored as a new generation of the file.
//
// Two things make sure of it:
//   - a fence: the first line of a file past its acknowledged frontier (the only line in
//     flight for it, which is how Pi appends: one line at a time) is published with
//     Nats-Expected-Last-Subject-Sequence set to the newest sequence the daemon knows of
//     the conversation's subject. The store publishes with the same check, so of a local
//     line and a store append on one head exactly one lands; when the daemon's is refused,
//     reconciliation finds the other writer's line in its generation (takeOver). A daemon
//     on another host mirroring a copy of the file (a warm standby that took over) fences
//     its lines the same way: failover.go says what becomes of the copy that loses;
//   - the head: the daemon never writes its head over one the store writes
//     (mirror.Writer.PutHead), and learns from it which generation the store writes; at a
//     resume, a file that is not exactly the store's lines so far starts a new generation.
//
// Lines appended since the file was opened go one at a time, each sent once the one
// before it is acknowledged and fenced on it, however fast they come. The lines a file
// held when it was opened (a back-fill, or lines written while the daemon was stopped)
// are pipelined once the fenced first one is acknowledged: serializing them would double
// the CPU a back-fill costs and halve its speed (bench/RESULTS.md, CPU per line), and
// sending them before it is acknowledged would let them land after another writer's
// line that made it refused (a host that took the conversation over while this one was
// down). Another daemon's line cannot land between two of them: it is fenced on the
// newest sequence that daemon knows, and a daemon that learns of this file's lines
// stops extending the generation (takeOver). A store append can (its caller read the
// conversation meanwhile); the runbook's cut-over precondition (the owner's files
// verified identical, so no back-fill is left) is what keeps it away.
// So the back-fill is fenced once: on the first line sent after the file was opened (or
// reconciled), not again each time its queue drains while the watcher reads on. A fence
// costs the server more than its check: it reads the subject's last message, and a read
// of the block being written makes nats-server's file store keep that block's 8 MB write
// cache for its 10 s expiry once the block is full, instead of reusing the buffer for the
// next block. A back-fill fenced each time its queue drained (one line in about 1,200)
// made the server spend 38–68 µs a line instead of 26–32 and peak at 440–560 MB instead
// of 110 (bench/RESULTS.md, the server's CPU a line).

// storeGenOf returns the generation the session store writes for key, as far as this
// daemon has learnt (0: none).
func (p *Publisher) storeGenOf(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.storeGens[key]
}

// noteStoreGen records that the session store writes generation gen of st's conversation.
func (p *Publisher) noteStoreGen(st *fileState, gen int) {
	p.mu.Lock()
	p.storeGens[st.conv.Key] = gen
	p.mu.Unlock()
	st.mu.Lock()
	st.storeGen = gen
	st.mu.Unlock()
}

// fence returns the sequence it's message is to be fenced on if sent now (the expected
// last sequence of its subject), "" for none; the caller holds st.mu. Only the first
// unresolved line of a file is fenced (on): the sequence the ones behind it must follow is
// not known until it is acknowledged. Of a back-fill's lines (not live) only those sent
// before any line of the file was acknowledged since it was opened or reconciled
// (st.ownAck): the back-fill is fenced once (above).
//
// The fence is not written into the line's message: a fenced send goes out as a copy
// (mirror.Outgoing.Msg), so a publish still in flight (nats.go's retry after "no
// responders") never sees the fence of a later resend change under it.
func fence(st *fileState, it *item, on bool) string {
	if seq := max(st.acked.StreamSeq, st.fenceSeq); on && len(st.queue) > 0 && st.queue[0] == it && seq != 0 &&
		(st.live(it) || !st.ownAck) {
		return strconv.FormatUint(seq, 10)
	}
	return ""
}

// waitsBehind reports whether line it, queued behind st's unresolved lines, waits to
// be sent until they resolve: a live line until the one before it does (it is fenced on
// it), a back-filled one until the file's first fenced line is acknowledged. The caller
// holds st.mu.
func (p *Publisher) waitsBehind(st *fileState, it *item) bool {
	return len(st.queue) > 0 && (st.live(it) || p.backfillHeld(st))
}

// backfillHeld reports whether st's back-filled lines wait for its first fenced line
// (see above): none of its lines is acknowledged since it was opened or reconciled, and
// that first line is fenced. The caller holds st.mu.
func (p *Publisher) backfillHeld(st *fileState) bool {
	return !st.ownAck && !p.opts.Unfenced && max(st.acked.StreamSeq, st.fenceSeq) != 0
}

// sendBackfill sends the back-filled lines that waited for the file's first fenced line,
// now that it is acknowledged: pipelined, unfenced (fence).
func (p *Publisher) sendBackfill(st *fileState) {
	st.mu.Lock()
	if st.failed || st.resyncing != nil {
		st.mu.Unlock()
		return // the reconciliation resends them
	}
	var out []*item
	for _, it := range st.queue {
		if it.waiting && !st.live(it) {
			it.waiting = false
			out = append(out, it)
		}
	}
	st.mu.Unlock()
	for _, it := range out {
		if p.send(p.runCtx, st, it) != nil {
			return // closing: sent at the next start
		}
	}
}

// fenced reports whether err is the server refusing a fenced line: the subject holds a
// message the daemon did not know of.
func fenced(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// foreign reports whether held (the lines of st's generation the mirror holds past its
// frontier) has a line the daemon did not publish from this file: one at an ordinal the
// file has, with other bytes, or past the lines read so far. The caller holds st.mu.
func foreign(st *fileState, held map[int64]heldLine) bool {
	queued := make(map[int64]string, len(st.queue))
	for _, it := range st.queue {
		queued[it.ordinal] = it.sha
	}
	for o, h := range held {
		if o < st.acked.Ordinal {
			continue // a late copy of a line before the frontier
		}
		if sha, ok := queued[o]; ok && h.holds(sha) {
			continue
		}
		if st.held.has(o, h.sha) {
			continue // published before a restart, not read again yet
		}
		return true
	}
	return false
}

// takeOver gives up st's generation to the writer that extended it: the lines queued
// for it are dropped (the frontier stays where it is) and the file is reopened, which
// compares it with the mirror: a new generation when the writer is the session store,
// the file's diverged key when it is another host (failover.go). The caller holds st.mu;
// takeOver releases it.
func (p *Publisher) takeOver(st *fileState) {
	st.takenOver = true
	var released int64
	slots := 0
	for _, it := range st.queue {
		if it.done {
			continue
		}
		released += it.weight
		it.weight = 0
		if it.slot {
			it.slot = false
			slots++
		}
	}
	st.queue = nil
	gen, key, path := st.acked.Generation, st.conv.Key, st.file.Path
	st.mu.Unlock()
	for range slots {
		p.releaseSlot()
	}
	p.release(released)
	p.log.Warn("another writer (the session store, or a copy of the file on another host) extends the generation this file was mirrored into; "+
		"comparing the file with the mirror", zap.String("path", path), zap.String("conversation", key), zap.Int("generation", gen))
	if p.opts.Reopen != nil {
		p.opts.Reopen(path)
	}
}

// storeWrites reports whether the session store writes generation gen of st's
// conversation: from what the daemon learnt, else from the head (one read, made only
// when the file and the mirror differ in length).
func (p *Publisher) storeWrites(ctx context.Context, st *fileState, gen int) (bool, error) {
	if g := p.storeGenOf(st.conv.Key); g != 0 {
		st.storeGen = g
		return g == gen, nil
	}
	h, _, err := p.reader.Head(ctx, st.conv)
	switch {
	case errors.Is(err, mirror.ErrNotFound), errors.Is(err, mirror.ErrBadHead):
		return false, nil
	case err != nil:
		return false, err
	case !h.StoreWrites():
		return false, nil
	}
	p.noteStoreHead(st, h)
	return h.Generation == gen, nil
}

// noteStoreHead records that the session store writes generation h.Generation of st's
// conversation, which Open reads alone (st is not registered yet).
func (p *Publisher) noteStoreHead(st *fileState, h mirror.Head) {
	p.mu.Lock()
	p.storeGens[st.conv.Key] = h.Generation
	p.mu.Unlock()
	st.storeGen = h.Generation
}

// putHead writes a file's head; for a conversation the session store writes, only the
// head's Local part (see mirror.Writer.PutLocal). A head found to be the store's is
// recorded as such and written as Local at once.
func (p *Publisher) putHead(ctx context.Context, st *fileState, c mirror.Conv, h mirror.Head, storeGen int) error {
	if storeGen == 0 {
		err := p.writer.PutHead(ctx, c, h)
		var sw *mirror.StoreWritesError
		if !errors.As(err, &sw) {
			return err
		}
		p.noteStoreGen(st, sw.Head.Generation)
		if sw.Head.Generation == h.Generation {
			return nil // the file's lines are the store's first ones: nothing of its own
		}
		p.log.Info("the session store writes this conversation; the local file's generation is recorded apart",
			zap.String("conversation", c.Key), zap.Int("store_generation", sw.Head.Generation), zap.Int("generation", h.Generation))
	}
	err := p.writer.PutLocal(ctx, c, mirror.LocalCopy{Host: h.Host, Root: h.Root, Source: h.Source,
		Generation: h.Generation, Entries: h.Entries, LastSeq: h.LastSeq, Bytes: h.Bytes, UpdatedAt: h.UpdatedAt})
	if errors.Is(err, mirror.ErrNotFound) {
		return nil // deleted through the store: nothing to record it in
	}
	return err
}

// sendNext sends the line waiting at the front of a live file's queue, now that the one
// before it resolved: fenced on it (see fence).
func (p *Publisher) sendNext(st *fileState) {
	st.mu.Lock()
	if len(st.queue) == 0 || !st.queue[0].waiting || st.failed || st.resyncing != nil {
		st.mu.Unlock()
		return
	}
	it := st.queue[0]
	it.waiting = false
	st.mu.Unlock()
	_ = p.send(p.runCtx, st, it) // an error means the publisher is closing: sent at the next start
}
