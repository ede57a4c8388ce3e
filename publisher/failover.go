package publisher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// Failover: one conversation, copies on several hosts (a warm standby rebuilt from the
// mirror by pisync recover; the primary it stood in for, back after a failure or a
// partition).
//
// A host takes a conversation over by continuing its newest generation: a daemon that
// finds its file holding exactly the generation's lines so far (compared whole, as any
// file without a checkpoint) mirrors the file's next lines into that generation, and its
// head then names the host, root and path. A copy recovery had to make lines up for (a
// synthesized header, a placeholder) is not the conversation's lines: it starts a new
// generation, like any file rewritten.
//
// Which copy goes on when two hosts append is settled by the stream, not by the head:
// each line past the shared ones is fenced on the newest sequence its daemon knows
// (onewriter.go), so of two copies' next lines exactly one lands, and its copy continues
// the conversation's key. The other daemon finds a line of another host where its own
// should be: its file keeps its place in the generation while it holds no line of its
// own past the lines they share (it publishes nothing), and once it has, it is mirrored
// whole under a key of its own, derived from the conversation, the host and the file's
// path (divergedKey), whose head records where it left the conversation
// (Head.DivergedFrom). Neither history is lost, neither is interleaved into the other,
// and the copies never start generations over each other's. The head alone could not
// settle it: a daemon would have to read it before every line.
//
// The session store is another writer (DESIGN §8), told apart by its head: its lines go
// on in its generation and the local file's to a new generation, as before.

// known is what a file is known to have had acknowledged under its key before this
// Open: its previous state's frontier, or its checkpoint's (ok false: neither, or
// nothing acknowledged).
type known struct {
	ok   bool
	at   frontier
	leaf string
}

// knownOf is what Open knows a file had acknowledged under key: its previous state's
// frontier (old, reopened under the same key), else its checkpoint record's.
func knownOf(old *fileState, rec checkpoint.Record, record bool, key string) known {
	var k known
	switch {
	case old != nil && !old.skipped && old.conv.Key == key:
		old.mu.Lock()
		k.at, k.leaf = old.acked, old.leaf.ID()
		old.mu.Unlock()
	case record && rec.ConvKey == key:
		k.at, k.leaf = frontierOf(rec), rec.Leaf
	}
	k.ok = k.at.Generation > 0 && k.at.Ordinal > 0
	return k
}

// resumeOutcome is what resume found besides the frontier: the file's copy diverged from the
// conversation (diverge mirrors it under its own key), or it stays at its frontier
// behind a newer generation of another host (stayBehind).
type resumeOutcome struct {
	diverged *mirror.Divergence
	behind   bool
}

// writerAt is the host that wrote the mirror's line where the file parts from it, ""
// when the mirror holds none there.
func (p *Publisher) writerAt(ctx context.Context, c mirror.Conv, cmp compared) (string, error) {
	if !cmp.found {
		return "", nil
	}
	l, err := p.reader.LineAt(ctx, c, cmp.line.seq)
	if err != nil {
		return "", fmt.Errorf("the writer of sequence %d: %w", cmp.line.seq, err)
	}
	return l.Host, nil
}

// intact reports whether the file still holds every line it had acknowledged under st's
// key (prior), where it parts from the newest generation top (cmp): the lines of that
// generation before the place it parts at, when prior is in it; the last acknowledged
// line in its place, when prior is in an older one. Without prior, the file's lines are
// taken for its own when this host wrote the last line the file shares with top.
func (p *Publisher) intact(ctx context.Context, st *fileState, prior known, top int, cmp compared) (bool, error) {
	switch {
	case prior.ok && prior.at.Generation == top:
		return cmp.at >= prior.at.Ordinal, nil
	case prior.ok && prior.at.Generation < top:
		return verifyLastLine(st.file.Path, checkpoint.Record{Offset: prior.at.Offset, LastSHA: prior.at.LastSHA, LastLen: prior.at.LastLen})
	case prior.ok, !cmp.beforeOK:
		return false, nil
	}
	return p.writtenHere(ctx, st.conv, cmp.before)
}

// linePast reports whether the first size bytes of the file at path hold a complete line
// past offset off.
func linePast(path string, size, off int64) (bool, error) {
	if size <= off {
		return false, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 32<<10)
	for pos := off; pos < size; {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), size-pos)], pos)
		if bytes.IndexByte(buf[:n], '\n') >= 0 {
			return true, nil
		}
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		pos += int64(n)
	}
	return false, nil
}

// stayBehind keeps st at the frontier it had acknowledged (prior), in the generation
// another host started a newer one after: it publishes nothing, its head stays as it was
// (the newer generation's is ahead of it), and its next line reopens it (takenOver),
// which mirrors it under its diverged key. Open owns st alone.
func (p *Publisher) stayBehind(st *fileState, prior known) {
	st.acked = prior.at
	st.leaf.Set(prior.leaf)
	st.held = nil
	st.headSeq = prior.at.StreamSeq
	st.takenOver = true
}

// diverge mirrors f, a copy of st's conversation that another host continued past the
// lines they share (d), whole under its diverged key: it gives up its claim of the
// conversation's key, claims the diverged one and resumes there, which finds the lines
// an earlier run mirrored under it, if any. It returns the state to register.
func (p *Publisher) diverge(ctx context.Context, f watcher.File, st *fileState, d *mirror.Divergence, log *zap.Logger) (*fileState, error) {
	p.mu.Lock()
	if p.byConv[d.Key] == f.ID {
		delete(p.byConv, d.Key)
	}
	p.mu.Unlock()
	key := p.claimKey(f, st.id, divergedKey(d.Key, p.opts.Host, f), log)
	conv, err := mirror.NewConv(p.opts.Owner, key)
	if err != nil {
		return nil, err
	}
	ds := &fileState{file: st.file, conv: conv, id: st.id, cwd: st.cwd, format: st.format, hdrSum: st.hdrSum,
		liveFrom: st.liveFrom, mtime: st.mtime, headerAt: st.headerAt, diverged: d}
	r, err := p.resume(ctx, ds, watcher.Start{}, known{}, log)
	if err != nil {
		return nil, err
	}
	if r.diverged != nil || r.behind {
		// Only this host writes the key it derived for itself.
		return nil, fmt.Errorf("conversation %s: another host wrote %s, this host's copy of it", d.Key, key)
	}
	p.m.divergences.Inc()
	log.Warn("another host continued this conversation past the lines this file shares with it; the file is mirrored whole under a key of its own",
		zap.String("conversation", d.Key), zap.String("key", key), zap.String("host", d.Host),
		zap.Int("generation", d.Generation), zap.Int64("shared_lines", d.Ordinal))
	return ds, nil
}

// divergenceFor is the divergence st's key records, for a file whose key was not found
// by a decision that knew it (previous state, checkpoint, the mirror's head: known): the
// head of a derived key naming the file (a replacement keeping the key of the file it
// replaced). One head read, for derived keys only.
func (p *Publisher) divergenceFor(ctx context.Context, st *fileState) *mirror.Divergence {
	if _, derived := clashKeyID(st.conv.Key); !derived {
		return nil
	}
	h, _, err := p.reader.Head(ctx, st.conv)
	if err != nil || !p.headNames(h, st.file) {
		return nil
	}
	return h.DivergedFrom
}

// headSettle is how long storeWritesBy waits for the head of a line's writer; headPoll
// how often it reads it meanwhile.
const (
	headSettle = 5 * time.Second
	headPoll   = 50 * time.Millisecond
)

// storeWritesBy is storeWrites for the generation gen another writer extended with the
// line at stream sequence seq. The session store writes its head right after its first
// line, a daemon within its head interval; until the writer's head holds its line, the
// head cannot tell the store from a host. It is read again until it does, or says the
// store writes, for at most headSettle: a writer whose head never comes (killed in
// between) is taken for a host. Its lines stay apart from the file's either way.
func (p *Publisher) storeWritesBy(ctx context.Context, st *fileState, gen int, seq uint64) (bool, error) {
	if g := p.storeGenOf(st.conv.Key); g != 0 {
		st.storeGen = g
		return g == gen, nil
	}
	deadline := time.Now().Add(headSettle)
	for {
		h, _, err := p.reader.Head(ctx, st.conv)
		switch {
		case err == nil && h.StoreWrites():
			p.noteStoreHead(st, h)
			return h.Generation == gen, nil
		case err == nil && h.LastSeq >= seq:
			return false, nil
		case err != nil && !errors.Is(err, mirror.ErrNotFound) && !errors.Is(err, mirror.ErrBadHead):
			return false, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(headPoll):
		}
	}
}

// DivergedSession is a local file mirrored under its diverged key.
type DivergedSession struct {
	Path string            `json:"path"`
	Key  string            `json:"key"` // its key in the mirror
	From mirror.Divergence `json:"diverged_from"`
}

// Diverged lists the local files mirrored under their diverged keys, by path.
func (p *Publisher) Diverged() []DivergedSession {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := []DivergedSession{}
	for _, st := range p.files {
		if st.skipped || st.diverged == nil {
			continue
		}
		st.mu.Lock()
		gone := st.gone
		st.mu.Unlock()
		if !gone {
			out = append(out, DivergedSession{Path: st.file.Path, Key: st.conv.Key, From: *st.diverged})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
