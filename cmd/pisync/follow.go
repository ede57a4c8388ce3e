package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/rootlock"
	"github.com/pisync/pisync/recovery"
)

// follow runs `pisync recover --follow`: a recovery, then the files kept current until
// ctx ends (a warm standby). The roots it writes are locked against a `pisync run` on
// this host. A failure to read the mirror (NATS gone for longer than the client retries)
// starts it over, with backoff: the recovery it begins with leaves current files alone.
func follow(ctx context.Context, f *recoverFlags, ids []string, stdout, stderr io.Writer) error {
	log, err := newLogger("info", "console", stderr)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // nothing to do about a failed flush at exit
	locked := f.roots.get()
	if f.out != "" {
		locked = []string{f.out}
	}
	for _, root := range locked {
		l, err := rootlock.Acquire(root, "pisync recover --follow")
		if err != nil {
			return err
		}
		defer l.Release()
	}
	reg := newRegistry()
	var fl *recovery.Follower
	var flMu sync.Mutex
	current := func() *recovery.Follower {
		flMu.Lock()
		defer flMu.Unlock()
		return fl
	}
	fmx := newFollowMetrics(reg, func() recovery.FollowStatus {
		if c := current(); c != nil {
			return c.Status()
		}
		return recovery.FollowStatus{}
	})
	if f.httpAddr != "" {
		srv, err := serveFollow(f.httpAddr, reg, current, log)
		if err != nil {
			return err
		}
		defer srv.stop() //nolint:errcheck // shutting down
		log.Info("status page", zap.String("http", srv.addr()))
	}
	fm, closeMirror, err := followedMirror(ctx, f, log, stderr)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer closeMirror()
	var outMu sync.Mutex
	opts := recovery.FollowOptions{
		Options: recovery.Options{Out: f.out, Roots: absRoots(f.roots.get()), DropRaw: f.dropRaw, Parallel: f.parallel},
		IDs:     ids, All: f.all, Host: f.host,
		OnReport: func(r recovery.Report) {
			outMu.Lock()
			defer outMu.Unlock()
			if f.jsonOut {
				_ = json.NewEncoder(stdout).Encode(r)
				return
			}
			printReport(stdout, r)
		},
		OnAppend: func(_ string, first, last int64, stored time.Time) {
			lag := time.Since(stored).Seconds() // of the first: the others were stored after it
			for range last - first + 1 {
				fmx.lag.Observe(lag)
			}
		},
	}
	b := backoff.NewExponentialBackOff(backoff.WithMaxInterval(30*time.Second), backoff.WithMaxElapsedTime(0))
	for {
		flMu.Lock()
		fl = recovery.NewFollower(fm, opts)
		flMu.Unlock()
		started := time.Now()
		err := fl.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		fmx.restarts.Inc()
		if time.Since(started) > time.Minute {
			b.Reset()
		}
		wait := b.NextBackOff()
		log.Warn("following the mirror stopped; starting over", zap.Error(err), zap.Duration("in", wait))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// followedMirror binds the mirror to follow. A standby may start before the primary's
// daemon first provisioned the mirror: it waits for it (until ctx ends), saying so once.
func followedMirror(ctx context.Context, f *recoverFlags, log *zap.Logger, stderr io.Writer) (recovery.FollowMirror, func(), error) {
	b := backoff.NewExponentialBackOff(backoff.WithMaxInterval(10*time.Second), backoff.WithMaxElapsedTime(0))
	said := false
	for {
		m, _, closeMirror, err := openMirror(ctx, &f.conn, "pisync recover --follow", stderr)
		if err == nil {
			fm, ok := m.(recovery.FollowMirror)
			if !ok {
				closeMirror()
				return nil, nil, errors.New("recover --follow: this mirror cannot be followed")
			}
			return fm, closeMirror, nil
		}
		if !errors.Is(err, errNoMirror) {
			return nil, nil, err
		}
		if !said {
			log.Info("waiting for the mirror to be provisioned (by pisync run)", zap.Error(err))
			said = true
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(b.NextBackOff()):
		}
	}
}

// followMetrics are the follower's metrics: most read from its status when scraped.
type followMetrics struct {
	lag      prometheus.Histogram
	restarts prometheus.Counter
}

func newFollowMetrics(reg prometheus.Registerer, status func() recovery.FollowStatus) *followMetrics {
	a := promauto.With(reg)
	a.NewGaugeFunc(prometheus.GaugeOpts{Name: "pisync_follow_position",
		Help: "Stream sequence of the last mirrored line the follower applied."},
		func() float64 { return float64(status().Position) })
	a.NewGaugeFunc(prometheus.GaugeOpts{Name: "pisync_follow_behind_entries",
		Help: "Lines the mirror holds that the follower has not applied yet."},
		func() float64 { return float64(status().Behind) })
	a.NewGaugeFunc(prometheus.GaugeOpts{Name: "pisync_follow_behind_seconds",
		Help: "Age of the oldest mirrored line the follower has not applied yet (0: current)."},
		func() float64 { return behindSeconds(status(), time.Now()) })
	a.NewCounterFunc(prometheus.CounterOpts{Name: "pisync_follow_appended_lines_total",
		Help: "Lines the follower appended to files (since it started, or started over)."},
		func() float64 { return float64(status().Appended) })
	a.NewCounterFunc(prometheus.CounterOpts{Name: "pisync_follow_written_files_total",
		Help: "Files the follower wrote whole, by recovery's atomic replace (new conversations, new generations)."},
		func() float64 { return float64(status().Written) })
	for _, state := range []string{"current", "waiting", "left"} {
		a.NewGaugeFunc(prometheus.GaugeOpts{Name: "pisync_follow_conversations",
			Help:        "Followed conversations: current, waiting for a rebuild, or left in place (refused, or deleted at their source).",
			ConstLabels: prometheus.Labels{"state": state}},
			func() float64 {
				s := status()
				switch state {
				case "current":
					return float64(s.Current)
				case "waiting":
					return float64(s.Waiting)
				}
				return float64(len(s.Left))
			})
	}
	return &followMetrics{
		lag: a.NewHistogram(prometheus.HistogramOpts{Name: "pisync_follow_lag_seconds",
			Help:    "From the mirror storing a line to the follower appending it to its file.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		restarts: a.NewCounter(prometheus.CounterOpts{Name: "pisync_follow_restarts_total",
			Help: "Times the follower started over after the mirror could not be read."}),
	}
}

// behindSeconds is how old the oldest line not applied is.
func behindSeconds(s recovery.FollowStatus, now time.Time) float64 {
	if s.BehindSince.IsZero() {
		return 0
	}
	return max(now.Sub(s.BehindSince).Seconds(), 0)
}

// serveFollow serves the follower's /metrics, /healthz, /status.json and status page.
func serveFollow(addr string, reg *prometheus.Registry, current func() *recovery.Follower, log *zap.Logger) (*httpServer, error) {
	status := func() followDoc {
		doc := followDoc{Time: time.Now()}
		if c := current(); c != nil {
			doc.FollowStatus = c.Status()
		}
		doc.BehindSeconds = behindSeconds(doc.FollowStatus, doc.Time)
		return doc
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		noStore(w, "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, _ *http.Request) {
		noStore(w, "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(status())
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		noStore(w, "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
		if err := followPage.Execute(w, status()); err != nil {
			log.Warn("status page", zap.Error(err))
		}
	})
	return serveHTTP(addr, mux, log)
}

// followDoc is the follower's /status.json and status page.
type followDoc struct {
	Time time.Time `json:"time"`
	recovery.FollowStatus
	BehindSeconds float64 `json:"behind_seconds"`
}

var followPage = template.Must(template.New("follow").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>pisync follower</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:60em}td,th{padding:.2em .8em;text-align:left}th{color:#555}.warn{color:#a40}</style>
</head><body>
<h1>pisync recover --follow</h1>
{{if not .Started}}<p>Recovering the conversations before following…</p>{{end}}
<table>
<tr><th>Mirror position</th><td>stream sequence {{.Position}}</td></tr>
<tr><th>Behind the mirror</th><td{{if gt .Behind 0}} class="warn"{{end}}>{{.Behind}} lines, {{printf "%.1f" .BehindSeconds}} s</td></tr>
<tr><th>Conversations current</th><td>{{.Current}}</td></tr>
<tr><th>Waiting for a rebuild</th><td>{{.Waiting}}</td></tr>
<tr><th>Left in place</th><td{{if .Left}} class="warn"{{end}}>{{len .Left}}</td></tr>
<tr><th>Lines appended</th><td>{{.Appended}}</td></tr>
<tr><th>Files written whole</th><td>{{.Written}}</td></tr>
</table>
{{if .Left}}<h2>Left in place</h2>
<p>The follower does not write these files until their conversation changes again in the mirror and recovery's rules allow it.</p>
<table><tr><th>Conversation</th><th>File</th><th>Why</th></tr>
{{range .Left}}<tr><td>{{.Key}}</td><td>{{.Path}}</td><td>{{if .Deleted}}deleted at its source: {{end}}{{.Reason}}</td></tr>
{{end}}</table>{{end}}
<p><small>As of {{.Time.Format "2006-01-02 15:04:05 MST"}}; <a href="status.json">status.json</a>, <a href="metrics">metrics</a></small></p>
</body></html>
`))
