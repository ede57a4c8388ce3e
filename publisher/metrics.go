package publisher

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics of the publisher. Labels stay low-cardinality: per root, kind and reason, never
// per conversation or file.
type Metrics struct {
	published    *prometheus.CounterVec // lines acknowledged by the mirror, by kind and entry type
	publishedB   prometheus.Counter
	latency      prometheus.Histogram
	retries      *prometheus.CounterVec
	duplicates   prometheus.Counter
	failures     *prometheus.CounterVec
	heldBack     prometheus.Counter
	invalid      *prometheus.CounterVec
	notSession   *prometheus.CounterVec
	blobs        prometheus.Counter
	blobBytes    prometheus.Counter
	blobsReused  prometheus.Counter
	rewrites     *prometheus.CounterVec
	generations  prometheus.Counter
	shrinks      prometheus.Counter // generations found lacking entries of the one before
	shrunk       prometheus.Gauge   // sessions whose newest generation is shrunk
	clashes      prometheus.Counter
	divergences  prometheus.Counter
	repeatedIDs  prometheus.Counter
	quarantined  *prometheus.CounterVec
	throttled    *prometheus.CounterVec // publishes refused for lack of room in the cluster, by reason
	backpressure *prometheus.GaugeVec   // 1 for the reason the cluster holds publishing back
	probePause   prometheus.Gauge       // the pause between probes while the cluster pushes back
	headUpdates  *prometheus.CounterVec
	resumeQuery  *prometheus.CounterVec
	state        *stateCollector
	tooLarge     prometheus.Counter
	inflight     prometheus.Gauge
	inflightB    prometheus.Gauge
	lastAckUnix  prometheus.Gauge
}

// NewMetrics declares the publisher's metrics and registers them on reg; a nil reg leaves
// them unregistered. The state collector (sessions, bytes, backlog) reports once New binds
// it to the publisher that uses these metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		published: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_lines_published_total",
			Help: "Lines acknowledged by JetStream, by message kind and entry type.",
		}, []string{"kind", "type"}),
		publishedB: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_published_bytes_total",
			Help: "Bytes of session lines acknowledged by JetStream (newlines included, blob payloads included).",
		}),
		latency: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "pisync_publish_latency_seconds",
			Help:    "Time from a complete line being read to its acknowledgement by JetStream.",
			Buckets: []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		retries: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_publish_retries_total",
			Help: "Lines sent again with the same message id after a failure, by reason.",
		}, []string{"reason"}),
		duplicates: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_publish_duplicates_total",
			Help: "Publishes the server acknowledged as duplicates of a message id it already held.",
		}),
		failures: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_publish_failures_total",
			Help: "Failed publish attempts, by reason (timeout, disconnected, no_responders, server, blob, other).",
		}, []string{"reason"}),
		heldBack: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_resume_skipped_lines_total",
			Help: "Lines not published because the mirror already held them (resume protocol).",
		}),
		invalid: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_invalid_lines_total",
			Help: "Lines that are not JSON entries, mirrored as raw, by reason (blank, malformed).",
		}, []string{"reason"}),
		notSession: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_skipped_files_total",
			Help: "Files named *.jsonl skipped because they are no Pi session in any form, by reason (not_json, not_entries, no_id, bad_id).",
		}, []string{"reason"}),
		blobs: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_blobs_total",
			Help: "Lines above the blob threshold stored in the object store.",
		}),
		blobBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_blob_bytes_total",
			Help: "Bytes uploaded to the object store.",
		}),
		blobsReused: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_blobs_reused_total",
			Help: "Blob lines whose object was already in the store (not uploaded again).",
		}),
		rewrites: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_rewrites_total",
			Help: "Session files found rewritten, truncated, replaced or moved, by kind.",
		}, []string{"kind"}),
		shrinks: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_generations_shrunk_total",
			Help: "New generations found lacking entries of the generation before them (a session overwritten by a fresh header, cut back, or rewritten without some lines).",
		}),
		shrunk: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_sessions_shrunk",
			Help: "Local sessions whose newest generation lacks entries of the generation before it: 'pisync history' lists them, 'pisync recover --generation N' restores the older one.",
		}),
		generations: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_generation_bumps_total",
			Help: "New generations started because mirrored lines changed or vanished locally.",
		}),
		clashes: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_conversation_clashes_total",
			Help: "Local files found carrying a conversation id that another local file already carries.",
		}),
		divergences: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_conversation_divergences_total",
			Help: "Local copies of a conversation that another host continued past their shared lines, mirrored whole under a key of their own.",
		}),
		repeatedIDs: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_repeated_entry_ids_total",
			Help: "Lines whose entry id an earlier line of the same generation already carries, mirrored under their ordinal so that the server keeps them.",
		}),
		quarantined: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_lines_quarantined_total",
			Help: "Lines the server refused for good (also the blob way), passed over unmirrored and listed on the status page, by reason.",
		}, []string{"reason"}),
		throttled: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_publish_throttled_total",
			Help: "Publishes the cluster refused for lack of room (stream or account limits, insufficient resources) or acknowledged later than the ack timeout, by reason: resent with the same message id, never quarantined.",
		}, []string{"reason"}),
		backpressure: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pisync_cluster_backpressure",
			Help: "1 while the cluster holds this host's publishing back, for the reason it gives (max_bytes, max_msgs, account_limit, insufficient_resources, slow_acks); 0 otherwise.",
		}, []string{"reason"}),
		probePause: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_backpressure_pause_seconds",
			Help: "Pause between probes of the cluster while it has no room, growing while they are refused (0 when publishing flows, or the acknowledgements are only slow).",
		}),
		headUpdates: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_head_updates_total",
			Help: "Writes to the heads bucket, by result (ok, error).",
		}, []string{"result"}),
		resumeQuery: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_resume_queries_total",
			Help: "Questions to the mirror about what it already holds, by how they were answered (checkpoint: not asked, the checkpoint proves the file mirrored; stream: one listing for all files at start; last_seq, scan, error).",
		}, []string{"result"}),
		tooLarge: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_lines_too_large_total",
			Help: "Lines over the maximum line size, skipped and left for recovery to fill.",
		}),
		inflight: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_inflight_messages",
			Help: "Messages published and not yet acknowledged.",
		}),
		inflightB: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_inflight_bytes",
			Help: "Bytes of messages published and not yet acknowledged.",
		}),
		lastAckUnix: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_last_ack_timestamp_seconds",
			Help: "Unix time of the last acknowledgement received from JetStream.",
		}),
		state: &stateCollector{},
	}
	if reg != nil {
		reg.MustRegister(m.state)
	}
	// Exported at 0 from the start, so that an alert can tell "none" from "no data".
	for _, reason := range []string{"max_payload", "too_large", "headers_too_large", "invalid", "blob"} {
		m.quarantined.WithLabelValues(reason)
	}
	for _, reason := range pressureReasons {
		m.throttled.WithLabelValues(reason)
		if hostWide(reason) {
			m.backpressure.WithLabelValues(reason)
		}
	}
	for _, reason := range []string{"timeout", "disconnected", "no_responders", "server", "blob", "other"} {
		m.failures.WithLabelValues(reason)
	}
	for _, reason := range []string{"blank", "malformed"} {
		m.invalid.WithLabelValues(reason)
	}
	for _, k := range []string{"truncated", "replaced", "moved", "changed"} {
		m.rewrites.WithLabelValues(k)
	}
	m.retries.WithLabelValues("failure")
	m.headUpdates.WithLabelValues("ok")
	m.headUpdates.WithLabelValues("error")
	return m
}

var (
	descSessions = prometheus.NewDesc("pisync_sessions",
		"Session files known on this host, by root and state (discovered counts every file; mirrored: fully acknowledged; pending: lines waiting; torn: a held torn tail; deleted: gone locally, kept in the mirror).",
		[]string{"root", "state"}, nil)
	descBytes = prometheus.NewDesc("pisync_session_bytes",
		"Bytes of session files, by root and state (discovered: file sizes; mirrored: acknowledged by JetStream).",
		[]string{"root", "state"}, nil)
	descBacklog = prometheus.NewDesc("pisync_backlog_bytes",
		"Bytes of complete lines not yet acknowledged by JetStream, by root.",
		[]string{"root"}, nil)
	descOldest = prometheus.NewDesc("pisync_backlog_oldest_seconds",
		"Age of the oldest line read and not yet acknowledged (0 when none).",
		nil, nil)
	descTorn = prometheus.NewDesc("pisync_torn_tail_bytes",
		"Bytes held back in torn tails (a last line without its newline), by root.",
		[]string{"root"}, nil)
)

// stateCollector computes the progress gauges from the publisher's files at scrape time,
// so they can never drift from the state they describe.
// p is bound by New while the registry may already be gathered (the HTTP server starts
// first): an atomic pointer, not a plain field.
type stateCollector struct{ p atomic.Pointer[Publisher] }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descSessions
	ch <- descBytes
	ch <- descBacklog
	ch <- descOldest
	ch <- descTorn
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.p.Load()
	if p == nil {
		return
	}
	snap := p.Progress()
	for root, r := range snap.Roots {
		for state, n := range map[string]int{"discovered": r.Sessions, "mirrored": r.Mirrored,
			"pending": r.Pending, "torn": r.Torn, "deleted": r.Deleted, "skipped": r.Skipped} {
			ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(n), root, state)
		}
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(r.Bytes), root, "discovered")
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(r.MirroredBytes), root, "mirrored")
		ch <- prometheus.MustNewConstMetric(descBacklog, prometheus.GaugeValue, float64(r.BacklogBytes), root)
		ch <- prometheus.MustNewConstMetric(descTorn, prometheus.GaugeValue, float64(r.TornBytes), root)
	}
	age := 0.0
	if !snap.OldestUnacked.IsZero() {
		age = time.Since(snap.OldestUnacked).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, age)
}
