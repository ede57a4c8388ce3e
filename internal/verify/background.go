package verify

import (
	"context"
	"hash/fnv"
	"os"
	"time"

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
//
// A file without a verdict (never verified: the first start of a host or of a version that
// keeps verdicts, a lost state directory, a new session) is read at most FirstRate a second
// instead, and at most an interval's worth of them a pass: the verdicts a fleet upgraded at
// once lacks are then gathered at a bounded rate per host, not by every host reading every
// file in the same minute.
type Background struct {
	Mirror   BackgroundMirror
	List     func() []Target // the files to verify, read at the start of each pass
	Interval time.Duration
	Rate     float64       // files per second
	Recheck  time.Duration // 0: a day
	// FirstRate is how many files without a verdict are read a second at most (0: Rate):
	// at most FirstRate·Interval of them a pass, spread over it, the others wait for the
	// passes that follow, which then start one interval after the one before did.
	// Files that changed, came due again or drifted are read at Rate.
	FirstRate float64
	// StateFile, if set, is where the verdicts are kept between runs (in the daemon's
	// state directory): read at the first pass, replaced at the end of each pass that
	// changed them. A missing or unreadable file costs one read of every file, at FirstRate.
	StateFile string
	Logger    *zap.Logger
	Metrics   *VerifyMetrics
	// OnDrift, if set, is called for each file found to differ from its mirror copy.
	// The daemon reopens the file as a rewrite there, so that drift starts a new
	// generation instead of only being reported (verify imports no watcher: DESIGN §7).
	OnDrift func(Target, Drift)

	now       func() time.Time // tests move time
	known     map[string]verdict
	drifted   map[string]bool // found drifted by the last pass: read again at Rate, every pass
	failed    map[string]bool // not read by the last pass for an error: after the files never tried
	waiting   int             // files the last pass left without a verdict for lack of budget
	dirty     bool            // known changed since it was saved
	saveError bool            // the last save failed (logged once until one succeeds)
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
		started := time.Now()
		next := b.Interval
		if b.pass(ctx) > 0 {
			// Files wait for their first read: the pass spent about an interval on its
			// budget, and the next one goes on from where it stopped, so that the first
			// reads keep to FirstRate instead of half of it.
			next = max(b.Interval-time.Since(started), 0)
		}
		timer.Reset(next)
	}
}

// passCounts are what one pass found under one root.
type passCounts struct{ identical, drifted, failed, unverified int }

// pass verifies the listed files once and returns how many it left waiting for their
// first read (FirstRate's budget spent).
func (b *Background) pass(ctx context.Context) (waiting int) {
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
	byRoot := map[string]*passCounts{}
	listed := map[string]bool{}
	targets := b.List()
	if ctx.Err() != nil {
		return 0 // List gave up: an empty list must not drop the verdicts
	}
	defer b.save() // also when stopped halfway: what was read need not be read again
	drifted, failed := map[string]bool{}, map[string]bool{}
	var again, first, retry []Target // read at Rate; at FirstRate; at FirstRate, after first
	for _, t := range targets {
		c := byRoot[t.Root]
		if c == nil {
			c = &passCounts{}
			byRoot[t.Root] = c
		}
		listed[t.Path] = true
		v, ok := b.known[t.Path]
		if ok && msgs != nil && v.key == t.Key && v.msgs == msgs[t.Key] && b.now().Sub(v.at) < due(recheck, t.Path) {
			if info, err := os.Stat(t.Path); err == nil && v.size == info.Size() && v.mtime.Equal(info.ModTime()) {
				c.identical++
				continue
			}
		}
		if msgs != nil {
			b.forget(t.Path) // stale; without the counts, a failed request says nothing of it
		}
		switch {
		case ok || b.drifted[t.Path]:
			again = append(again, t)
		case b.failed[t.Path]:
			retry = append(retry, t) // a file that cannot be read must not hold the others back
		default:
			first = append(first, t)
		}
	}
	first = append(first, retry...)
	budget := len(first)
	firstRate := b.Rate
	if b.FirstRate > 0 && b.FirstRate < b.Rate {
		firstRate = b.FirstRate
		budget = min(budget, max(1, int(b.FirstRate*b.Interval.Seconds())))
	}
	read := len(again) + budget
	if !b.readAll(ctx, again, b.Rate, msgs, byRoot, drifted, failed) ||
		!b.readAll(ctx, first[:budget], firstRate, msgs, byRoot, drifted, failed) {
		return 0
	}
	for _, t := range first[budget:] {
		byRoot[t.Root].unverified++
		if b.failed[t.Path] {
			failed[t.Path] = true // still behind the files never tried
		}
	}
	b.drifted, b.failed = drifted, failed
	if waiting = len(first) - budget; waiting > 0 && b.waiting == 0 {
		b.Logger.Info("files never verified wait for their first read, at most verify-first-rate a second",
			zap.Int("waiting", waiting), zap.Float64("per_second", firstRate),
			zap.Duration("about", time.Duration(float64(waiting)/firstRate*float64(time.Second)).Round(time.Second)))
	}
	b.waiting = waiting
	for path, v := range b.known {
		// A file not listed now (gone, or not synced yet at the first pass after a
		// start) keeps its verdict until it expires: the verdict still needs the same
		// size, modification time and message count to be used.
		if !listed[path] && b.now().Sub(v.at) >= due(recheck, path) {
			b.forget(path)
		}
	}
	b.Logger.Debug("verification pass", zap.Int("files", len(listed)), zap.Int("read", read), zap.Int("waiting", waiting))
	if b.Metrics != nil {
		b.Metrics.set(byRoot)
	}
	return waiting
}

// readAll verifies targets, rate a second at most, counting the results in byRoot and the
// drifted and failed files in drifted and failed. It returns false if ctx ended first.
func (b *Background) readAll(ctx context.Context, targets []Target, rate float64, msgs map[string]uint64,
	byRoot map[string]*passCounts, drifted, failed map[string]bool) bool {
	if len(targets) == 0 {
		return true
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / max(rate, 0.01)))
	defer tick.Stop()
	for _, t := range targets {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
		// Stat and time before the read: a line appended during it makes the recorded
		// size smaller than the next pass sees, so the file is read again then.
		info, statErr := os.Stat(t.Path)
		now := b.now()
		c := byRoot[t.Root]
		vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		d, err := Verify(vctx, b.Mirror, t.Path, mirror.Head{Key: t.Key})
		cancel()
		switch {
		case ctx.Err() != nil:
			return false
		case err != nil:
			c.failed++
			failed[t.Path] = true
			b.Logger.Debug("background verification failed", zap.String("path", t.Path), zap.Error(err))
		case d.Drifted():
			b.forget(t.Path)
			drifted[t.Path] = true
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
	return true
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
