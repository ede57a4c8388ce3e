// Package publisher turns the lines the watcher finds into mirror messages: it owns the
// in-flight window, acknowledgements, retries, the resume protocol and checkpoints.
//
// Exactly-once rests on two things, neither of them the duplicate window: every line has
// a stable message id (conversation, generation, entry id), and before publishing past its
// acknowledged frontier — after a restart, or after any failed publish — the publisher asks
// the mirror which lines it already holds and skips them.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/semaphore"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/logx"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// Options configure a Publisher.
type Options struct {
	JS          jetstream.JetStream // see NewJetStream; lines go out through its connection (mirror.AsyncPublisher)
	Names       mirror.Names
	Owner       mirror.Owner
	Host        string
	Checkpoints *checkpoint.Store
	Logger      *zap.Logger
	Metrics     *Metrics

	WindowMessages int           // in-flight messages (default 1024)
	WindowBytes    int64         // in-flight bytes (default 32 MiB)
	BlobThreshold  int64         // lines above go to the object store (default 512 KiB)
	MaxLineBytes   int64         // lines above are skipped (default 1 GiB)
	CommitInterval time.Duration // checkpoint commits (default 200 ms)
	HeadInterval   time.Duration // head updates (default 500 ms)
	RetryMax       time.Duration // longest pause between retries (default 30 s)
	AckTimeout     time.Duration // a line's publish fails without acknowledgement by then (default 10 s)

	// Acked, if set, is called with each line's message as its acknowledgement arrives,
	// before the publisher sees it (benchmarks timestamp acknowledgements with it).
	Acked func(*nats.Msg)

	// Reopen asks the watcher to open the file at path again as rewritten (nil: the
	// file is reopened at its next line). The publisher calls it when another writer
	// (the session store) extended the generation it mirrors a file into.
	Reopen func(path string) bool

	// Unfenced leaves out the expected subject sequence of live lines (onewriter.go),
	// giving up the one-writer guarantee. Only for tests on an in-process nats-server
	// cluster: nats-server 2.15.2 reads stream.expectedPerSubjectSequence without its lock
	// in applyStreamMsgOp, which the race detector reports at a stream's first such
	// publish while other messages are applied (harmless outside the detector).
	Unfenced bool
}

// NewJetStream is the JetStream context for everything but the publishing of lines
// (which the publisher does over its connection with mirror.AsyncPublisher): its own
// asynchronous publishes time out after ackTimeout, and its pending limit sits above the
// window.
func NewJetStream(nc *nats.Conn, ackTimeout time.Duration, window int) (jetstream.JetStream, error) {
	return jetstream.New(nc,
		jetstream.WithPublishAsyncTimeout(ackTimeout),
		jetstream.WithPublishAsyncMaxPending(window+256))
}

// Publisher mirrors session lines; it implements watcher.Sink.
type Publisher struct {
	opts   Options
	log    *zap.Logger
	m      *Metrics
	reader *mirror.Reader
	writer *mirror.Writer
	async  *mirror.AsyncPublisher // the lines' publishes and their acknowledgements

	ackReady chan struct{}       // a result of a line's publish was set (see collectAcks)
	window   *semaphore.Weighted // bytes in flight
	slots    *semaphore.Weighted // messages in flight
	resyncs  *semaphore.Weighted // reconciliations asking the mirror (maxResyncs)
	back     connBack            // wakes the reconciliations waiting out an outage
	acks     chan pending        // publish order
	wg       sync.WaitGroup
	runCtx   context.Context
	cancel   context.CancelFunc
	closing  chan struct{}

	quarantined quarantineList
	gate        *gate // holds publishing back while the cluster has no room

	commitFailures logx.Run // consecutive, for rate-limited logging
	headFailures   logx.Run

	dirtyMu   sync.Mutex // guards the two sets below; taken after a file's mutex, never before
	dirtyCP   map[*fileState]struct{}
	dirtyHead map[*fileState]struct{}

	// mu guards the maps below. The order in which the publisher's mutexes may be taken
	// is in locksordering.txt.
	mu     sync.Mutex
	byPath map[string]watcher.FileID // absolute path (roots do not overlap: one per root and rel) → the file last opened there
	files  map[watcher.FileID]*fileState
	byConv map[string]watcher.FileID // conversation key → file carrying it (clash detection)
	// Registered files mirrored under a clash key, per conversation id, and the ids whose
	// clash this process reported: a clash whose keys come from checkpoints is reported
	// although no claim contests a key (see keptClashLocked).
	clashKeyed  map[string]int
	clashesSeen map[string]bool
	// Files inside Open: the keys they claimed are theirs before their state is registered.
	opening   map[watcher.FileID]int
	openingAt map[watcher.FileID]watcher.File // the files as the watcher announced them (log lines, Progress)
	// openingKeys is the key each Open in progress claimed (claimKey).
	openingKeys map[watcher.FileID]string
	// Deleted files are forgotten once their last state is recorded (see forgetGone), so
	// that a daemon running for months holds no state for files removed long ago.
	goneFiles map[*fileState]struct{} // reported Gone, not forgotten yet
	forgotten map[string]int          // root → deleted files forgotten, still counted as deleted

	view     startView         // the owner's conversations in one request, for the files seen at start
	pathKeys recordedClashKeys // clash keys of the checkpoints found at start, by path (p.mu)

	// storeGens: conversation key → the generation the session store writes, for the
	// conversations found taken over (DESIGN §8): the daemon never extends it again.
	storeGens map[string]int
	// skipped: the files found to be no session, and why (session.Reason*).
	skipped map[watcher.FileID]string

	shrinkMu sync.Mutex              // a leaf: see shrink.go
	shrinks  map[string]*shrinkState // conversation key → its newest generation's comparison
}

// New validates opts and binds the mirror. Call Start before handing it to the watcher.
func New(ctx context.Context, opts Options) (*Publisher, error) {
	if opts.JS == nil || opts.Checkpoints == nil {
		return nil, errors.New("publisher: JetStream and checkpoint store are required")
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	setDefault(&opts.WindowMessages, 1024)
	setDefault(&opts.WindowBytes, 32<<20)
	setDefault(&opts.BlobThreshold, 512<<10)
	setDefault(&opts.MaxLineBytes, 1<<30)
	setDefault(&opts.CommitInterval, 200*time.Millisecond)
	setDefault(&opts.HeadInterval, 500*time.Millisecond)
	setDefault(&opts.RetryMax, 30*time.Second)
	setDefault(&opts.AckTimeout, 10*time.Second)
	if nc := opts.JS.Conn(); nc != nil {
		if t := clampThreshold(opts.BlobThreshold, nc.MaxPayload()); t != opts.BlobThreshold {
			opts.Logger.Warn("blob threshold lowered below the server's max_payload: larger lines go to the object store",
				zap.Int64("configured", opts.BlobThreshold), zap.Int64("threshold", t), zap.Int64("max_payload", nc.MaxPayload()))
			opts.BlobThreshold = t
		}
	}
	if opts.BlobThreshold > opts.WindowBytes {
		return nil, fmt.Errorf("publisher: blob threshold %d above the in-flight window %d", opts.BlobThreshold, opts.WindowBytes)
	}
	r, err := mirror.NewReader(ctx, opts.JS, opts.Names, opts.Owner)
	if err != nil {
		return nil, err
	}
	w, err := mirror.NewWriter(ctx, opts.JS, opts.Names, opts.Owner)
	if err != nil {
		return nil, err
	}
	nc := opts.JS.Conn()
	if nc == nil {
		return nil, errors.New("publisher: the JetStream context has no connection")
	}
	// Its pending limit sits above the window, so that the window, not a stall, applies
	// backpressure.
	async, err := mirror.NewAsyncPublisher(nc, mirror.AsyncOptions{
		AckTimeout: opts.AckTimeout, MaxPending: opts.WindowMessages + 256, Acked: opts.Acked})
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	p := &Publisher{
		opts: opts, log: opts.Logger, m: opts.Metrics, reader: r, writer: w,
		async: async, ackReady: make(chan struct{}, 1),
		window:         semaphore.NewWeighted(opts.WindowBytes),
		slots:          semaphore.NewWeighted(int64(opts.WindowMessages)),
		resyncs:        semaphore.NewWeighted(maxResyncs),
		acks:           make(chan pending, opts.WindowMessages),
		closing:        make(chan struct{}),
		commitFailures: logx.Run{Every: 100}, headFailures: logx.Run{Every: 1000},
		files:   map[watcher.FileID]*fileState{},
		byPath:  map[string]watcher.FileID{},
		dirtyCP: map[*fileState]struct{}{}, dirtyHead: map[*fileState]struct{}{},
		byConv:     map[string]watcher.FileID{},
		clashKeyed: map[string]int{}, clashesSeen: map[string]bool{}, skipped: map[watcher.FileID]string{},
		opening: map[watcher.FileID]int{}, openingAt: map[watcher.FileID]watcher.File{}, openingKeys: map[watcher.FileID]string{},
		goneFiles: map[*fileState]struct{}{}, forgotten: map[string]int{},
		gate:      newGate(opts.Metrics, opts.Logger, opts.RetryMax),
		storeGens: map[string]int{},
		shrinks:   map[string]*shrinkState{},
	}
	p.m.state.p.Store(p)
	return p, nil
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Start launches the acknowledgement and flush loops. They run until Close.
func (p *Publisher) Start() {
	p.runCtx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(3)
	go p.collectAcks()
	go p.commitLoop()
	go p.headLoop()
	if nc := p.opts.JS.Conn(); nc != nil {
		p.wg.Add(1)
		go p.back.watch(p.runCtx, &p.wg, nc)
	}
}

// Close drains: it waits (until ctx ends) for the lines in flight to be acknowledged, then
// commits checkpoints and heads and stops the loops. Call it after the watcher has stopped,
// so that nothing new arrives.
func (p *Publisher) Close(ctx context.Context) error {
	drained := p.waitIdle(ctx)
	close(p.closing)
	p.cancel()
	p.wg.Wait()
	p.async.Close()
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := p.flush(fctx)
	if !drained {
		p.log.Warn("shutdown before every line in flight was acknowledged; they are published again at next start",
			zap.Int("in_flight", p.inFlight()))
	}
	return err
}

// waitIdle polls until nothing is in flight or ctx ends.
func (p *Publisher) waitIdle(ctx context.Context) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if p.inFlight() == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

func (p *Publisher) inFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, st := range p.files {
		st.mu.Lock()
		n += len(st.queue)
		st.mu.Unlock()
	}
	return n
}

// commitLoop commits checkpoints at their interval; heads have a loop of their own, so
// that a NATS outage, which stalls head updates, never delays a checkpoint.
func (p *Publisher) commitLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.opts.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-p.runCtx.Done():
			return
		case <-t.C:
			p.stageCheckpoints()
			forgetting := p.forgetGone()
			if err := p.opts.Checkpoints.Commit(); err != nil {
				if n, log := p.commitFailures.Hit(); log {
					p.log.Error("checkpoint commit failed; publishing goes on and the mirror is consulted at restart",
						zap.Int64("failures", n), zap.Error(err))
				}
			} else {
				p.commitFailures.End()
				p.forget(forgetting)
			}
		}
	}
}

// headLoop writes heads at their interval.
func (p *Publisher) headLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.opts.HeadInterval)
	defer t.Stop()
	for {
		select {
		case <-p.runCtx.Done():
			return
		case <-t.C:
			p.flushHeads(p.runCtx)
			p.checkShrinks(p.runCtx)
		}
	}
}

// flush is the last commit, at stop: checkpoints, heads, then the checkpoints again if
// heads were written, so that the next start knows them written (the loops leave that to
// each file's next checkpoint, see flushHeads).
func (p *Publisher) flush(ctx context.Context) error {
	p.stageCheckpoints()
	err := p.opts.Checkpoints.Commit()
	p.flushHeads(ctx)
	// Record the heads written since each file's last checkpoint (now, or earlier by the
	// head loop: an idle file has no next checkpoint), so that the next start does not
	// write them all again (TestStartCostScalesWithChangedFiles).
	unrecorded := 0
	for _, st := range p.snapshotFiles() {
		st.mu.Lock()
		if st.headSeq > st.recordedHeadSeq {
			st.cpDirty = true
			p.mark(&p.dirtyCP, st)
			unrecorded++
		}
		st.mu.Unlock()
	}
	if unrecorded > 0 {
		p.stageCheckpoints()
		if cerr := p.opts.Checkpoints.Commit(); err == nil {
			err = cerr
		}
	}
	return err
}

func (p *Publisher) snapshotFiles() []*fileState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.filesLocked()
}

// filesLocked lists the files' states. The caller holds p.mu.
func (p *Publisher) filesLocked() []*fileState {
	out := make([]*fileState, 0, len(p.files))
	for _, st := range p.files {
		out = append(out, st)
	}
	return out
}

// noteDirty queues st for the next checkpoint commit and head update: the flush loops
// then touch only the files whose frontier moved, not every file known (100k on a big
// host, most of them idle).
func (p *Publisher) noteDirty(st *fileState) {
	p.mark(&p.dirtyCP, st)
	p.mark(&p.dirtyHead, st)
}

// mark adds st to one of the dirty sets.
func (p *Publisher) mark(set *map[*fileState]struct{}, st *fileState) {
	p.dirtyMu.Lock()
	(*set)[st] = struct{}{}
	p.dirtyMu.Unlock()
}

// takeDirty returns and clears one of the dirty sets.
func (p *Publisher) takeDirty(set *map[*fileState]struct{}) []*fileState {
	p.dirtyMu.Lock()
	defer p.dirtyMu.Unlock()
	out := make([]*fileState, 0, len(*set))
	for st := range *set {
		out = append(out, st)
	}
	*set = make(map[*fileState]struct{}, len(out))
	return out
}

// stageCheckpoints stages the record of every file whose frontier moved.
func (p *Publisher) stageCheckpoints() {
	for _, st := range p.takeDirty(&p.dirtyCP) {
		st.mu.Lock()
		if st.cpDirty {
			st.cpDirty = false
			rec := st.record()
			p.recordShrink(&rec)
			p.opts.Checkpoints.Put(rec)
			st.recordedHeadSeq = st.headSeq
		}
		st.mu.Unlock()
	}
}

// flushHeads writes the head of every conversation whose frontier moved, a few at a time,
// and returns the files whose head it wrote.
func (p *Publisher) flushHeads(ctx context.Context) []*fileState {
	type job struct {
		st       *fileState
		conv     mirror.Conv
		head     mirror.Head
		storeGen int // the session store writes the conversation: only Local is ours
	}
	var jobs []job
	for _, st := range p.takeDirty(&p.dirtyHead) {
		// A key another file took over (this one vanished, and a file with the same id
		// claimed it before the watcher reported the removal) has that file's head: this
		// one's last state must not be written over it. Nor may a state its file's
		// reopening replaced (moved, rewritten: same identity, same key) write its older
		// path or frontier over its successor's head: both would write at once, and the
		// older one could land last, a head naming a path the file left or behind its
		// lines.
		p.mu.Lock()
		own := p.byConv[st.conv.Key] == st.file.ID && p.files[st.file.ID] == st // conv and file.ID never change
		p.mu.Unlock()
		st.mu.Lock()
		switch {
		case !own && st.gone:
			st.headDirty, st.goneHeadWritten = false, true // nothing of ours to record
		case !own:
			st.headDirty = false // a state being replaced: its successor writes the head
		case st.headDirty && st.acked.StreamSeq > 0 && st.storeGen != 0 && st.storeGen == st.acked.Generation:
			st.headDirty = false // the store's generation: its head is the store's to write
		case st.headDirty && st.acked.StreamSeq > 0:
			st.headDirty = false
			h := st.head(p.opts.Host)
			h.Shrunk = p.shrunkFor(st.conv.Key, h.Generation, h.Entries)
			jobs = append(jobs, job{st, st.conv, h, st.storeGen})
		}
		st.mu.Unlock()
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var writtenMu sync.Mutex
	written := make([]*fileState, 0, len(jobs))
	for _, j := range jobs {
		sem <- struct{}{}
		wg.Add(1)
		go func(j job) {
			defer func() { <-sem; wg.Done() }()
			hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			err := p.putHead(hctx, j.st, j.conv, j.head, j.storeGen)
			if err != nil {
				p.m.headUpdates.WithLabelValues("error").Inc()
				if n, log := p.headFailures.Hit(); log {
					p.log.Warn("head update failed; retried at next flush", zap.Int64("failures", n),
						zap.String("conversation", j.conv.Key), zap.Error(err))
				}
				j.st.mu.Lock()
				j.st.headDirty = true
				j.st.mu.Unlock()
				p.mark(&p.dirtyHead, j.st)
				return
			}
			p.m.headUpdates.WithLabelValues("ok").Inc()
			if j.head.LocalDeleted {
				j.st.mu.Lock()
				j.st.goneHeadWritten = true
				j.st.mu.Unlock()
			}
			// Recorded by the file's next checkpoint, so that a restart knows the head is
			// written (see Open). Not a checkpoint of its own: that would double the
			// commits of a live file; a crash before the next one costs a head written
			// twice.
			j.st.mu.Lock()
			j.st.headSeq = max(j.st.headSeq, j.head.LastSeq)
			j.st.mu.Unlock()
			writtenMu.Lock()
			written = append(written, j.st)
			writtenMu.Unlock()
			if p.headFailures.End() > 0 {
				p.log.Info("head updates resumed")
			}
		}(j)
	}
	wg.Wait()
	return written
}
