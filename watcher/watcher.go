package watcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/logx"
)

// Watcher finds session files under its roots and tails them into a Sink.
type Watcher struct {
	opts Options
	log  *zap.Logger
	m    *Metrics
	sink Sink
	// settles is the sink when it is a SettleSink, else nil.
	settles SettleSink
	roots   []*root
	ready   chan struct{}
	ran     atomic.Bool
	src     EventSource // set by Run before any goroutine starts

	scanKick  chan struct{} // wakes the scanner: a root wants a rescan
	clockKick chan struct{} // wakes the clock: an earlier deadline was added

	mu        sync.Mutex
	cond      *sync.Cond // workers wait on it for the queue
	closed    bool
	queue     []*fileState // files to look at, each at most once (fileState.queued)
	files     map[string]*fileState
	byDir     map[string]map[*fileState]struct{} // files by parent directory
	byID      map[FileID]*fileState              // identities, including vanished files during MoveGrace
	aliases   map[FileID]map[*fileState]struct{} // waiting second names of a tailed inode
	dirs      map[string]*dirState
	dirsByID  map[FileID]string
	polled    map[string]*polledDir // directories without a watch (see budget)
	budget    budget
	warned    map[string]bool // directories already logged as unreadable or unwatchable
	states    map[string]int  // files by state
	torn      int
	scanGen   uint64
	initLeft  int  // files of the initial scan not read once yet
	initDone  bool // the initial scan has walked every root
	readyDone bool
	noEvents  bool // the event source died: every root is polled
	clock     deadlines
	bufs      sync.Pool // *readBufs

	bytesRead, lines, events, overflows, rescans, errs atomic.Int64
	sourceErrs                                         logx.Run // event source errors since start
}

// New validates opts and returns a Watcher; nothing runs before Run.
func New(opts Options) (*Watcher, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	w := &Watcher{
		sourceErrs: logx.Run{Every: 100},
		opts:       opts,
		log:        opts.Logger,
		m:          opts.Metrics,
		sink:       opts.Sink,
		ready:      make(chan struct{}),
		scanKick:   make(chan struct{}, 1),
		clockKick:  make(chan struct{}, 1),
		files:      map[string]*fileState{},
		byDir:      map[string]map[*fileState]struct{}{},
		byID:       map[FileID]*fileState{},
		aliases:    map[FileID]map[*fileState]struct{}{},
		dirs:       map[string]*dirState{},
		dirsByID:   map[FileID]string{},
		polled:     map[string]*polledDir{},
		budget:     newBudget(opts),
		warned:     map[string]bool{},
		states:     map[string]int{},
	}
	w.cond = sync.NewCond(&w.mu)
	w.settles, _ = opts.Sink.(SettleSink)
	w.bufs.New = func() any {
		return &readBufs{buf: make([]byte, opts.ReadBuffer), vbuf: make([]byte, min(opts.ReadBuffer, maxCheckBuf))}
	}
	for _, p := range opts.Roots {
		w.roots = append(w.roots, &root{path: p})
	}
	return w, nil
}

// Ready is closed when the initial scan of all roots has been handed to the sink:
// every file that existed was discovered and read to its end once (or failed once).
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Run watches until ctx is done, then stops every goroutine it started, closes the
// event source and returns nil. It may be called once.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return errors.New("watcher: Run called twice")
	}
	src := w.opts.Events
	if src == nil {
		var err error
		if src, err = NewFSNotify(); err != nil {
			return fmt.Errorf("watcher: %w", err)
		}
	}
	w.src = src
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	for range w.opts.Workers {
		wg.Go(func() { w.worker(ctx) })
	}
	wg.Go(func() { w.eventLoop(ctx) })
	wg.Go(func() { w.clockLoop(ctx) })
	wg.Go(func() { w.scanLoop(ctx) })
	w.mu.Lock()
	limit, source := w.budget.shown(), w.budget.source
	w.mu.Unlock()
	if limit == 0 {
		source = "none"
	}
	w.m.watchBudget.Set(float64(limit))
	w.log.Info("watching", zap.Strings("roots", w.opts.Roots), zap.Int("workers", w.opts.Workers),
		zap.Int("watch_budget", limit), zap.String("watch_budget_source", source))

	<-ctx.Done()
	w.mu.Lock()
	w.closed = true
	w.cond.Broadcast()
	w.mu.Unlock()
	wg.Wait()
	if err := src.Close(); err != nil {
		w.log.Warn("closing the event source", zap.Error(err))
	}
	return nil
}

// Stats returns a snapshot of the counters.
func (w *Watcher) Stats() Stats {
	w.mu.Lock()
	st := Stats{
		Files:       w.states[statePending] + w.states[stateTailing] + w.states[stateSkipped],
		Pending:     w.states[statePending],
		Tailing:     w.states[stateTailing],
		Skipped:     w.states[stateSkipped],
		Dirs:        len(w.dirs),
		TornTails:   w.torn,
		Watches:     w.budget.used,
		WatchBudget: w.budget.shown(),
		PolledDirs:  len(w.polled),
	}
	for d := range w.polled {
		st.PolledFiles += len(w.byDir[d])
	}
	for _, r := range w.roots {
		if !r.active {
			st.WaitingRoots++
		} else if r.polling {
			st.PollingRoots++
		}
	}
	w.mu.Unlock()
	st.BytesRead = w.bytesRead.Load()
	st.Lines = w.lines.Load()
	st.Events = w.events.Load()
	st.Overflows = w.overflows.Load()
	st.Rescans = w.rescans.Load()
	st.Errors = w.errs.Load()
	return st
}

// Reopen asks for the file at path (absolute, as in File.Path) to be opened again as
// Truncated, so that the sink compares all of it with what it mirrored, as after a
// rewrite: background verification calls it when it finds a file and its mirror copy
// differ. It reports whether the watcher knows the file.
func (w *Watcher) Reopen(path string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.files[path]
	if s == nil || s.dropped {
		return false
	}
	s.reopen = true
	w.scheduleLocked(s)
	return true
}

// worker reads the files handed to it until the watcher closes.
func (w *Watcher) worker(ctx context.Context) {
	lr := newLineReader(0, w.opts.MaxInlineBytes)
	for {
		s := w.next()
		if s == nil {
			return
		}
		b := w.bufs.Get().(*readBufs)
		lr.buf, lr.acc, lr.vbuf = b.buf, b.acc[:0], b.vbuf
		w.run(ctx, lr, s)
		b.acc = lr.acc
		lr.buf, lr.acc, lr.vbuf = nil, nil, nil
		w.bufs.Put(b)
		w.done(s)
	}
}

// readBufs are a worker's read buffer, line accumulator and re-read buffer (see
// lineReader), lent for one run. They are
// pooled rather than owned by the worker: while files are idle, the garbage collector
// takes them back (up to 4 × 256 KiB, plus accumulators grown by long lines).
type readBufs struct{ buf, acc, vbuf []byte }

// scheduleLocked queues s for a worker unless it is queued already; a file being read
// is marked dirty and queued again when its worker is done (one worker per file).
func (w *Watcher) scheduleLocked(s *fileState) {
	switch {
	case s.dropped || w.closed:
	case s.running:
		s.dirty = true
	case !s.queued:
		s.queued = true
		w.queue = append(w.queue, s)
		w.cond.Signal()
	}
}

// next blocks until a file is queued, and claims it; nil once the watcher is closed.
func (w *Watcher) next() *fileState {
	w.mu.Lock()
	defer w.mu.Unlock()
	for !w.closed && len(w.queue) == 0 {
		w.cond.Wait()
	}
	if w.closed {
		return nil
	}
	s := w.queue[0]
	w.queue[0] = nil
	w.queue = w.queue[1:]
	s.queued, s.running = false, true
	return s
}

// done releases s after a run, queueing it again if something happened meanwhile.
func (w *Watcher) done(s *fileState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s.running = false
	if s.initPending {
		s.initPending = false
		w.initLeft--
		w.checkReadyLocked()
	}
	if s.dirty {
		s.dirty = false
		w.scheduleLocked(s)
	}
}

func (w *Watcher) checkReadyLocked() {
	if w.initDone && w.initLeft == 0 && !w.readyDone {
		w.readyDone = true
		close(w.ready)
	}
}

// setStateLocked moves s to another files{state} ("" = forgotten).
func (w *Watcher) setStateLocked(s *fileState, state string) {
	if s.mstate == state {
		return
	}
	if s.mstate != "" {
		w.states[s.mstate]--
		w.m.files.WithLabelValues(s.mstate).Dec()
	}
	if state != "" {
		w.states[state]++
		w.m.files.WithLabelValues(state).Inc()
	}
	s.mstate = state
}

func (w *Watcher) setState(s *fileState, state string) {
	w.mu.Lock()
	w.setStateLocked(s, state)
	w.mu.Unlock()
}

func (w *Watcher) addRead(n int64) {
	if n > 0 {
		w.bytesRead.Add(n)
		w.m.readBytes.Add(float64(n))
	}
}

func (w *Watcher) countError(reason string) {
	w.errs.Add(1)
	w.m.errors.WithLabelValues(reason).Inc()
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Retry backoff after a sink error.
const (
	minBackoff = 200 * time.Millisecond
	maxBackoff = 30 * time.Second
)
