package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/publisher"
	"github.com/pisync/pisync/watcher"
)

// The tenant, owner and host every case publishes under, pisync and raw alike, so that
// subjects and headers are the same bytes.
const (
	benchTenant = "bench"
	benchOwner  = "bench"
	benchHost   = "bench"
)

func owner(tb testing.TB) mirror.Owner {
	o, err := mirror.NewOwner(benchTenant, benchOwner)
	if err != nil {
		tb.Fatal(err)
	}
	return o
}

// target is a JetStream to mirror into: one embedded server, or a 3-node cluster.
type target struct {
	url      string
	replicas int
	stop     func()
	storeDir []string
	// serverCPU, for a server in a child process, stops it and returns its CPU time.
	serverCPU func() time.Duration
	// serverReads, for a server in a child process, counts its read system calls so far
	// (/proc/<pid>/io): how finely a side's messages reach it.
	serverReads func() int64
	// serverAPI, for a server in a child process, counts the JetStream API requests it
	// has served so far (its monitoring endpoint's /varz).
	serverAPI func() int64
	// serverPeak, for a server in a child process, is its peak RSS so far (VmHWM).
	serverPeak func() int64
	// profPort, for a server in a child process under -server-profile, is its pprof port.
	profPort int
}

// newTarget starts a fresh embedded JetStream server (replicas 1) or a 3-node cluster
// on loopback (replicas 3), with the mirror provisioned.
func newTarget(tb testing.TB, replicas int) *target {
	tb.Helper()
	t := &target{replicas: replicas}
	var cluster *natstest.Cluster
	if replicas == 3 {
		cluster = natstest.RunCluster(tb, 3)
		t.url, t.stop = cluster.URLs(), cluster.Stop
		for _, n := range cluster.Nodes {
			t.storeDir = append(t.storeDir, n.StoreDir())
		}
	} else {
		s := natstest.Run(tb)
		t.url, t.stop, t.storeDir = s.URL(), s.Stop, []string{s.StoreDir()}
	}
	nc := t.connect(tb)
	js := jsOf(tb, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := mirror.Provision(ctx, js, mirror.DefaultNames(), mirror.Config{Replicas: replicas}); err != nil {
		tb.Fatal(err)
	}
	nc.Close()
	if cluster != nil {
		// Clients connect to the entries stream's leader, pisync and raw alike: which node
		// a client lands on (one hop more or less) would otherwise vary from run to run.
		deadline := time.Now().Add(30 * time.Second)
		for cluster.StreamLeader(mirror.DefaultNames().Stream()) == nil {
			if time.Now().After(deadline) {
				tb.Fatal("no leader for the entries stream")
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.url = cluster.StreamLeader(mirror.DefaultNames().Stream()).URL()
	}
	return t
}

func (t *target) connect(tb testing.TB) *nats.Conn {
	tb.Helper()
	return natstest.Connect(tb, t.url)
}

// close stops the server(s) and removes their stores at once (not at the end of the
// benchmark), so that a later run does not share the disk with old stores.
func (t *target) close() {
	t.stop()
	for _, d := range t.storeDir {
		os.RemoveAll(d)
	}
}

// jsOf is the JetStream API over nc.
func jsOf(tb testing.TB, nc *nats.Conn) jetstream.JetStream {
	tb.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}

// streamMsgs is the number of messages in the entries stream.
func streamMsgs(tb testing.TB, nc *nats.Conn) uint64 {
	tb.Helper()
	return streamMsgsOf(tb, jsOf(tb, nc), mirror.DefaultNames().Stream())
}

// streamMsgsOf is the number of messages in stream name, 0 while it does not exist (a
// caller expecting messages fails on the count).
func streamMsgsOf(tb testing.TB, js jetstream.JetStream, name string) uint64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0
	}
	if err != nil {
		tb.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return info.State.Msgs
}

// rawPublish is the ceiling: it publishes every line of w with PublishMsgAsync — the
// subjects, headers and bodies pisync sends (blob payloads put into the object store
// first, as pisync does), through a JetStream context configured like pisync's, under
// the same window — and waits for every acknowledgement. The metadata of each line was
// computed when the workload was written, so the ceiling pays for publishing only. Like
// pisync's watcher, -raw-workers goroutines take the files in turn.
func rawPublish(tb testing.TB, nc *nats.Conn, w *workload, window int) {
	tb.Helper()
	js, err := publisher.NewJetStream(nc, 30*time.Second, window)
	if err != nil {
		tb.Fatal(err)
	}
	acks := make(chan jetstream.PubAckFuture, window)
	var failed error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for fut := range acks {
			select {
			case <-fut.Ok():
			case err := <-fut.Err():
				if failed == nil {
					failed = err
				}
			}
		}
	}()
	publishLines(tb, js, w, func(m *nats.Msg) error {
		fut, err := js.PublishMsgAsync(m)
		if err == nil {
			acks <- fut
		}
		return err
	})
	close(acks)
	<-done
	if failed != nil {
		tb.Fatalf("raw publish: %v", failed)
	}
}

// rawCorePublish is rawPublish through mirror.AsyncPublisher, the publisher's own
// acknowledgement tracking over core NATS (one reply subject per message under one
// inbox subscription), read in publish order as the publisher reads them: the ceiling
// without nats.go's per-message future, timer, channels and JSON parse.
func rawCorePublish(tb testing.TB, nc *nats.Conn, w *workload, window int) {
	tb.Helper()
	js, err := publisher.NewJetStream(nc, 30*time.Second, window)
	if err != nil {
		tb.Fatal(err)
	}
	ap, err := mirror.NewAsyncPublisher(nc, mirror.AsyncOptions{AckTimeout: 30 * time.Second, MaxPending: window + 256})
	if err != nil {
		tb.Fatal(err)
	}
	defer ap.Close()
	notify := make(chan struct{}, 1)
	acks := make(chan *mirror.Pending, window)
	slots := make(chan struct{}, window) // the window: pisync's in-flight bound
	var failed error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for pd := range acks {
			for !pd.Done() {
				<-notify
			}
			if _, err, _ := pd.Result(); err != nil && failed == nil {
				failed = err
			}
			ap.Release(pd)
			<-slots
		}
	}()
	publishLines(tb, js, w, func(m *nats.Msg) error {
		slots <- struct{}{}
		pd, err := ap.Publish(m, notify)
		if err != nil {
			<-slots
			return err
		}
		acks <- pd
		return nil
	})
	close(acks)
	<-done
	if failed != nil {
		tb.Fatalf("raw core publish: %v", failed)
	}
}

// publishLines hands every line of w, as the message pisync sends, to publish, from
// -raw-workers goroutines taking the files in turn.
func publishLines(tb testing.TB, js jetstream.JetStream, w *workload, publish func(*nats.Msg) error) {
	tb.Helper()
	ctx := context.Background()
	obj, err := js.ObjectStore(ctx, mirror.DefaultNames().BlobsBucket())
	if err != nil {
		tb.Fatal(err)
	}
	o := owner(tb)
	var next atomic.Int64
	errs := make(chan error, max(*flagRawWorkers, 1))
	var wg sync.WaitGroup
	for range max(*flagRawWorkers, 1) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(w.files) {
					return
				}
				if err := rawFile(ctx, obj, o, w.files[i], publish); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatal(err)
	}
}

// rawFile publishes the lines of one file.
func rawFile(ctx context.Context, obj jetstream.ObjectStore, o mirror.Owner, f *sessionFile, publish func(*nats.Msg) error) error {
	names := mirror.DefaultNames()
	content, err := os.ReadFile(f.path)
	if err != nil {
		return err
	}
	metas, err := readMeta(f.meta)
	if err != nil {
		return err
	}
	conv, err := mirror.NewConv(o, f.id)
	if err != nil {
		return err
	}
	var format string
	off := int64(0)
	for ord, m := range metas {
		line := content[off : off+m.len]
		off += m.len + 1
		if ord == 0 {
			format = formatOf(line)
		}
		l := mirror.Line{Kind: m.kind, EntryID: m.entryID, ParentID: m.parentID, EntryType: m.entryType,
			Ordinal: int64(ord), Generation: 1, SHA256: m.sha, Format: format, Host: benchHost, Source: f.rel}
		body := line
		if m.kind == mirror.KindBlob {
			if _, err := obj.Put(ctx, jetstream.ObjectMeta{Name: o.ObjectName(m.sha)}, bytes.NewReader(line)); err != nil {
				return err
			}
			l.BlobSize, body = m.len, nil
		}
		if err := publish(names.NewMsg(conv, l, body)); err != nil {
			return err
		}
	}
	return nil
}

// pipeline is pisync's watcher and publisher in this process, wired as cmd/pisync wires
// them (without the periodic rescan, which a back-fill never reaches).
type pipeline struct {
	pub    *publisher.Publisher
	wat    *watcher.Watcher
	store  *checkpoint.Store
	cancel context.CancelFunc
	done   chan error
	closed bool
}

// startPisync mirrors the files under root into the JetStream at nc. acked, if set, is
// called with each line's message as its acknowledgement arrives (the latency case
// records acks).
func startPisync(tb testing.TB, nc *nats.Conn, root string, window int, acked func(*nats.Msg)) *pipeline {
	tb.Helper()
	js, err := publisher.NewJetStream(nc, 10*time.Second, window)
	if err != nil {
		tb.Fatal(err)
	}
	store, _, err := checkpoint.Open(tb.TempDir(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pub, err := publisher.New(ctx, publisher.Options{JS: js, Names: mirror.DefaultNames(), Owner: owner(tb),
		Host: benchHost, Checkpoints: store, WindowMessages: window, AckTimeout: 10 * time.Second, Acked: acked})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	pub.Start()
	wat, err := watcher.New(watcher.Options{Roots: []string{root}, Sink: pub, RescanInterval: 0})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	p := &pipeline{pub: pub, wat: wat, store: store, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- wat.Run(ctx) }()
	tb.Cleanup(func() { p.stop(tb) })
	return p
}

// mirrored is the number of bytes acknowledged, over every root.
func (p *pipeline) mirrored() int64 {
	var n int64
	for _, r := range p.pub.Progress().Roots {
		n += r.MirroredBytes
	}
	return n
}

// waitMirrored polls until want bytes are acknowledged. The poll period is far below
// the run times measured.
func (p *pipeline) waitMirrored(tb testing.TB, want int64, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for p.mirrored() < want {
		if time.Now().After(deadline) {
			tb.Fatalf("mirrored %d of %d bytes after %v", p.mirrored(), want, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop stops the watcher, drains the publisher (heads and checkpoints written) and
// closes the checkpoint store.
func (p *pipeline) stop(tb testing.TB) {
	if p.closed {
		return
	}
	p.closed = true
	p.cancel()
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.pub.Close(ctx); err != nil {
		tb.Errorf("publisher close: %v", err)
	}
	if err := p.store.Close(); err != nil {
		tb.Errorf("checkpoint store close: %v", err)
	}
}

var flagRawWorkers = flag.Int("raw-workers", 4, "raw ceiling: goroutines publishing files at once (pisync's watcher has 4)")

// backfillResult is one back-fill run: pisync and the raw ceiling on fresh targets.
type backfillResult struct {
	pisync, raw time.Duration
	others      float64 // % of the machine used by other processes
}

var backfillRuns sync.Map // name → runs so far, to alternate which side goes first

// runBackfill mirrors w with pisync and publishes it raw, each on a fresh target of the
// same kind, and checks that both stored every line. Dirty pages are flushed between
// the two so that one does not pay for the other's writes; the side that goes first
// alternates from run to run.
func runBackfill(tb testing.TB, name string, w *workload, replicas, window int) backfillResult {
	tb.Helper()
	n, _ := backfillRuns.LoadOrStore(name, new(int))
	runs := n.(*int)
	*runs++
	var res backfillResult
	// side times publish on a fresh target, then checks every line is in the stream;
	// what publish returns runs untimed before the check.
	side := func(label string, elapsed *time.Duration, publish func(nc *nats.Conn) (after func())) func() {
		return func() {
			t := newTarget(tb, replicas)
			defer t.close()
			nc := t.connect(tb)
			defer nc.Close()
			settle()
			stopProfile := profile(tb, name+"-"+label)
			start := time.Now()
			after := publish(nc)
			*elapsed = time.Since(start)
			stopProfile()
			after()
			if got := streamMsgs(tb, nc); got != uint64(w.lines) {
				tb.Fatalf("%s: %d messages in the stream, want %d", label, got, w.lines)
			}
		}
	}
	sides := []func(){
		side("raw", &res.raw, func(nc *nats.Conn) func() {
			rawPublish(tb, nc, w, window)
			return func() {}
		}),
		side("pisync", &res.pisync, func(nc *nats.Conn) func() {
			p := startPisync(tb, nc, w.root, window, nil)
			p.waitMirrored(tb, w.bytes, 30*time.Minute)
			return func() { p.stop(tb) }
		}),
	}
	if *runs%2 == 0 {
		sides[0], sides[1] = sides[1], sides[0]
	}
	load := startLoad()
	for _, side := range sides {
		side()
	}
	res.others = load.othersPercent(0)
	return res
}

func reportBackfill(b *testing.B, w *workload, r backfillResult) {
	ps, rs := r.pisync.Seconds(), r.raw.Seconds()
	b.ReportMetric(float64(w.lines)/ps, "entries/s")
	b.ReportMetric(float64(w.bytes)/ps/1e6, "MB/s")
	b.ReportMetric(float64(w.lines)/rs, "raw-entries/s")
	b.ReportMetric(float64(w.bytes)/rs/1e6, "raw-MB/s")
	b.ReportMetric(rs/ps, "ratio")
	b.ReportMetric(ps, "pisync-s")
	b.ReportMetric(rs, "raw-s")
	b.ReportMetric(r.others, "others-cpu-%")
}
