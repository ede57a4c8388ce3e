package watcher

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// call is one recorded Sink call.
type call struct {
	op   string // open, line, torn, gone
	f    File
	why  OpenReason
	line gotLine
	off  int64
	n    int64
}

// recSink records every call, checks the Sink contract as it goes (no overlapping
// calls for one file, lines in order from the last Start), and answers Open like a
// sink that remembers what it accepted: Moved resumes, anything else starts over.
type recSink struct {
	mu     sync.Mutex
	calls  []call
	pos    map[FileID]Start
	busy   map[FileID]bool
	faults []string
	open   func(f File, why OpenReason) (Start, error) // optional override
	line   func(f File, l Line) error                  // optional: fail a line
}

func newRecSink() *recSink {
	return &recSink{pos: map[FileID]Start{}, busy: map[FileID]bool{}}
}

func (s *recSink) enter(id FileID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy[id] {
		s.faults = append(s.faults, fmt.Sprintf("overlapping calls for %v", id))
	}
	s.busy[id] = true
}

func (s *recSink) leave(id FileID) {
	s.mu.Lock()
	s.busy[id] = false
	s.mu.Unlock()
}

func (s *recSink) Open(_ context.Context, f File, why OpenReason) (Start, error) {
	s.enter(f.ID)
	defer s.leave(f.ID)
	st := Start{}
	s.mu.Lock()
	if why == Moved {
		st = s.pos[f.ID]
	}
	hook := s.open
	s.mu.Unlock()
	if hook != nil {
		var err error
		if st, err = hook(f, why); err != nil {
			return Start{}, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call{op: "open", f: f, why: why})
	s.pos[f.ID] = Start{Offset: st.Offset, Ordinal: st.Ordinal}
	return st, nil
}

func (s *recSink) Line(_ context.Context, f File, l Line) error {
	s.enter(f.ID)
	defer s.leave(f.ID)
	gl := gotLine{Ord: l.Ordinal, Off: l.Offset, Len: l.Len, Inline: l.Data != nil, Data: string(l.Data)}
	if l.Data == nil {
		// Like the real sink: read the section through the watcher's descriptor.
		b := make([]byte, l.Len)
		if _, err := l.Src.ReadAt(b, l.Offset); err != nil {
			return err
		}
		gl.Data = string(b)
	}
	s.mu.Lock()
	hook := s.line
	s.mu.Unlock()
	if hook != nil {
		if err := hook(f, l); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pos[f.ID]; p.Offset != l.Offset || p.Ordinal != l.Ordinal {
		s.faults = append(s.faults, fmt.Sprintf("%s: line %d at %d, expected %d at %d",
			f.Path, l.Ordinal, l.Offset, p.Ordinal, p.Offset))
	}
	if l.Seen.IsZero() {
		s.faults = append(s.faults, "line without Seen")
	}
	s.pos[f.ID] = Start{Offset: l.Offset + l.Len + 1, Ordinal: l.Ordinal + 1}
	s.calls = append(s.calls, call{op: "line", f: f, line: gl})
	return nil
}

func (s *recSink) Torn(f File, offset, n int64) {
	s.enter(f.ID)
	defer s.leave(f.ID)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call{op: "torn", f: f, off: offset, n: n})
}

// Settled records the settled check's news as op "settled" (n: 1 settled, 0 not).
func (s *recSink) Settled(f File, settled bool) {
	s.enter(f.ID)
	defer s.leave(f.ID)
	s.mu.Lock()
	defer s.mu.Unlock()
	c := call{op: "settled", f: f}
	if settled {
		c.n = 1
	}
	s.calls = append(s.calls, c)
}

func (s *recSink) Gone(f File) {
	s.enter(f.ID)
	defer s.leave(f.ID)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call{op: "gone", f: f})
}

// find returns the calls of op on path ("" = any path).
func (s *recSink) find(op, path string) []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []call
	for _, c := range s.calls {
		if c.op == op && (path == "" || c.f.Path == path) {
			out = append(out, c)
		}
	}
	return out
}

// texts returns the data of the lines delivered for path.
func (s *recSink) texts(path string) []string {
	var out []string
	for _, c := range s.find("line", path) {
		out = append(out, c.line.Data)
	}
	return out
}

func (s *recSink) reasons(path string) []OpenReason {
	var out []OpenReason
	for _, c := range s.find("open", path) {
		out = append(out, c.why)
	}
	return out
}

func (s *recSink) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.faults {
		t.Error(f)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitLines waits until path has had exactly want delivered (and not more).
func waitLines(t *testing.T, s *recSink, path string, want ...string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d lines of %s", len(want), filepath.Base(path)), func() bool {
		return len(s.texts(path)) >= len(want)
	})
	if got := s.texts(path); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("%s: got lines %q, want %q", filepath.Base(path), got, want)
	}
}

type harness struct {
	w    *Watcher
	sink *recSink
	logs *observer.ObservedLogs
	stop func() // stops the watcher and waits for Run (also done when the test ends)
}

// start runs a watcher over roots until the test ends, with short intervals.
func start(t *testing.T, sink *recSink, roots []string, mod func(*Options)) *harness {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, core)
	}))
	opts := Options{
		Roots:                roots,
		Sink:                 sink,
		Logger:               log,
		Workers:              3,
		MoveGrace:            300 * time.Millisecond,
		RootPollInterval:     20 * time.Millisecond,
		FallbackPollInterval: 50 * time.Millisecond,
		RescanInterval:       -1,
	}
	if mod != nil {
		mod(&opts)
	}
	w, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(func() {
		stop()
		sink.check(t)
	})
	return &harness{w: w, sink: sink, logs: logs, stop: stop}
}

func (h *harness) ready(t *testing.T) {
	t.Helper()
	select {
	case <-h.w.Ready():
	case <-time.After(15 * time.Second):
		t.Fatal("watcher not ready")
	}
}

// session returns a header line and n entry lines, each with its "\n".
func session(id string, n int) []string {
	lines := []string{fmt.Sprintf(`{"type":"session","version":3,"id":%q,"timestamp":"2025-01-01T00:00:00Z","cwd":"/w"}`, id)}
	for i := 1; i <= n; i++ {
		lines = append(lines, entry(id, i))
	}
	return lines
}

func entry(id string, i int) string {
	return fmt.Sprintf(`{"type":"message","id":"%s%04d","parentId":null,"message":{"role":"user","content":"line %d"}}`, id[:4], i, i)
}

func joinLines(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t testing.TB, path, content string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
}

// fakeSource wraps a real fsnotify source; it can drop events (as a kernel overflow
// does), inject errors, and refuse watches.
type fakeSource struct {
	real   EventSource
	events chan fsnotify.Event
	errors chan error
	drop   atomic.Bool
	refuse func(dir string) error // optional: error for Add
	done   chan struct{}
	wg     sync.WaitGroup
}

func newFakeSource(t *testing.T) *fakeSource {
	t.Helper()
	real, err := NewFSNotify()
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSource{real: real, events: make(chan fsnotify.Event), errors: make(chan error, 4), done: make(chan struct{})}
	f.wg.Go(func() {
		for {
			select {
			case ev, ok := <-real.Events():
				if !ok {
					return
				}
				if f.drop.Load() {
					continue
				}
				select {
				case f.events <- ev:
				case <-f.done:
					return
				}
			case err, ok := <-real.Errors():
				if !ok {
					return
				}
				select {
				case f.errors <- err:
				case <-f.done:
					return
				}
			}
		}
	})
	return f
}

func (f *fakeSource) Add(dir string) error {
	if f.refuse != nil {
		if err := f.refuse(dir); err != nil {
			return err
		}
	}
	return f.real.Add(dir)
}
func (f *fakeSource) Remove(dir string) error       { return f.real.Remove(dir) }
func (f *fakeSource) Events() <-chan fsnotify.Event { return f.events }
func (f *fakeSource) Errors() <-chan error          { return f.errors }
func (f *fakeSource) Close() error {
	close(f.done)
	err := f.real.Close()
	f.wg.Wait()
	return err
}

// pendingGone counts vanished files still waiting out MoveGrace: with none left and no
// Gone recorded, no Gone is coming.
func (w *Watcher) pendingGone() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.byID {
		if s.vanished {
			n++
		}
	}
	return n
}

// noGone checks that no Gone was reported and none is pending.
func (h *harness) noGone(t *testing.T) {
	t.Helper()
	if h.w.pendingGone() != 0 {
		t.Fatal("a vanished file is waiting to be reported Gone")
	}
	if g := h.sink.find("gone", ""); len(g) != 0 {
		t.Fatalf("gone %+v", g)
	}
}

func (w *Watcher) aliasCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.aliases {
		n += len(m)
	}
	return n
}
