package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/logx"
	"github.com/pisync/pisync/internal/natsconn"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/store"
)

// serveFlags configure the session store service.
type serveFlags struct {
	conn          connFlags
	httpAddr      string
	host          string
	logLevel      string
	logFormat     string
	provision     string
	replicas      int
	dupWindow     time.Duration
	blobThreshold int64
	maxEntryBytes int64
	maxHeader     int64
	maxConvs      int
	maxPartBytes  int64
	partTTL       time.Duration
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	f.conn.register(fs)
	fs.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:9471", "HTTP address of /metrics, /healthz and /readyz (empty: off)")
	fs.StringVar(&f.host, "host", "pisync-store", "host name recorded with every line the store writes")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", "json", "log format: json or console")
	fs.StringVar(&f.provision, "provision", string(mirror.ProvisionCreate), "stream and buckets: create (what is missing), update (to these flags) or off (must exist)")
	fs.IntVar(&f.replicas, "replicas", 1, "stream, bucket and object store replicas when provisioning (3 in a cluster)")
	fs.DurationVar(&f.dupWindow, "duplicate-window", mirror.DefaultDuplicateWindow, "JetStream duplicate window when provisioning")
	fs.Int64Var(&f.blobThreshold, "blob-threshold", 512<<10, "entries above this many bytes go to the object store")
	fs.Int64Var(&f.maxEntryBytes, "max-entry-bytes", 64<<20, "entries above this many bytes are refused (too_large)")
	fs.Int64Var(&f.maxHeader, "max-header-bytes", 64<<10, "header lines (metadata, cwd, parentSession) above this many bytes are refused (too_large)")
	fs.IntVar(&f.maxConvs, "max-conversations", 100_000, "conversations one owner may have; more are refused (too_large; negative: no limit)")
	fs.Int64Var(&f.maxPartBytes, "max-part-bytes", 256<<20, "bytes of uploaded parts one owner may have waiting for their append on a replica (negative: no limit)")
	fs.DurationVar(&f.partTTL, "part-ttl", time.Hour, "uploaded parts no append used are deleted after this long")
}

// ServeCommand runs the session store (DESIGN §8, docs/store-protocol.md) until ctx ends.
// It is stateless: run as many replicas as wanted, anywhere that reaches NATS.
func ServeCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
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
	names, err := mirror.NewNames(f.conn.prefix)
	if err != nil {
		return fmt.Errorf("%w: --prefix: %v", errUsage, err)
	}
	reg := newRegistry()
	sm := store.NewMetrics(reg)
	nm := natsconn.NewMetrics(reg)
	jsWait := natsconn.NewJetStreamWait(log, nm)
	var ready atomic.Bool
	var hs *http.Server
	if f.httpAddr != "" {
		// Up before NATS: /healthz answers while the connection is retried.
		ln, err := net.Listen("tcp", f.httpAddr)
		if err != nil {
			return fmt.Errorf("listen on --http-addr %s: %w", f.httpAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
			if !ready.Load() {
				why := "connecting to NATS"
				if r := jsWait.Reason(); r != "" {
					why = "waiting for JetStream: " + r
				}
				http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ready")
		})
		hs = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("HTTP server", zap.Error(err))
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
		}()
	}
	nc, err := f.conn.connect(ctx, "pisync serve "+f.host, 0, log, nm, nats.CustomInboxPrefix(store.InboxPrefix))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// Until stopped, as the connection (see pisync run).
	var st *store.Store
	if err := jsWait.Do(ctx, 0, "provision the mirror", func(ctx context.Context) error {
		if err := mirror.Provision(ctx, js, names, mirror.Config{Mode: mirror.ProvisionMode(f.provision),
			Replicas: f.replicas, DuplicateWindow: f.dupWindow}); err != nil {
			return err
		}
		var err error
		st, err = store.New(ctx, js, names, store.Options{Host: f.host, BlobThreshold: f.blobThreshold,
			MaxEntryBytes: f.maxEntryBytes, MaxHeaderBytes: f.maxHeader, MaxPayload: nc.MaxPayload(),
			MaxConversations: f.maxConvs, MaxPartBytes: f.maxPartBytes, PartTTL: f.partTTL, Logger: log.Named("store"), Metrics: sm})
		return err
	}); err != nil {
		if ctx.Err() != nil {
			log.Info("stopped during start-up", zap.Error(err))
			return nil
		}
		return err
	}
	svc, err := st.Serve(nc)
	if err != nil {
		return err
	}
	ready.Store(true)
	log.Info("pisync serve running", zap.String("service", store.ServiceName), zap.String("subjects", names.StoreService("*")),
		zap.String("nats", logx.URL(f.conn.url())), zap.String("http", f.httpAddr))
	<-ctx.Done()
	log.Info("shutting down")
	ready.Store(false)
	return svc.Stop()
}
