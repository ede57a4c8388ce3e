package watcher

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the watcher's Prometheus collectors (names pisync_watcher_*). They are
// declared here and registered on the registry the caller hands to NewMetrics.
type Metrics struct {
	events       *prometheus.CounterVec
	overflows    prometheus.Counter
	rescans      *prometheus.CounterVec
	dirs         prometheus.Gauge
	files        *prometheus.GaugeVec
	readBytes    prometheus.Counter
	lines        prometheus.Counter
	errors       *prometheus.CounterVec
	torn         prometheus.Gauge
	pollingRoots prometheus.Gauge
	waitingRoots prometheus.Gauge
	watches      prometheus.Gauge
	watchBudget  prometheus.Gauge
	polledDirs   prometheus.Gauge
	polledFiles  prometheus.Gauge
}

// File states of the files{state} gauge.
const (
	statePending = "pending" // first line not complete, or not opened yet
	stateTailing = "tailing"
	stateSkipped = "skipped"
)

// Error reasons of the errors_total{reason} counter.
const (
	reasonPermission = "permission"  // EACCES/EPERM on a file or directory
	reasonIO         = "io"          // any other read or stat error (EIO, …)
	reasonSinkOpen   = "sink_open"   // Sink.Open failed
	reasonSinkLine   = "sink_line"   // Sink.Line failed
	reasonBadStart   = "bad_start"   // Sink.Open returned a Start that does not fit the file
	reasonWatch      = "watch"       // adding a watch failed, or the event source reported an error
	reasonWatchLimit = "watch_limit" // the kernel refused a watch (ENOSPC, EMFILE, ENFILE): the directory is polled
	reasonReadDir    = "readdir"     // listing a directory failed
)

// NewMetrics creates the collectors and registers them on reg; a nil reg leaves them
// unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		events: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_watcher_events_total",
			Help: "File-system events received, by operation (create, write, remove, rename, chmod).",
		}, []string{"op"}),
		overflows: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_watcher_overflows_total",
			Help: "Event queue overflows reported by the kernel; each one triggers a full rescan.",
		}),
		rescans: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_watcher_rescans_total",
			Help: "Full stat-based rescans of a root, by reason (initial, overflow, periodic, poll, root_appeared).",
		}, []string{"reason"}),
		dirs: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_watcher_watched_directories",
			Help: "Directories currently watched for changes.",
		}),
		files: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pisync_watcher_files",
			Help: "Session files known to the watcher, by state (pending, tailing, skipped).",
		}, []string{"state"}),
		readBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_watcher_read_bytes_total",
			Help: "Bytes read from session files.",
		}),
		lines: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_watcher_lines_total",
			Help: "Complete lines handed to the sink and accepted by it.",
		}),
		errors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_watcher_errors_total",
			Help: "Errors while watching, scanning or reading, by reason.",
		}, []string{"reason"}),
		torn: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_watcher_torn_tails",
			Help: "Files whose last line is incomplete (no newline yet) and held back.",
		}),
		pollingRoots: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_watcher_polling_roots",
			Help: "Roots rescanned every poll interval because some of their directories have no watch (over the watch budget, or refused by the kernel).",
		}),
		watches: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_watcher_watches",
			Help: "Watch resources held: with kqueue (macOS, BSD) one descriptor per watched directory and per entry in it, with inotify (Linux) one watch per directory.",
		}),
		watchBudget: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_watcher_watch_budget",
			Help: "The most watch resources the watcher holds (from RLIMIT_NOFILE with kqueue, fs.inotify.max_user_watches on Linux, lowered when the kernel refuses one); 0 = no budget.",
		}),
		polledDirs: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_watcher_polled_directories",
			Help: "Directories without a watch (over the watch budget, or refused by the kernel), whose changes are found by polling rescans.",
		}),
		polledFiles: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_watcher_polled_files",
			Help: "Session files in polled directories: their new lines are found by the next poll (FallbackPollInterval) rather than by an event.",
		}),
		waitingRoots: f.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_watcher_waiting_roots",
			Help: "Configured roots that do not exist and are polled for.",
		}),
	}
	// Export every label value from the start, so that rates and alerts see zeros.
	for _, op := range []string{"create", "write", "remove", "rename", "chmod"} {
		m.events.WithLabelValues(op)
	}
	for _, r := range []string{rescanInitial, rescanOverflow, rescanPeriodic, rescanPoll, rescanRootAppeared} {
		m.rescans.WithLabelValues(r)
	}
	for _, s := range []string{statePending, stateTailing, stateSkipped} {
		m.files.WithLabelValues(s)
	}
	for _, r := range []string{reasonPermission, reasonIO, reasonSinkOpen, reasonSinkLine, reasonBadStart,
		reasonWatch, reasonWatchLimit, reasonReadDir} {
		m.errors.WithLabelValues(r)
	}
	return m
}
