package verify

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// results are the values of pisync_verified_sessions' result label.
var results = []string{"identical", "drifted", "failed", "unverified"}

// VerifyMetrics describe background verification.
type VerifyMetrics struct {
	roots    []string
	sessions *prometheus.GaugeVec
	passes   prometheus.Counter
	lastPass prometheus.Gauge
}

// NewVerifyMetrics declares the verification metrics and registers them on reg; a nil
// reg leaves them unregistered.
func NewVerifyMetrics(reg prometheus.Registerer) *VerifyMetrics {
	f := promauto.With(reg)
	return &VerifyMetrics{
		sessions: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pisync_verified_sessions",
			Help: "Sessions of the last verification pass by root and result: identical, drifted or failed when checked line by line against the mirror, unverified when never verified and waiting for their first read.",
		}, []string{"root", "result"}),
		passes: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_verify_passes_total",
			Help: "Background verification passes completed.",
		}),
		lastPass: f.NewGauge(prometheus.GaugeOpts{
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
		for _, result := range results {
			m.sessions.WithLabelValues(root, result).Set(0)
		}
	}
}

// set exports what a pass found.
func (m *VerifyMetrics) set(byRoot map[string]*passCounts) {
	for _, root := range m.roots {
		if byRoot[root] == nil {
			byRoot[root] = &passCounts{}
		}
	}
	for root, c := range byRoot {
		for result, n := range map[string]int{"identical": c.identical, "drifted": c.drifted, "failed": c.failed, "unverified": c.unverified} {
			m.sessions.WithLabelValues(root, result).Set(float64(n))
		}
	}
	m.passes.Inc()
	m.lastPass.SetToCurrentTime()
}
