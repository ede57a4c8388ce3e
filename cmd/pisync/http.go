package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

type httpServer struct {
	srv *http.Server
	ln  net.Listener
}

// startHTTP serves /metrics, /healthz, /readyz, /status.json and the status page.
func startHTTP(addr string, d *daemon) (*httpServer, error) {
	return serveHTTP(addr, d.httpHandler(), d.log)
}

// serveHTTP serves h on addr (--http-addr) until stopped.
func serveHTTP(addr string, h http.Handler, log *zap.Logger) (*httpServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on --http-addr %s: %w", addr, err)
	}
	s := &httpServer{srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP server", zap.Error(err))
		}
	}()
	return s, nil
}

// addr is the address the server listens on (the port chosen, for --http-addr HOST:0).
func (s *httpServer) addr() string { return s.ln.Addr().String() }

func (s *httpServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

// httpHandler routes the daemon's HTTP endpoints.
func (d *daemon) httpHandler() http.Handler {
	mux := http.NewServeMux()
	if d.f != nil && d.f.pprof {
		// Off by default: profiles show paths and internals, and a CPU profile costs
		// the daemon while it runs.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	if d.reg != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{
			ErrorHandling:       promhttp.ContinueOnError,
			MaxRequestsInFlight: 4,
			Registry:            d.reg,
		}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		noStore(w, "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		noStore(w, "text/plain; charset=utf-8")
		ok, why := d.ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, why)
	})
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, _ *http.Request) {
		noStore(w, "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(d.status())
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		doc := d.status()
		var page bytes.Buffer
		v := statusView{statusDoc: doc, Now: doc.Time, Refresh: int(statusRefresh / time.Second), Script: template.JS(statusPageJS)}
		if err := statusPage.Execute(&page, v); err != nil {
			d.log.Warn("status page", zap.Error(err))
			http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
			return
		}
		noStore(w, "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", statusPageCSP)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		_, _ = w.Write(page.Bytes())
	})
	return mux
}

func noStore(w http.ResponseWriter, contentType string) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
}
