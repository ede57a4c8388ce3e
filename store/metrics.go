package store

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics of the session store. Labels are the operation, the reply code and the conflict
// reason: never a tenant, owner or conversation.
type Metrics struct {
	requests  *prometheus.CounterVec
	appendLat prometheus.Histogram
	conflicts *prometheus.CounterVec
	repairs   prometheus.Counter
	blobs     prometheus.Counter
	inflight  prometheus.Gauge
	unsent    *prometheus.CounterVec

	quota        *prometheus.CounterVec
	partsExpired prometheus.Counter
	partBytes    prometheus.Gauge
}

// NewMetrics declares the store's metrics and registers them on reg; a nil reg leaves
// them unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	return (&Metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_store_requests_total",
			Help: "Requests answered by the session store, by operation and reply code (ok, not_found, conflict, invalid, too_large, unavailable).",
		}, []string{"op", "code"}),
		appendLat: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "pisync_store_append_seconds",
			Help:    "Time from receiving an append to replying, successful appends only.",
			Buckets: []float64{0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
		}),
		conflicts: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_store_conflicts_total",
			Help: "Conflict replies, by reason: head (the expected head was not the head), entry_exists (an entry id with other bytes), exists (create or fork of an existing id).",
		}, []string{"reason"}),
		repairs: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_store_head_repairs_total",
			Help: "Heads rewritten from the stream because they were behind it for longer than a head write takes (a replica stopped between its acknowledgement and its head update).",
		}),
		blobs: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_store_blobs_total",
			Help: "Entries above the blob threshold stored in the object store by the session store.",
		}),
		unsent: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_store_replies_unsent_total",
			Help: "Replies the connection refused to send (closed, or another failure), by operation: the client got no answer.",
		}, []string{"op"}),
		quota: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_store_quota_refusals_total",
			Help: "Requests refused (too_large) because an owner reached a quota, by quota: header (bytes of a header line), conversations, parts (bytes of uploaded parts waiting).",
		}, []string{"quota"}),
		partsExpired: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_store_parts_expired_total",
			Help: "Uploaded parts of large entries deleted because no append used them within the part TTL.",
		}),
		partBytes: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_store_part_bytes",
			Help: "Bytes of uploaded parts this replica stored that wait for their append.",
		}),
		inflight: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_store_requests_in_flight",
			Help: "Requests the session store is working on.",
		}),
	}).init()
}

// init creates the series of every label value, so that a rate over them exists from the
// start (and the exported-metrics check sees them).
func (m *Metrics) init() *Metrics {
	for _, q := range []string{ReasonHeader, ReasonConversations, ReasonParts} {
		m.quota.WithLabelValues(q)
	}
	for _, op := range Ops {
		m.unsent.WithLabelValues(op)
	}
	return m
}
