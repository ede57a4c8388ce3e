package publisher

import (
	"context"
	"sort"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/mirror"
)

// A session destroyed in place (overwritten by a fresh header, cut back, rewritten
// without some of its lines) is a new generation that lacks entries of the one before
// it: the user's data is in the older generation. The publisher compares each new
// generation with its predecessor the way `pisync history` and `recover` do
// (mirror.History over the conversation's message headers), once the file has been
// quiet for shrinkQuiet: an in-place rewrite in progress (Pi's migration, one write per
// entry) lacks entries only until it is done. The result goes into the head, the
// checkpoint, a gauge, a counter and the status page.
//
// shrinkMu is a leaf: nothing else is locked while it is held.

// shrinkQuiet is how long a generation's entries must stay the same, the watcher's
// settled check confirmed, before it is compared with the generation before it.
const shrinkQuiet = 2 * time.Second

// shrinkState is what the publisher knows of one conversation whose newest generation
// is not its first.
type shrinkState struct {
	gen       int
	checked   bool           // compared at checkedAt entries: result holds
	checkedAt int64          // entries when compared
	result    *mirror.Shrink // nil: it lacks nothing
	entries   int64          // entries when a head flush last saw it
	changedAt time.Time      // when entries last changed
	since     time.Time      // when result was first found
	path      string
}

// ShrunkSession is a session whose newest generation lacks entries of the one before it.
type ShrunkSession struct {
	Path         string        `json:"path"`
	Conversation string        `json:"conversation"` // its key in the mirror
	Generation   int           `json:"generation"`
	Shrunk       mirror.Shrink `json:"shrunk"`
	Since        time.Time     `json:"since"`
}

// trackShrink starts following st's generation once it is not the first, from what the
// checkpoint recorded of it when it is that generation's.
func (p *Publisher) trackShrink(st *fileState, rec checkpoint.Record, found bool) {
	st.mu.Lock()
	gen, key, path, storeGen := st.acked.Generation, st.conv.Key, st.file.Path, st.storeGen
	st.mu.Unlock()
	p.shrinkMu.Lock()
	defer p.shrinkMu.Unlock()
	if gen < 2 || (storeGen != 0 && gen >= storeGen) {
		delete(p.shrinks, key)
		return
	}
	if ss := p.shrinks[key]; ss != nil && ss.gen == gen {
		ss.path = path
		return
	}
	ss := &shrinkState{gen: gen, changedAt: time.Now(), path: path}
	if found && rec.ConvKey == key && rec.ShrinkChecked == gen {
		ss.checked, ss.checkedAt, ss.entries = true, rec.Entries, rec.Entries
		if rec.ShrunkFrom != 0 {
			ss.result = &mirror.Shrink{From: rec.ShrunkFrom, Missing: rec.ShrunkMissing, Reason: mirror.ShrinkCause(rec.ShrunkReason)}
			ss.since = rec.UpdatedAt
		}
	}
	p.shrinks[key] = ss
}

// shrunkFor is the shrink of generation gen of key known now, and notes its entries (a
// change restarts the quiet period). Called while a head is built.
func (p *Publisher) shrunkFor(key string, gen int, entries int64) *mirror.Shrink {
	p.shrinkMu.Lock()
	defer p.shrinkMu.Unlock()
	ss := p.shrinks[key]
	if ss == nil || ss.gen != gen {
		return nil
	}
	if entries != ss.entries {
		ss.entries, ss.changedAt = entries, time.Now()
	}
	return ss.result
}

// recordShrink adds what is known of the file's generation to its checkpoint record.
func (p *Publisher) recordShrink(rec *checkpoint.Record) {
	p.shrinkMu.Lock()
	defer p.shrinkMu.Unlock()
	ss := p.shrinks[rec.ConvKey]
	if ss == nil || ss.gen != rec.Generation || !ss.checked {
		return
	}
	rec.ShrinkChecked = ss.gen
	if ss.result != nil {
		rec.ShrunkFrom, rec.ShrunkMissing, rec.ShrunkReason = ss.result.From, ss.result.Missing, string(ss.result.Reason)
	}
}

// shrinkDue lists the conversations to compare now: never compared, or found shrunk and
// grown since (entries with the missing ids may come back); quiet for shrinkQuiet.
func (p *Publisher) shrinkDue(now time.Time) []string {
	p.shrinkMu.Lock()
	defer p.shrinkMu.Unlock()
	var due []string
	for key, ss := range p.shrinks {
		if (!ss.checked || (ss.result != nil && ss.entries != ss.checkedAt)) && now.Sub(ss.changedAt) >= shrinkQuiet {
			due = append(due, key)
		}
	}
	sort.Strings(due)
	return due
}

// checkShrinks compares the generations due (shrinkDue) with the ones before them, and
// forgets the conversations no file carries any more.
func (p *Publisher) checkShrinks(ctx context.Context) {
	for _, key := range p.shrinkDue(time.Now()) {
		p.mu.Lock()
		st := p.files[p.byConv[key]]
		p.mu.Unlock()
		if st == nil {
			p.shrinkMu.Lock()
			delete(p.shrinks, key)
			p.shrinkMu.Unlock()
			continue
		}
		st.mu.Lock()
		conv, gen, entries, settled, busy := st.conv, st.acked.Generation, st.acked.Entries, !st.unsettled, len(st.queue) > 0
		st.mu.Unlock()
		if !settled || busy || conv.Key != key {
			continue // a change not checked yet by the watcher, or lines in flight: later
		}
		info, err := p.generationInfo(ctx, conv, gen)
		if err != nil {
			if ctx.Err() == nil {
				p.log.Debug("comparing a generation with the one before it failed; retried", zap.String("conversation", key), zap.Error(err))
			}
			continue
		}
		p.noteShrink(st, key, gen, entries, info)
	}
	p.shrinkMu.Lock()
	n := 0
	for _, ss := range p.shrinks {
		if ss.result != nil {
			n++
		}
	}
	p.shrinkMu.Unlock()
	p.m.shrunk.Set(float64(n))
}

// generationInfo reads generation gen of c as `pisync history` does.
func (p *Publisher) generationInfo(ctx context.Context, c mirror.Conv, gen int) (*mirror.GenInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var h mirror.History
	if err := p.reader.Scan(ctx, c, mirror.ScanOptions{HeadersOnly: true}, func(m mirror.Msg) error {
		if m.Generation <= gen {
			h.Add(m)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	p.m.resumeQuery.WithLabelValues("scan").Inc()
	for _, g := range h.Generations() {
		if g.Number == gen {
			return &g, nil
		}
	}
	return &mirror.GenInfo{Number: gen}, nil
}

// noteShrink records the comparison of generation gen at entries; a change of the
// result is written into the head and the checkpoint, and a new shrink counted and
// logged once.
func (p *Publisher) noteShrink(st *fileState, key string, gen int, entries int64, info *mirror.GenInfo) {
	p.shrinkMu.Lock()
	ss := p.shrinks[key]
	if ss == nil || ss.gen != gen {
		p.shrinkMu.Unlock()
		return
	}
	was := ss.result
	ss.checked, ss.checkedAt, ss.result = true, entries, info.Shrunk
	if was == nil && ss.result != nil {
		ss.since = time.Now().UTC()
	}
	path := ss.path
	p.shrinkMu.Unlock()
	changed := (was == nil) != (info.Shrunk == nil) || (was != nil && *was != *info.Shrunk)
	if !changed && was != nil {
		return
	}
	st.mu.Lock()
	st.cpDirty = true
	if changed {
		st.headDirty = true
	}
	st.mu.Unlock()
	p.noteDirty(st)
	switch s := info.Shrunk; {
	case s != nil && was == nil:
		p.m.shrinks.Inc()
		p.log.Warn("session lost entries: its newest generation lacks entries of the one before it",
			zap.String("path", path), zap.String("conversation", key), zap.Int("generation", gen),
			zap.Int("from_generation", s.From), zap.Int64("missing_entries", s.Missing), zap.String("reason", string(s.Reason)),
			zap.String("undo", "pisync recover --conversation "+key+" --generation "+strconv.Itoa(s.From)))
	case s == nil && was != nil:
		p.log.Info("session no longer lacks entries of its previous generation", zap.String("path", path),
			zap.String("conversation", key), zap.Int("generation", gen))
	}
}

// Shrunk lists the sessions whose newest generation lacks entries of the one before it.
func (p *Publisher) Shrunk() []ShrunkSession {
	p.shrinkMu.Lock()
	defer p.shrinkMu.Unlock()
	out := []ShrunkSession{}
	for key, ss := range p.shrinks {
		if ss.result != nil {
			out = append(out, ShrunkSession{Path: ss.path, Conversation: key, Generation: ss.gen, Shrunk: *ss.result, Since: ss.since})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// ShrinkChecked reports whether generation gen of the conversation keyed key has been
// compared with the one before it (for tests and the status of a rewrite).
func (p *Publisher) ShrinkChecked(key string, gen int) bool {
	p.shrinkMu.Lock()
	defer p.shrinkMu.Unlock()
	ss := p.shrinks[key]
	return ss != nil && ss.gen == gen && ss.checked
}
