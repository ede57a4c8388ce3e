package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/logx"
	"github.com/pisync/pisync/internal/natsconn"
	"github.com/pisync/pisync/internal/rootlock"
	"github.com/pisync/pisync/internal/sysmem"
	"github.com/pisync/pisync/internal/verify"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/publisher"
	"github.com/pisync/pisync/watcher"
)

// runFlags configure the daemon.
type runFlags struct {
	conn           connFlags
	roots          listFlag
	httpAddr       string
	host           string
	logLevel       string
	logFormat      string
	replicas       int
	dupWindow      time.Duration
	blobThreshold  int64
	maxLineBytes   int64
	window         int
	windowBytes    int64
	ackTimeout     time.Duration
	rescanInterval time.Duration
	drainTimeout   time.Duration
	provision      string
	verifyInterval time.Duration
	verifyRate     float64
	verifyFirst    float64
	pprof          bool
}

func (f *runFlags) register(fs *flag.FlagSet) {
	f.conn.register(fs)
	registerRoots(fs, &f.roots, "session root to watch, recursively")
	fs.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:9470", "HTTP address of /metrics, /healthz, /readyz and the status page (empty: off)")
	host, _ := os.Hostname()
	fs.StringVar(&f.host, "host", host, "host name recorded with every mirrored line")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", "json", "log format: json or console")
	fs.IntVar(&f.replicas, "replicas", 1, "stream, bucket and object store replicas (3 in a cluster)")
	fs.DurationVar(&f.dupWindow, "duplicate-window", mirror.DefaultDuplicateWindow, "JetStream duplicate window (a retry aid; minutes, never days)")
	fs.Int64Var(&f.blobThreshold, "blob-threshold", 512<<10, "lines above this many bytes go to the object store")
	fs.Int64Var(&f.maxLineBytes, "max-line-bytes", 1<<30, "lines above this many bytes are skipped and reported")
	fs.IntVar(&f.window, "window", 1024, "messages in flight at most")
	fs.Int64Var(&f.windowBytes, "window-bytes", 32<<20, "bytes in flight at most")
	fs.DurationVar(&f.ackTimeout, "ack-timeout", 10*time.Second, "time to wait for a publish acknowledgement before retrying")
	fs.DurationVar(&f.rescanInterval, "rescan-interval", time.Minute, "periodic safety rescan of the roots (stat only; 0: off)")
	fs.StringVar(&f.provision, "provision", string(mirror.ProvisionCreate), "stream and buckets: create (what is missing), update (to these flags) or off (must exist)")
	fs.DurationVar(&f.verifyInterval, "verify-interval", 10*time.Minute, "background verification of local files against the mirror, one pass per interval (0: off)")
	fs.Float64Var(&f.verifyRate, "verify-rate", 20, "background verification: files per second at most")
	fs.Float64Var(&f.verifyFirst, "verify-first-rate", 1, "background verification of files never verified (first start, state directory lost): files per second at most (0: --verify-rate)")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 15*time.Second, "at shutdown, how long to wait for publishes in flight")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go's profiles (net/http/pprof) under /debug/pprof/ on --http-addr")
}

// RunCommand runs the daemon until ctx ends, then shuts down gracefully: stop reading,
// drain the publisher, commit checkpoints, close NATS, stop the embedded server.
func RunCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f runFlags
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(f.logLevel, f.logFormat, stderr)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	defer log.Sync() //nolint:errcheck // nothing to do about a failed flush at exit
	d, err := startDaemon(ctx, &f, log)
	if err != nil {
		if ctx.Err() != nil {
			// SIGTERM or SIGINT during start-up (waiting for NATS, say): a stop that was
			// asked for, not a failure, so the exit status says success.
			log.Info("stopped during start-up", zap.Error(err))
			return nil
		}
		return err
	}
	<-ctx.Done()
	log.Info("shutting down")
	return d.stop()
}

// daemon is a running pisync: the parts in start-up order.
type daemon struct {
	f        *runFlags
	log      *zap.Logger
	reg      *prometheus.Registry
	embedded *server.Server
	nc       *nats.Conn
	store    *checkpoint.Store
	pub      *publisher.Publisher
	watch    *watcher.Watcher
	http     *httpServer

	watchCancel  context.CancelFunc
	watchDone    chan error
	scanDone     chan struct{} // closed when the work after the first scan is over
	verifyCancel context.CancelFunc
	verifyDone   chan struct{}
	memCancel    context.CancelFunc
	memDone      chan struct{}
	jsWait       *natsconn.JetStreamWait // set before HTTP starts
	up           atomic.Bool             // every part started: HTTP handlers may use them
	locks        []*rootlock.Lock        // the roots, against a follower writing them
}

func startDaemon(ctx context.Context, f *runFlags, log *zap.Logger) (d *daemon, err error) {
	log = withRecentLog(log) // the status page lists the most recent warnings and errors
	started := &daemon{f: f, log: log, reg: newRegistry()}
	d = started
	defer func() {
		if err != nil {
			started.abort() // not d: the error returns set it to nil
		}
	}()
	names, err := mirror.NewNames(f.conn.prefix)
	if err != nil {
		return nil, fmt.Errorf("%w: --prefix: %v", errUsage, err)
	}
	owner, err := mirror.NewOwner(f.conn.tenant, f.conn.owner)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	for _, root := range f.roots.get() {
		l, err := rootlock.Acquire(root, "pisync run")
		if err != nil {
			return nil, err
		}
		d.locks = append(d.locks, l)
	}
	if err := os.MkdirAll(f.conn.stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", f.conn.stateDir, err)
	}
	secureStateDir(log, f.conn.stateDir)
	nm := natsconn.NewMetrics(d.reg)
	d.jsWait = natsconn.NewJetStreamWait(log, nm)
	// HTTP first: /healthz answers (and /readyz says why not) while NATS is retried, so
	// that a liveness probe does not restart a daemon that is only waiting.
	if f.httpAddr != "" {
		if d.http, err = startHTTP(f.httpAddr, d); err != nil {
			return nil, err
		}
	}
	if f.conn.natsURL == "" {
		if d.embedded, err = f.conn.startEmbedded(log); err != nil {
			return nil, err
		}
		collectEmbeddedMore()
	}
	if d.nc, err = f.conn.connect(ctx, "pisync run "+f.host, 0, log, nm,
		nats.CustomInboxPrefix(owner.InboxPrefix())); err != nil {
		return nil, err
	}
	js, err := publisher.NewJetStream(d.nc, f.ackTimeout, f.window)
	if err != nil {
		return nil, err
	}
	// Until stopped, as the connection: a daemon that gave up would be restarted by its
	// supervisor, and after a cluster-wide outage the whole fleet with it.
	if err := d.jsWait.Do(ctx, 0, "provision the mirror", func(ctx context.Context) error {
		if err := mirror.Provision(ctx, js, names, mirror.Config{Mode: mirror.ProvisionMode(f.provision),
			Replicas: f.replicas, DuplicateWindow: f.dupWindow}); err != nil {
			return err
		}
		_, err := mirror.Bind(ctx, js, names) // each object's leader answers
		return err
	}); err != nil {
		return nil, err
	}
	var rebuilt bool
	if d.store, rebuilt, err = checkpoint.Open(filepath.Join(f.conn.stateDir, "checkpoints"), checkpoint.NewMetrics(d.reg)); err != nil {
		return nil, err
	}
	if rebuilt {
		log.Warn("checkpoint store was unreadable and has been replaced; positions are rebuilt from the mirror")
	}
	d.pub, err = publisher.New(ctx, publisher.Options{
		JS: js, Names: names, Owner: owner, Host: f.host, Checkpoints: d.store,
		Logger: log.Named("publisher"), Metrics: publisher.NewMetrics(d.reg),
		WindowMessages: f.window, WindowBytes: f.windowBytes, AckTimeout: f.ackTimeout,
		BlobThreshold: f.blobThreshold, MaxLineBytes: f.maxLineBytes,
		// Set before the watcher exists: the publisher calls it only once lines flow.
		Reopen:   func(path string) bool { return d.watch != nil && d.watch.Reopen(path) },
		Unfenced: unfencedForTests.Load(),
	})
	if err != nil {
		return nil, err
	}
	d.pub.Start()
	d.watch, err = watcher.New(watcher.Options{
		Roots: f.roots.get(), Sink: d.pub, Logger: log.Named("watcher"), Metrics: watcher.NewMetrics(d.reg),
		MaxInlineBytes: f.blobThreshold, RescanInterval: f.rescanInterval,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	d.watchCancel, d.watchDone = wcancel, make(chan error, 1)
	// Not d in the goroutine: a failed start below returns nil into d while it runs.
	go func() { started.watchDone <- started.watch.Run(wctx) }()
	if err := d.startVerifier(js, names, owner); err != nil {
		return nil, err
	}
	mctx, mcancel := context.WithCancel(context.Background())
	d.memCancel, d.memDone = mcancel, make(chan struct{})
	go func() {
		defer close(d.memDone)
		releaseMemory(mctx, log, func() error { return started.store.ReleasePages(sysmem.Unmap) })
	}()
	d.up.Store(true)
	log.Info("pisync running", zap.Strings("roots", f.roots.get()), zap.String("nats", logx.URL(f.conn.url())),
		zap.String("tenant", owner.Tenant), zap.String("owner", owner.Name), zap.String("http", f.httpAddr))
	d.scanDone = make(chan struct{})
	go func() {
		defer close(d.scanDone)
		select {
		case <-d.watch.Ready():
			log.Info("initial scan done")
			d.pruneCheckpoints(wctx)
		case <-wctx.Done():
		}
	}()
	return d, nil
}

// pruneCheckpoints removes the checkpoints of session files deleted while the daemon was
// stopped, marking their heads deleted (see publisher.PruneCheckpoints).
func (d *daemon) pruneCheckpoints(ctx context.Context) {
	n, err := d.pub.PruneCheckpoints(ctx, absRoots(d.f.roots.get()))
	switch {
	case err != nil && ctx.Err() == nil:
		d.log.Warn("could not look for files deleted while stopped", zap.Error(err))
	case n > 0:
		d.log.Info("forgot session files deleted while stopped", zap.Int("files", n))
	}
}

// absRoots returns the roots as the watcher names them: absolute and clean.
func absRoots(roots []string) []string {
	var out []string
	for _, r := range roots {
		if abs, err := filepath.Abs(r); err == nil {
			out = append(out, filepath.Clean(abs))
		}
	}
	return out
}

// startVerifier runs background verification of the mirrored files.
func (d *daemon) startVerifier(js jetstream.JetStream, names mirror.Names, owner mirror.Owner) error {
	vm := verify.NewVerifyMetrics(d.reg)
	roots := absRoots(d.f.roots.get())
	vm.Init(roots)
	ctx, cancel := context.WithCancel(context.Background())
	r, err := mirror.NewReader(ctx, js, names, owner)
	if err != nil {
		cancel()
		return err
	}
	bg := &verify.Background{
		Mirror: r, Interval: d.f.verifyInterval, Rate: d.f.verifyRate,
		// A host without verdicts (an upgrade of the fleet, a lost state directory) gathers
		// them at this rate, not at --verify-rate all at once: a fleet restarted together
		// must not read every file of every host at once.
		FirstRate: d.f.verifyFirst,
		// Kept across restarts: a restarted daemon reads only the files that changed.
		StateFile: filepath.Join(d.f.conn.stateDir, "verified.json"),
		Logger:    d.log.Named("verify"), Metrics: vm,
		OnDrift: func(t verify.Target, _ verify.Drift) {
			// Drift is a rewrite the watcher did not see (or a hole in the mirror):
			// reopening compares the whole file with the mirror, republishes what is
			// missing and starts a new generation if a mirrored line changed.
			if d.watch.Reopen(t.Path) {
				d.log.Info("drift found by verification; reopening the file as rewritten", zap.String("path", t.Path))
			}
		},
		List: func() []verify.Target {
			// Wait for the first scan: before it, most files would look unmirrored.
			select {
			case <-d.watch.Ready():
			case <-ctx.Done():
				return nil
			}
			var ts []verify.Target
			for _, f := range d.pub.Files() {
				if f.Synced {
					ts = append(ts, verify.Target{Root: f.Root, Path: f.Path, Key: f.Key})
				}
			}
			return ts
		},
	}
	d.verifyCancel, d.verifyDone = cancel, make(chan struct{})
	go func() {
		defer close(d.verifyDone)
		bg.Run(ctx)
	}()
	return nil
}

func (d *daemon) stopVerifier() {
	if d.verifyCancel != nil {
		d.verifyCancel()
		<-d.verifyDone
		d.verifyCancel = nil
	}
}

func (d *daemon) stopMemoryRelease() {
	if d.memCancel != nil {
		d.memCancel()
		<-d.memDone
		d.memCancel = nil
	}
}

// ready reports whether NATS is reachable and the first scan is done.
func (d *daemon) ready() (bool, string) {
	if !d.up.Load() {
		if why := d.jsWait.Reason(); why != "" {
			return false, "starting: waiting for JetStream: " + why
		}
		return false, "starting: connecting to NATS"
	}
	if d.nc == nil || !d.nc.IsConnected() {
		return false, "NATS not connected"
	}
	select {
	case <-d.watch.Ready():
		return true, "ready"
	default:
		return false, "initial scan in progress"
	}
}

// stop shuts down in order: stop reading → drain the publisher → save state → close
// NATS → stop the embedded server.
func (d *daemon) stop() error {
	var errs []error
	if d.http != nil {
		errs = append(errs, d.http.stop())
	}
	d.stopVerifier()
	d.stopMemoryRelease()
	d.watchCancel()
	if err := <-d.watchDone; err != nil && !errors.Is(err, context.Canceled) {
		errs = append(errs, err)
	}
	<-d.scanDone
	dctx, cancel := context.WithTimeout(context.Background(), d.f.drainTimeout)
	errs = append(errs, d.pub.Close(dctx))
	cancel()
	errs = append(errs, d.store.Close())
	d.closeNATS()
	d.releaseRoots()
	d.log.Info("stopped")
	return errors.Join(errs...)
}

// abort releases what a failed start had opened.
func (d *daemon) abort() {
	if d.http != nil {
		_ = d.http.stop()
	}
	d.stopVerifier()
	d.stopMemoryRelease()
	if d.watchCancel != nil {
		d.watchCancel()
		<-d.watchDone
	}
	if d.scanDone != nil {
		<-d.scanDone
	}
	if d.pub != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = d.pub.Close(ctx)
		cancel()
	}
	if d.store != nil {
		_ = d.store.Close()
	}
	d.closeNATS()
	d.releaseRoots()
}

func (d *daemon) releaseRoots() {
	for _, l := range d.locks {
		l.Release()
	}
	d.locks = nil
}

func (d *daemon) closeNATS() {
	if d.nc != nil {
		d.nc.Close()
	}
	if d.embedded != nil {
		d.embedded.Shutdown()
		d.embedded.WaitForShutdown()
	}
}

// unfencedForTests is set by the tests that run the daemon in this process on a
// nats-server cluster (publisher.Options.Unfenced says why).
var unfencedForTests atomic.Bool
