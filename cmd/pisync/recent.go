package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// recentLogSize is how many warnings and errors the status page keeps.
const recentLogSize = 20

// recentEntry is one warning or error kept for the status page.
type recentEntry struct {
	Time    time.Time `json:"time"`
	Level   string    `json:"level"`
	Logger  string    `json:"logger,omitempty"`
	Message string    `json:"message"`
	Fields  string    `json:"fields,omitempty"` // key=value pairs, sorted by key
	Count   int       `json:"count"`            // consecutive repeats folded into this entry
}

// recentLog is a bounded ring of the most recent log entries at or above a level. An
// entry repeating the newest one (same level, logger and message) is folded into it, its
// count raised and its time and fields the latest, so that a burst of one failure does
// not push every other out.
type recentLog struct {
	min zapcore.Level

	mu    sync.Mutex
	buf   []recentEntry // ring; next is the oldest once full
	next  int
	total uint64 // entries ever recorded, including those overwritten
}

func newRecentLog(size int, min zapcore.Level) *recentLog {
	return &recentLog{min: min, buf: make([]recentEntry, 0, size)}
}

func (r *recentLog) add(e recentEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total++
	if n := len(r.buf); n > 0 {
		newest := &r.buf[(r.next+n-1)%n]
		if newest.Level == e.Level && newest.Logger == e.Logger && newest.Message == e.Message {
			newest.Count++
			newest.Time, newest.Fields = e.Time, e.Fields
			return
		}
	}
	e.Count = 1
	if len(r.buf) < cap(r.buf) {
		r.buf = append(r.buf, e)
		return
	}
	r.buf[r.next] = e
	r.next = (r.next + 1) % len(r.buf)
}

// entries returns the kept entries, newest first, and how many were ever recorded.
func (r *recentLog) entries() ([]recentEntry, uint64) {
	if r == nil {
		return nil, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]recentEntry, 0, len(r.buf))
	for i := range len(r.buf) {
		out = append(out, r.buf[(r.next+len(r.buf)-1-i)%len(r.buf)])
	}
	return out, r.total
}

// withRecentLog tees log into a ring of its most recent warnings and errors, which the
// status page shows (recentLogOf finds it again). Entries at warn level and above are
// kept even when the logger's own level would drop them. Wrapping twice is a no-op.
func withRecentLog(log *zap.Logger) *zap.Logger {
	if recentLogOf(log) != nil {
		return log
	}
	ring := newRecentLog(recentLogSize, zapcore.WarnLevel)
	return log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return &recentCore{inner: c, ring: ring}
	}))
}

// recentLogOf returns the ring withRecentLog put on log (or on the logger it derives
// from by Named or With), or nil.
func recentLogOf(log *zap.Logger) *recentLog {
	if log == nil {
		return nil
	}
	if c, ok := log.Core().(*recentCore); ok {
		return c.ring
	}
	return nil
}

// recentCore passes everything to inner and records warnings and errors in ring.
type recentCore struct {
	inner  zapcore.Core
	ring   *recentLog
	fields []zapcore.Field // context added by With
}

func (c *recentCore) Enabled(l zapcore.Level) bool {
	return l >= c.ring.min || c.inner.Enabled(l)
}

func (c *recentCore) With(fields []zapcore.Field) zapcore.Core {
	return &recentCore{inner: c.inner.With(fields), ring: c.ring, fields: append(slices.Clip(c.fields), fields...)}
}

func (c *recentCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	ce = c.inner.Check(e, ce)
	if e.Level >= c.ring.min {
		ce = ce.AddCore(e, ringCore{c})
	}
	return ce
}

// Write is for callers that use the core directly, without Check.
func (c *recentCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	if e.Level >= c.ring.min {
		c.record(e, fields)
	}
	return c.inner.Write(e, fields)
}

func (c *recentCore) Sync() error { return c.inner.Sync() }

func (c *recentCore) record(e zapcore.Entry, fields []zapcore.Field) {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%v", k, enc.Fields[k])
	}
	c.ring.add(recentEntry{Time: e.Time.UTC(), Level: e.Level.String(), Logger: e.LoggerName,
		Message: e.Message, Fields: b.String()})
}

// ringCore is the recording half of recentCore, added to a checked entry.
type ringCore struct{ c *recentCore }

func (r ringCore) Enabled(zapcore.Level) bool                                            { return true }
func (r ringCore) With([]zapcore.Field) zapcore.Core                                     { return r }
func (r ringCore) Check(_ zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry { return ce }
func (r ringCore) Sync() error                                                           { return nil }
func (r ringCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r.c.record(e, fields)
	return nil
}
