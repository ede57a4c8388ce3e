package torture

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// Config is one run: a seed and what to do with it.
type Config struct {
	Seed         uint64
	Ops          int            // length of the schedule
	Keep         func(int) bool // which operations of the schedule run (nil: all)
	Exclude      map[Kind]bool  // kinds left out (known defects not fixed yet), as no-ops
	Cluster      string         // ClusterAuto, ClusterOn, ClusterOff
	SmallPayload bool           // allow a server max_payload below the blob threshold
	Bin          string         // the pisync binary
	Slow         float64        // multiplies every deadline (slow or loaded machines)
	Progress     io.Writer      // one line per quiet point (nil: none)
	KeepDir      string         // where the daemon's log of a failed run is copied ("" : os.TempDir)
	Deadline     time.Time      // stop starting operations after this (zero: none)
	Settings     *Settings      // instead of drawing them from the seed
	LogTag       string         // added to the name of the directory a failure's logs go to
	LogLevel     string         // the daemon's --log-level ("": info)
}

// Failure is a violated guarantee.
type Failure struct {
	Op        int    // index of the operation that found it
	Guarantee string // which invariant
	Detail    string
}

func (f *Failure) Error() string {
	return fmt.Sprintf("op %d: %s: %s", f.Op, f.Guarantee, f.Detail)
}

// Result is what a run did and found.
type Result struct {
	Seed     uint64
	Settings Settings
	Executed []int    // indexes of the operations run, in order
	Log      []string // one line per operation run
	Kinds    map[Kind]int
	Checks   int
	Duration time.Duration
	Failure  *Failure
	LogDir   string // where the daemon's log was kept (failures only)
}

// Repro is the command that runs the same operations again with the same settings.
func (r *Result) Repro(cfg Config) string {
	s := fmt.Sprintf("make torture SEED=%d OPS=%s", r.Seed, FormatOps(r.Executed))
	if len(cfg.Exclude) > 0 {
		s += " EXCLUDE=" + KindList(cfg.Exclude)
	} else {
		s += " EXCLUDE=none"
	}
	var flags []string
	if !cfg.SmallPayload {
		flags = append(flags, "-torture.small-payload=false")
	}
	if cfg.Cluster != "" && cfg.Cluster != ClusterAuto {
		flags = append(flags, "-torture.cluster="+cfg.Cluster)
	}
	if len(flags) > 0 {
		s += " TORTURE_FLAGS='" + strings.Join(flags, " ") + "'"
	}
	return s
}

// run is the state of one run.
type run struct {
	t      testing.TB
	cfg    Config
	set    Settings
	dir    string
	fs     *files
	nats   *natsSide
	nc     *nats.Conn
	reader *mirror.Reader
	d      *daemon
	f      *daemon // the follower: recover --follow into followDir
	res    *Result

	followDir string

	natsFaultSinceStart bool // the duplicates counter may count resends since the daemon started
	downFor             int  // operations left before a stopped daemon starts again

	recovered []string // output directories of concurrent recoveries, checked at the next quiet point

	bgMu   sync.Mutex
	bg     sync.WaitGroup
	bgErrs []string
}

// Run executes cfg's schedule against a real daemon and a real nats-server, checking the
// guarantees at every quiet point. It stops at the first failure.
func Run(t testing.TB, cfg Config) *Result {
	t.Helper()
	if cfg.Slow <= 0 {
		cfg.Slow = 1
	}
	set := DrawSettings(cfg.Seed, cfg.Cluster, cfg.SmallPayload)
	if cfg.Settings != nil {
		set = *cfg.Settings
	}
	dir := t.TempDir()
	r := &run{t: t, cfg: cfg, set: set, dir: dir,
		res: &Result{Seed: cfg.Seed, Settings: set, Kinds: map[Kind]int{}}}
	r.fs = &files{roots: [2]string{filepath.Join(dir, "root-a"), filepath.Join(dir, "root-b")},
		outside: filepath.Join(dir, "outside"), written: map[[32]byte]bool{}}
	for _, d := range append(r.fs.roots[:], r.fs.outside) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	defer func() { r.res.Duration = time.Since(start) }()

	r.nats = startNATS(t, set)
	r.nc = natstest.Connect(t, r.nats.url())
	replicas := "1"
	if set.Cluster {
		replicas = "3"
	}
	r.d = &daemon{bin: cfg.Bin, logPath: filepath.Join(dir, "daemon.log"),
		http: fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t)),
		args: []string{"run", "--nats", r.nats.url(), "--root", r.fs.roots[0], "--root", r.fs.roots[1],
			"--state-dir", filepath.Join(dir, "state"), "--tenant", tenant, "--owner", owner, "--log-level", cmp.Or(cfg.LogLevel, "info"),
			"--replicas", replicas, "--duplicate-window", set.DupWindow.String(), "--ack-timeout", set.AckTimeout.String(),
			"--blob-threshold", fmt.Sprint(set.BlobThreshold), "--verify-interval", set.VerifyInterval.String(),
			"--drain-timeout", "10s", "--connect-timeout", "60s"}}
	r.d.args = append(r.d.args, "--http-addr", r.d.http)
	if err := r.d.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.d.kill() })
	r.startFollower(t)
	defer func() {
		if r.res.Failure != nil {
			r.keepLogs()
		}
	}()

	for _, op := range Schedule(cfg.Seed, cfg.Ops) {
		if cfg.Keep != nil && !cfg.Keep(op.Index) {
			continue
		}
		if !cfg.Deadline.IsZero() && time.Now().After(cfg.Deadline) && op.Kind != Check {
			continue
		}
		began := time.Now().UTC()
		desc, fail := r.apply(op)
		r.res.Executed = append(r.res.Executed, op.Index)
		r.res.Log = append(r.res.Log, fmt.Sprintf("%4d %-17s %s [%s]", op.Index, op.Kind, desc, began.Format("15:04:05.000")))
		r.res.Kinds[op.Kind]++
		if fail != nil {
			fail.Op = op.Index
			r.res.Failure = fail
			return r.res
		}
	}
	return r.res
}

// keepLogs copies the daemon's log where it outlives the test.
func (r *run) keepLogs() {
	base := r.cfg.KeepDir
	if base == "" {
		base = os.TempDir()
	}
	dir := filepath.Join(base, fmt.Sprintf("pisync-torture-%d%s", r.cfg.Seed, r.cfg.LogTag))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	for _, d := range []*daemon{r.d, r.f} {
		if d == nil {
			continue
		}
		if b, err := os.ReadFile(d.logPath); err == nil {
			_ = os.WriteFile(filepath.Join(dir, filepath.Base(d.logPath)), b, 0o644)
		}
	}
	_ = os.WriteFile(filepath.Join(dir, "ops.log"), []byte(strings.Join(r.res.Log, "\n")+"\n"), 0o644)
	r.res.LogDir = dir
}

// background runs fn concurrently with the operations that follow; its problems are
// reported at the next quiet point.
func (r *run) background(what string, fn func() error) {
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		if err := fn(); err != nil {
			r.bgMu.Lock()
			r.bgErrs = append(r.bgErrs, fmt.Sprintf("%s: %v", what, err))
			r.bgMu.Unlock()
		}
	}()
}

// deadline is d scaled for the machine.
func (r *run) deadline(d time.Duration) time.Duration {
	return time.Duration(float64(d) * r.cfg.Slow)
}

// ctx is a context for one mirror read.
func (r *run) ctx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), r.deadline(d))
}
