package main

import (
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/recovery"
)

// exportedMetricsFile is the golden list of the metric families the daemon exports. The
// dashboard, alert-rule and the README (Metrics) tests check their metric names against it, so
// that nothing there names a metric the daemon does not have.
const exportedMetricsFile = "../../dashboards/testdata/exported-metrics.txt"

func init() {
	// Another test file of this package may declare -update for its own golden files;
	// share it instead of redefining it (package-level variables are set before init).
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite golden files")
	}
}

func updating() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// TestExportedMetrics is the golden /metrics test. It runs `pisync run` and `pisync serve`
// in this process on a small workload that makes every metric appear (lines, a blob, a
// blank and a malformed line, a torn tail, a file that is not a session; a create, an
// append, a conflict and an open), then for each command lints its /metrics and compares
// its pisync_* families (name, type, help, label names; not values) with
// testdata/metrics/<command>.txt. It also writes the union of the names, types and labels
// to the file the dashboard, alert-rule and README tests check their queries against. Run
// with -update to rewrite the golden files.
func TestExportedMetrics(t *testing.T) {
	srv := natstest.Run(t)
	root := t.TempDir()
	rng := rand.New(rand.NewPCG(5, 9))
	f := sessiontest.New(rng, root, "/srv/metrics", sessiontest.HarnessV3)
	if err := f.Append(f.HeaderLine("/srv/metrics"), f.Entry(300), f.Entry(300), []byte(""),
		[]byte(`{"type":"message","id":"trunc`), f.Entry(9000)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "notes.jsonl"), []byte("{\"hello\":1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir(),
		"--blob-threshold", "4096")
	defer func() {
		if err := d.stop(); err != nil {
			t.Error(err)
		}
	}()
	r := newReader(t, d.nc, "t1", "alice")
	allMirrored(t, r, root, 60*time.Second)
	// A torn tail: the start of a line with no newline yet.
	if err := sessiontest.AppendBytes(f.Path, []byte(`{"type":"message","id":"0badc0de","par`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the torn tail to be seen", func() (bool, string) {
		for _, rp := range d.pub.Progress().Roots {
			if rp.TornBytes > 0 {
				return true, ""
			}
		}
		return false, "no torn bytes yet"
	})
	s := startServe(t, srv.URL())
	serveWorkload(t, s)
	// The registry of `pisync serve` stays inside ServeCommand: what it serves on
	// /metrics, parsed.
	served := slices.Collect(maps.Values(s.metricFamilies(t)))

	// `pisync recover --follow` builds its registry the same way, around its follower.
	followReg := newRegistry()
	newFollowMetrics(followReg, func() recovery.FollowStatus { return recovery.FollowStatus{} })

	commands := []struct {
		name    string
		metrics prometheus.Gatherer
	}{
		{"run", d.reg},
		{"serve", prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return served, nil })},
		{"follow", followReg},
	}
	// Dashboards and alerts query both commands' families from one Prometheus: one list.
	all := map[string]family{}
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			problems, err := testutil.GatherAndLint(c.metrics)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				t.Errorf("lint: %s: %s", p.Metric, p.Text)
			}
			fams := families(t, c.metrics)
			maps.Copy(all, fams)
			checkGolden(t, filepath.Join("testdata", "metrics", c.name+".txt"), goldenFamilies(c.name, fams))
		})
	}

	// Every metric declared in the sources must have shown up: a family that is missing
	// here would let a dashboard query for it pass unnoticed… or fail for no reason.
	var missing []string
	for _, name := range declaredMetrics(t) {
		if _, ok := all[name]; !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("declared in the sources but not exported after the workload (not registered on the daemon's registry, or a labelled metric the workload never touches: extend the workload): %v", missing)
	}
	checkGolden(t, exportedMetricsFile, exportedFamilies(all))
}

// family is what the golden files keep of a metric family: not its values.
type family struct {
	typ    string
	help   string
	labels []string // sorted
}

// families are the pisync_* families of g, by name.
func families(t *testing.T, g prometheus.Gatherer) map[string]family {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]family{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "pisync_") {
			continue // go_* and process_*: the client library's, and they vary with Go and the OS
		}
		var labels []string
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName())
			}
		}
		slices.Sort(labels)
		out[mf.GetName()] = family{
			typ:    strings.ToLower(mf.GetType().String()),
			help:   mf.GetHelp(),
			labels: slices.Compact(labels),
		}
	}
	return out
}

// goldenFamilies is the golden file of a command: its families in the shape of the
// exposition format, label names in place of series.
func goldenFamilies(command string, fams map[string]family) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Metric families `pisync %s` exports on /metrics: help, type, label names.\n", command)
	b.WriteString("# Generated by `go test ./cmd/pisync -run TestExportedMetrics -update`; do not edit.\n")
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		f := fams[name]
		fmt.Fprintf(&b, "\n# HELP %s %s\n# TYPE %s %s\n%s", name, f.help, name, f.typ, name)
		if len(f.labels) > 0 {
			fmt.Fprintf(&b, "{%s}", strings.Join(f.labels, ","))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// exportedFamilies is exportedMetricsFile: one line per family, name, type, label names.
func exportedFamilies(fams map[string]family) string {
	var b strings.Builder
	b.WriteString("# Metric families the daemon exports: name, type, label names.\n")
	b.WriteString("# Generated by `go test ./cmd/pisync -run TestExportedMetrics -update`; do not edit.\n")
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		f := fams[name]
		line := name + " " + f.typ
		if len(f.labels) > 0 {
			line += " " + strings.Join(f.labels, ",")
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// checkGolden compares got with the golden file at path, or rewrites it under -update.
func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if updating() {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v; create it with: go test ./cmd/pisync -run TestExportedMetrics -update", err)
	}
	if string(want) != got {
		t.Errorf("%s is stale; rewrite it with: go test ./cmd/pisync -run TestExportedMetrics -update\n%s",
			path, lineDiff(string(want), got))
	}
}

// declaredMetrics finds the pisync_* metric names declared in the module's sources
// (Opts{Name: "pisync_…"} and prometheus.NewDesc("pisync_…")).
func declaredMetrics(t *testing.T) []string {
	t.Helper()
	re := regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(pisync_[a-z0-9_]+)"`)
	seen := map[string]bool{}
	err := filepath.WalkDir("../..", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			switch e.Name() {
			case "node_modules", "testdata", "vendor", ".git":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			seen[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
