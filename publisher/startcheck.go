package publisher

import (
	"context"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/watcher"
)

// startViewMaxAge is how long one stream-wide answer stands in for per-conversation
// questions: long enough to cover the first scan of a host with thousands of files,
// short enough that a purge an operator makes later is seen by the next batch of opens.
const startViewMaxAge = 5 * time.Minute

// startView is what one stream-wide request (STREAM.INFO with the owner's subject filter)
// says about every conversation of the owner at once: its message count, and the stream's
// newest sequence. At start it replaces a question per file for the files whose checkpoint
// already proves them acknowledged, so that a daemon start costs the cluster O(changed
// files), not O(all files) (DESIGN §6, docs/capacity.md).
type startView struct {
	mu     sync.Mutex
	at     time.Time
	ok     bool
	counts map[string]uint64
	last   uint64
	byID   map[string][]string // conversation id → its clash keys in counts, built when first asked
}

// get returns the view, asking the mirror when there is none younger than
// startViewMaxAge. A failed request is remembered for as long as a good answer would
// be, so that a mirror that refuses it (permissions) costs one request, not one per file;
// the files then take the per-conversation path.
func (v *startView) get(ctx context.Context, p *Publisher) (map[string]uint64, uint64, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.at.IsZero() && time.Since(v.at) < startViewMaxAge {
		return v.counts, v.last, v.ok
	}
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	counts, last, err := p.reader.CountsAndLast(qctx)
	if ctx.Err() != nil {
		return nil, 0, false // our caller gives up: nothing learnt about the mirror
	}
	v.at, v.ok, v.counts, v.last, v.byID = time.Now(), err == nil, counts, last, nil
	if err != nil {
		p.log.Warn("cannot list the mirror's conversations in one request; asking per file", zap.Error(err))
	}
	p.m.resumeQuery.WithLabelValues("stream").Inc()
	return v.counts, v.last, v.ok
}

// clashKeysOf returns the clash keys of conversation id that the view holds messages
// under, in order. The index is built once per answer of the mirror: a start that opens
// thousands of files without a checkpoint looks each id up, not every key.
func (v *startView) clashKeysOf(ctx context.Context, p *Publisher, id string) []string {
	if _, _, ok := v.get(ctx, p); !ok {
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.byID == nil {
		v.byID = map[string][]string{}
		for k := range v.counts {
			if id, ok := clashKeyID(k); ok {
				v.byID[id] = append(v.byID[id], k)
			}
		}
		for _, keys := range v.byID {
			sort.Strings(keys)
		}
	}
	return v.byID[id]
}

// provenByCheckpoint reports whether the checkpoint alone proves that every line of the
// file is acknowledged and nothing past it can be in the mirror, so that the file needs no
// question to the mirror. It holds when the file is seen at start (not reopened after a
// change), the checkpoint's last line is still in place (verified by the caller) and the
// file ends there: lines before it cannot have changed without changing the file or its
// identity. The mirror must hold exactly what the checkpoint says, which the stream-wide
// view answers for all files at once: the stream has not gone back below the
// checkpoint's sequence (restored from an older backup), and the conversation holds the
// older generations' messages (GenBase) and the checkpoint's lines, no fewer (purged) and
// no more: more are lines a daemon published and died before committing (the file may
// have been cut back to the checkpoint since, and those lines vanished locally) or a
// newer generation it started. Those files are compared with the mirror.
func (p *Publisher) provenByCheckpoint(ctx context.Context, f watcher.File, why watcher.OpenReason, rec checkpoint.Record, key string) bool {
	if why != watcher.Discovered || rec.Offset == 0 || f.Size != rec.Offset || rec.Generation == 0 || rec.StreamSeq == 0 {
		return false
	}
	counts, last, ok := p.view.get(ctx, p)
	if !ok || last < rec.StreamSeq {
		return false
	}
	if rec.Generation > 1 && rec.GenBase == 0 {
		return false // a record written before GenBase was kept: older generations' count unknown
	}
	if counts[key] != rec.GenBase+uint64(rec.Ordinal) {
		return false
	}
	p.m.resumeQuery.WithLabelValues("checkpoint").Inc()
	return true
}
