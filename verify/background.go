package verify

import (
	"context"
	"hash/fnv"
	"os"
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

// BackgroundMirror is what background verification reads; *mirror.Reader implements it.
type BackgroundMirror interface {
	Scanner
	Counts(ctx context.Context) (map[string]uint64, error)
}

// defaultRecheck is how long a file found identical goes at most without being read again.
const defaultRecheck = 24 * time.Hour

// Background verifies the daemon's files against the mirror, one pass per Interval, at
// most Rate files a second so that it never competes with mirroring, and exports how
// many sessions were found identical (the migration dashboard's verification coverage).
//
// A file found identical is not read again while neither it (size, modification time)
// nor its conversation in the mirror (message count, one request per pass for all of
// them) has changed, for up to Recheck (three quarters of it to all of it, by file, so
// that the daily re-reads spread): JetStream messages are never modified in place,
// so the same count is the same messages, and a lost or deleted one changes it. An idle
// host with ten thousand sessions then verifies each once and afterwards costs a stat
// per file and pass, where reading them all again would take a few percent of a core.
//
// With StateFile set the verdicts outlive the process: a restarted daemon (a reboot, an
// upgrade of the fleet) reads again only the files that changed while it was down, instead
// of every file of the host one interval after every start.
type Background struct {
	Mirror   BackgroundMirror
	List     func() []Target // the files to verify, read at the start of each pass
	Interval time.Duration
	Rate     float64       // files per second
	Recheck  time.Duration // 0: a day
	// StateFile, if set, is where the verdicts are kept between runs (in the daemon's
	// state directory): read at the first pass, replaced at the end of each pass that
	// changed them. A missing or unreadable file costs one read of every file.
	StateFile string
	Logger    *zap.Logger
	Metrics   *VerifyMetrics
	// OnDrift, if set, is called for each file found to differ from its mirror copy.
	// The daemon reopens the file as a rewrite there, so that drift starts a new
	// generation instead of only being reported (verify imports no watcher: DESIGN §7).
	OnDrift func(Target, Drift)

	now       func() time.Time // tests move time
	known     map[string]verdict
	dirty     bool // known changed since it was saved
	saveError bool // the last save failed (logged once until one succeeds)
}

// verdict is what a file and its conversation were when the file was found identical.
type verdict struct {
	key   string
	size  int64
	mtime time.Time
	msgs  uint64
	at    time.Time
}

// Run verifies until ctx ends.
func (b *Background) Run(ctx context.Context) {
	if b.Interval <= 0 {
		return
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
	if b.now == nil {
		b.now = time.Now
	}
	if b.Logger == nil {
		b.Logger = zap.NewNop()
	}
	if b.known == nil {
		b.known = loadVerdicts(b.StateFile, b.Logger)
	}
	recheck := b.Recheck
	if recheck <= 0 {
		recheck = defaultRecheck
	}
	// Counted before any file is read: a message stored meanwhile makes the count
	// recorded below lower than the next pass sees, so the file is read again then.
	msgs, err := b.Mirror.Counts(ctx)
	if err != nil {
		b.Logger.Debug("cannot count the mirror's messages; every file is read", zap.Error(err))
		msgs = nil
	}
	type counts struct{ identical, drifted, failed int }
	byRoot := map[string]*counts{}
	listed := map[string]bool{}
	read := 0
	targets := b.List()
	if ctx.Err() != nil {
		return // List gave up: an empty list must not drop the verdicts
	}
	defer b.save() // also when stopped halfway: what was read need not be read again
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for _, t := range targets {
		c := byRoot[t.Root]
		if c == nil {
			c = &counts{}
			byRoot[t.Root] = c
		}
		listed[t.Path] = true
		info, statErr := os.Stat(t.Path)
		now := b.now()
		if v, ok := b.known[t.Path]; ok && statErr == nil && msgs != nil && v.key == t.Key &&
			v.size == info.Size() && v.mtime.Equal(info.ModTime()) && v.msgs == msgs[t.Key] && now.Sub(v.at) < due(recheck, t.Path) {
			c.identical++
			continue
		}
		if msgs != nil {
			b.forget(t.Path) // stale; without the counts, a failed request says nothing of it
		}
		read++
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
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
			b.forget(t.Path)
			c.drifted++
			b.Logger.Warn("local file and mirror differ", zap.String("path", t.Path), zap.Any("drift", d.Counts()))
			if b.OnDrift != nil {
				b.OnDrift(t, d)
			}
		default:
			c.identical++
			if statErr == nil && msgs != nil {
				b.known[t.Path] = verdict{key: t.Key, size: info.Size(), mtime: info.ModTime(), msgs: msgs[t.Key], at: now}
				b.dirty = true
			}
		}
	}
	for path, v := range b.known {
		// A file not listed now (gone, or not synced yet at the first pass after a
		// start) keeps its verdict until it expires: the verdict still needs the same
		// size, modification time and message count to be used.
		if !listed[path] && b.now().Sub(v.at) >= due(recheck, path) {
			b.forget(path)
		}
	}
	b.Logger.Debug("verification pass", zap.Int("files", len(listed)), zap.Int("read", read))
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

// due is how long the verdict of the file at path holds: between three quarters of
// recheck and recheck, by the path's hash. The files a host found identical in one pass
// (all of them after its first start, or a fleet's after an upgrade) would otherwise
// come due in one pass again a day later, every day; spread, each file's day has its own
// length, and their re-reads drift apart over the following passes.
func due(recheck time.Duration, path string) time.Duration {
	h := fnv.New64a()
	h.Write([]byte(path))
	frac := float64(h.Sum64()>>11) / (1 << 53) // [0, 1)
	return recheck - time.Duration(frac*float64(recheck)/4)
}

// forget drops the verdict of path, if any.
func (b *Background) forget(path string) {
	if _, ok := b.known[path]; ok {
		delete(b.known, path)
		b.dirty = true
	}
}

// save writes the verdicts to StateFile if they changed. A failure is logged once until a
// save succeeds again; the verdicts stay in memory and the next pass tries again.
func (b *Background) save() {
	if b.StateFile == "" || !b.dirty {
		return
	}
	if err := saveVerdicts(b.StateFile, b.known); err != nil {
		lvl := zap.WarnLevel
		if b.saveError {
			lvl = zap.DebugLevel
		}
		b.Logger.Log(lvl, "cannot save the verification verdicts; a restart will read every file again", zap.Error(err))
		b.saveError = true
		return
	}
	b.dirty, b.saveError = false, false
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
