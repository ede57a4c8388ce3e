package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
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
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Registry:            d.reg,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := d.ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, why)
	})
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(d.status())
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := statusPage.Execute(w, d.status()); err != nil {
			d.log.Warn("status page", zap.Error(err))
		}
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on --http-addr %s: %w", addr, err)
	}
	s := &httpServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("HTTP server", zap.Error(err))
		}
	}()
	return s, nil
}

func (s *httpServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

// statusDoc is what /status.json and the status page show.
type statusDoc struct {
	Ready     bool                  `json:"ready"`
	Reason    string                `json:"reason"`
	Tenant    string                `json:"tenant"`
	Owner     string                `json:"owner"`
	Host      string                `json:"host"`
	Roots     map[string]*rootState `json:"roots"`
	InFlight  int                   `json:"in_flight"`
	LagSecond float64               `json:"lag_seconds"`
	Time      time.Time             `json:"time"`
}

type rootState struct {
	Sessions      int     `json:"sessions"`
	Mirrored      int     `json:"mirrored"`
	Pending       int     `json:"pending"`
	Torn          int     `json:"torn"`
	Deleted       int     `json:"deleted"`
	Skipped       int     `json:"skipped"`
	Bytes         int64   `json:"bytes"`
	MirroredBytes int64   `json:"mirrored_bytes"`
	BacklogBytes  int64   `json:"backlog_bytes"`
	Percent       float64 `json:"percent"`
}

func (d *daemon) status() statusDoc {
	ok, why := d.ready()
	p := d.pub.Progress()
	doc := statusDoc{Ready: ok, Reason: why, Tenant: d.f.conn.tenant, Owner: d.f.conn.owner,
		Host: d.f.host, Roots: map[string]*rootState{}, InFlight: p.InFlight, Time: time.Now().UTC()}
	if !p.OldestUnacked.IsZero() {
		doc.LagSecond = time.Since(p.OldestUnacked).Seconds()
	}
	for _, root := range d.f.roots.get() {
		doc.Roots[root] = &rootState{Percent: 100}
	}
	for root, r := range p.Roots {
		rs := &rootState{Sessions: r.Sessions, Mirrored: r.Mirrored, Pending: r.Pending, Torn: r.Torn,
			Deleted: r.Deleted, Skipped: r.Skipped, Bytes: r.Bytes, MirroredBytes: r.MirroredBytes,
			BacklogBytes: r.BacklogBytes, Percent: 100}
		if r.Bytes > 0 {
			rs.Percent = 100 * float64(r.MirroredBytes) / float64(r.Bytes)
		}
		doc.Roots[root] = rs
	}
	return doc
}

var statusPage = template.Must(template.New("status").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>pisync status</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:left}
.bar{width:240px;height:12px;background:#eee}.fill{height:12px;background:#3a7}</style></head>
<body><h1>pisync</h1>
<p>{{if .Ready}}Ready{{else}}Not ready: {{.Reason}}{{end}} — tenant <b>{{.Tenant}}</b>, owner <b>{{.Owner}}</b>, host <b>{{.Host}}</b></p>
<p>In flight: {{.InFlight}} lines; lag {{printf "%.1f" .LagSecond}} s</p>
<table><tr><th>root</th><th>progress</th><th>sessions mirrored</th><th>bytes mirrored</th><th>backlog bytes</th><th>torn</th><th>deleted</th><th>skipped</th></tr>
{{range $root, $r := .Roots}}<tr><td>{{$root}}</td>
<td><div class="bar"><div class="fill" style="width:{{printf "%.1f" $r.Percent}}%"></div></div>{{printf "%.1f" $r.Percent}}%</td>
<td>{{$r.Mirrored}} / {{$r.Sessions}}</td><td>{{$r.MirroredBytes}} / {{$r.Bytes}}</td><td>{{$r.BacklogBytes}}</td><td>{{$r.Torn}}</td><td>{{$r.Deleted}}</td><td>{{$r.Skipped}}</td></tr>
{{end}}</table><p><small>updated {{.Time.Format "2006-01-02T15:04:05Z07:00"}}</small></p></body></html>
`))
