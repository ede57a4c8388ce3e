package recovery

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pisync/pisync/mirror"
)

// Target is one local file for background verification.
type Target struct {
	Root, Path string
	Key        string // conversation key in the mirror
}

// Background verifies the daemon's files against the mirror, one pass per Interval, at
// most Rate files a second so that it never competes with mirroring, and exports how
// many sessions were found identical (the migration dashboard's verification coverage).
type Background struct {
	Mirror   Scanner
	List     func() []Target // the files to verify, read at the start of each pass
	Interval time.Duration
	Rate     float64 // files per second
	Logger   *zap.Logger
	Metrics  *VerifyMetrics
}

// Run verifies until ctx ends.
func (b *Background) Run(ctx context.Context) {
	if b.Interval <= 0 {
		return
	}
	if b.Logger == nil {
		b.Logger = zap.NewNop()
	}
	pace := time.Duration(float64(time.Second) / max(b.Rate, 0.01))
	// The first pass waits one interval too: at start-up the daemon is busy back-filling,
	// and an idle host should cost nothing until verification is due.
	timer := time.NewTimer(b.Interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		b.pass(ctx, pace)
		timer.Reset(b.Interval)
	}
}

func (b *Background) pass(ctx context.Context, pace time.Duration) {
	type counts struct{ identical, drifted, failed int }
	byRoot := map[string]*counts{}
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for _, t := range b.List() {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c := byRoot[t.Root]
		if c == nil {
			c = &counts{}
			byRoot[t.Root] = c
		}
		vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		d, err := Verify(vctx, b.Mirror, t.Path, mirror.Head{Key: t.Key})
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			c.failed++
			b.Logger.Debug("background verification failed", zap.String("path", t.Path), zap.Error(err))
		case d.Drifted():
			c.drifted++
			b.Logger.Warn("local file and mirror differ", zap.String("path", t.Path), zap.Any("drift", d.Counts()))
		default:
			c.identical++
		}
	}
	if b.Metrics == nil {
		return
	}
	for _, root := range b.Metrics.roots {
		if byRoot[root] == nil {
			byRoot[root] = &counts{}
		}
	}
	for root, c := range byRoot {
		b.Metrics.sessions.WithLabelValues(root, "identical").Set(float64(c.identical))
		b.Metrics.sessions.WithLabelValues(root, "drifted").Set(float64(c.drifted))
		b.Metrics.sessions.WithLabelValues(root, "failed").Set(float64(c.failed))
	}
	b.Metrics.passes.Inc()
	b.Metrics.lastPass.SetToCurrentTime()
}

// VerifyMetrics describe background verification.
type VerifyMetrics struct {
	roots    []string
	sessions *prometheus.GaugeVec
	passes   prometheus.Counter
	lastPass prometheus.Gauge
}

// NewVerifyMetrics declares the verification metrics.
func NewVerifyMetrics() *VerifyMetrics {
	return &VerifyMetrics{
		sessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pisync_verified_sessions",
			Help: "Sessions checked line by line against the mirror in the last verification pass, by root and result (identical, drifted, failed).",
		}, []string{"root", "result"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pisync_verify_passes_total",
			Help: "Background verification passes completed.",
		}),
		lastPass: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_verify_last_pass_timestamp_seconds",
			Help: "Unix time the last background verification pass completed.",
		}),
	}
}

// Init exports zeros for every root before the first pass, so that the series exist
// (and alerts can be evaluated) from the start.
func (m *VerifyMetrics) Init(roots []string) {
	m.roots = roots
	for _, root := range roots {
		for _, result := range []string{"identical", "drifted", "failed"} {
			m.sessions.WithLabelValues(root, result).Set(0)
		}
	}
}

// Register registers the metrics on r.
func (m *VerifyMetrics) Register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.sessions, m.passes, m.lastPass} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
