package torture

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/daemontest"
)

var (
	seedFlag     = flag.Uint64("torture.seed", 0, "run this seed only (0: the CI seeds, or fresh seeds with -torture.duration)")
	opsFlag      = flag.String("torture.ops", "", `operations of the seed's schedule to run: "N" (the first N) or "a-b,c,…" (default all)`)
	lenFlag      = flag.Int("torture.n", 150, "operations per seed")
	durationFlag = flag.Duration("torture.duration", 0, "hunt with fresh seeds for this long (0: CI seeds or -torture.seed)")
	excludeFlag  = flag.String("torture.exclude", "known", `operation kinds to leave out, comma-separated; "known": those of open findings (FINDINGS.md), "none": none`)
	clusterFlag  = flag.String("torture.cluster", ClusterAuto, "3-node cluster: auto (drawn from the seed), on, off")
	raceFlag     = flag.Bool("torture.race", false, "build the daemon with the race detector")
	slowFlag     = flag.Float64("torture.slow", 1, "multiply every deadline (a loaded machine)")
	shrinkFlag   = flag.Int("torture.shrink", 8, "hunt: runs spent shrinking a failing schedule")
	smallFlag    = flag.Bool("torture.small-payload", true, "allow a server max_payload below the blob threshold")
	recordFlag   = flag.String("torture.record", "", "hunt: append one line per seed to this file")
	logLevelFlag = flag.String("torture.log-level", "info", "the daemon's --log-level (debug: each file's Open, moves, removals)")
)

func TestMain(m *testing.M) {
	code := m.Run()
	daemontest.Remove()
	os.Exit(code)
}

// ciSeeds are the seeds CI runs, each for ciOps operations: together well under a minute.
var ciSeeds = []uint64{20261201, 7, 424242}

const ciOps = 60

// ciExclude are the operation kinds CI (and make torture, unless told) leaves out because they find defects not fixed yet
// on main (torture/FINDINGS.md says which). Remove a kind once its fix lands.
var ciExclude = map[Kind]bool{}

// TestTorture runs the seeded torture run: in CI a few fixed seeds for a fixed number of
// operations; with -torture.seed one seed (a reproducer); with -torture.duration fresh
// seeds until the time is up (make torture).
func TestTorture(t *testing.T) {
	bin, err := daemontest.Build(*raceFlag)
	if err != nil {
		t.Fatal(err)
	}
	keep, err := ParseOps(*opsFlag)
	if err != nil {
		t.Fatal(err)
	}
	exclude := ciExclude
	if *excludeFlag != "known" {
		if exclude, err = ParseKinds(strings.ReplaceAll(*excludeFlag, "none", "")); err != nil {
			t.Fatal(err)
		}
	}
	base := Config{Ops: *lenFlag, Keep: keep, Exclude: exclude, Cluster: *clusterFlag, SmallPayload: *smallFlag,
		Bin: bin, Slow: *slowFlag, Progress: os.Stderr, LogLevel: *logLevelFlag}
	switch {
	case *seedFlag != 0:
		cfg := base
		cfg.Seed = *seedFlag
		one(t, cfg, 0)
	case *durationFlag > 0:
		hunt(t, base, *durationFlag)
	default:
		base.Ops, base.Cluster, base.SmallPayload, base.Progress = ciOps, ClusterOff, false, nil
		for _, seed := range ciSeeds {
			cfg := base
			cfg.Seed = seed
			t.Run(fmt.Sprint(seed), func(t *testing.T) { one(t, cfg, 0) })
		}
	}
}

// one runs cfg and fails t with a report (and, with shrink > 0, a shrunk schedule).
func one(t *testing.T, cfg Config, shrink int) *Result {
	res := Run(t, cfg)
	t.Logf("seed %d (%s): %d operations, %d quiet points, %v", res.Seed, res.Settings, len(res.Executed), res.Checks,
		res.Duration.Round(time.Millisecond))
	if res.Failure != nil {
		t.Errorf("%s", report(res, cfg))
	}
	return res
}

// report is what a failure prints: seed, guarantee, the operations and the reproducer.
func report(res *Result, cfg Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d violated %q at operation %d\n%s\n", res.Seed, res.Failure.Guarantee, res.Failure.Op, res.Failure.Detail)
	fmt.Fprintf(&b, "settings: %s\n", res.Settings)
	fmt.Fprintf(&b, "operations:\n%s\n", strings.Join(res.Log, "\n"))
	if res.LogDir != "" {
		fmt.Fprintf(&b, "daemon log and operations in %s\n", res.LogDir)
	}
	fmt.Fprintf(&b, "reproduce with: %s\n", res.Repro(cfg))
	return b.String()
}

// hunt runs fresh seeds until d has passed, shrinking each failure.
func hunt(t *testing.T, base Config, d time.Duration) {
	end := time.Now().Add(d)
	seed := uint64(time.Now().UnixNano())
	var seeds, ops, checks, failed int
	var found []string
	for time.Now().Before(end) {
		seed = seed*6364136223846793005 + 1442695040888963407 // next fresh seed (LCG step)
		cfg := base
		cfg.Seed = seed % 1_000_000_000_000
		cfg.Deadline = end
		var res *Result
		t.Run(fmt.Sprint(cfg.Seed), func(t *testing.T) { res = one(t, cfg, 0) })
		if res == nil {
			continue
		}
		seeds++
		ops += len(res.Executed)
		checks += res.Checks
		line := fmt.Sprintf("%s seed %d: %d ops, %d checks, %v, %s", time.Now().UTC().Format(time.RFC3339), res.Seed,
			len(res.Executed), res.Checks, res.Duration.Round(time.Second), res.Settings)
		if res.Failure != nil {
			failed++
			min := shrinkRun(t, cfg, res, *shrinkFlag)
			line += fmt.Sprintf(" FAILED %q; %s", res.Failure.Guarantee, min.Repro(cfg))
			found = append(found, line)
		} else {
			line += " ok"
		}
		fmt.Fprintln(os.Stderr, line)
		if *recordFlag != "" {
			if f, err := os.OpenFile(*recordFlag, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
				fmt.Fprintln(f, line)
				f.Close()
			}
		}
	}
	t.Logf("hunted %v: %d seeds, %d operations, %d quiet points, %d failures", d, seeds, ops, checks, failed)
	for _, f := range found {
		t.Log(f)
	}
}

// shrinkRun tries to drop chunks of a failing schedule while it still fails with the same
// guarantee; it spends at most tries runs and returns the smallest failing result.
func shrinkRun(t *testing.T, cfg Config, res *Result, tries int) *Result {
	best := res
	chunk := len(best.Executed) / 2
	for tries > 0 && chunk >= 1 {
		progress := false
		for start := 0; start < len(best.Executed)-1 && tries > 0; start += chunk {
			// Keep the failing check (the last operation) and drop [start, start+chunk).
			keep := map[int]bool{}
			for i, idx := range best.Executed {
				if i < start || i >= start+chunk || i == len(best.Executed)-1 {
					keep[idx] = true
				}
			}
			try := cfg
			try.Keep = func(i int) bool { return keep[i] }
			try.Deadline = time.Time{}
			try.LogTag = fmt.Sprintf("-shrink-%d", len(keep))
			tries--
			var r *Result
			t.Run(fmt.Sprintf("shrink-%d", len(keep)), func(t *testing.T) { r = Run(t, try) })
			if r != nil && r.Failure != nil && r.Failure.Guarantee == res.Failure.Guarantee && len(r.Executed) < len(best.Executed) {
				best, progress = r, true
				fmt.Fprintf(os.Stderr, "shrunk seed %d to %d operations: %s\n", cfg.Seed, len(r.Executed), r.Repro(cfg))
				break
			}
		}
		if !progress {
			chunk /= 2
		}
	}
	return best
}
