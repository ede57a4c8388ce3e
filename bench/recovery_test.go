package bench

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

var flagRecParallel = flag.Int("recovery-parallel", 4, "recovery: conversations at once (pisync recover --parallel)")

// BenchmarkRecovery is item 6: every conversation of the back-fill workload (-sessions
// × -entries, as the daemon mirrored it: stream, heads and blobs) rebuilt into files, as
// `pisync recover --all --out DIR` does: lines (headers included) per second. Target
// ≥ 100,000 (issue 3: ≥ 50,000). Also: the same without writing (--dry-run), and the
// ceiling, one ordered consumer reading every message of the owner in the same run.
func BenchmarkRecovery(b *testing.B) {
	fx := recoveryFixture(b, backfillSpec(*flagSessions, *flagEntries))
	for range b.N {
		load := startLoad()
		rawT := rawRead(b, fx)
		dryT := runRecovery(b, fx, true, *flagRecParallel)
		wetT := runRecovery(b, fx, false, *flagRecParallel)
		raw, dry, wet := rawT.wall, dryT.wall, wetT.wall
		lines := float64(fx.w.lines)
		// CPU per line of the whole process (server and client): what bounds the rate
		// on a machine whose cores the raw read already keeps busy.
		b.ReportMetric(wetT.cpu.Seconds()*1e6/lines, "cpu-us/entry")
		b.ReportMetric(dryT.cpu.Seconds()*1e6/lines, "dry-run-cpu-us/entry")
		b.ReportMetric(rawT.cpu.Seconds()*1e6/lines, "raw-read-cpu-us/entry")
		b.ReportMetric(rawT.cpu.Seconds()/raw.Seconds(), "raw-read-cores")
		b.ReportMetric(lines/wet.Seconds(), "entries/s")
		b.ReportMetric(float64(fx.w.bytes)/wet.Seconds()/1e6, "MB/s")
		b.ReportMetric(lines/dry.Seconds(), "dry-run-entries/s")
		b.ReportMetric(lines/raw.Seconds(), "raw-read-entries/s")
		b.ReportMetric(raw.Seconds()/wet.Seconds(), "ratio")
		b.ReportMetric(raw.Seconds()/dry.Seconds(), "dry-run-ratio")
		b.ReportMetric(load.othersPercent(0), "others-cpu-%")
		reportWorkload(b, fx.w)
	}
}

// timed is what a timed section took: wall-clock time, and the CPU time of the whole
// process (the embedded server included) over the same window.
type timed struct{ wall, cpu time.Duration }

// startTimed starts timing a section; the function it returns ends it.
func startTimed() func() timed {
	start, cpu := time.Now(), selfCPU()
	return func() timed { return timed{time.Since(start), selfCPU() - cpu} }
}

// processTB is a testing.TB whose cleanups and temporary directories last until the
// process ends: for a fixture built during one run of a benchmark and kept for the
// next ones (-count).
type processTB struct{ testing.TB }

func (p processTB) Cleanup(f func()) { atExit(f) }

func (p processTB) TempDir() string {
	d, err := os.MkdirTemp("", "pisync-bench-fixture-")
	if err != nil {
		p.Fatal(err)
	}
	atExit(func() { os.RemoveAll(d) })
	return d
}

// mirrorFixture is a server holding a workload as the daemon mirrors it.
type mirrorFixture struct {
	w   *workload
	url string
}

var (
	fixtureMu sync.Mutex
	fixtures  = map[spec]*mirrorFixture{}
)

// recoveryFixture mirrors the workload of s with pisync into a server kept for the
// whole process (built once, untimed).
func recoveryFixture(tb testing.TB, s spec) *mirrorFixture {
	tb.Helper()
	fixtureMu.Lock()
	defer fixtureMu.Unlock()
	if fx, ok := fixtures[s]; ok {
		return fx
	}
	w := getWorkload(tb, s)
	ptb := processTB{tb}
	t := newTarget(ptb, 1)
	atExit(t.close)
	nc := t.connect(ptb)
	p := startPisync(ptb, nc, w.root, *flagWindow, nil)
	p.waitMirrored(tb, w.bytes, time.Hour)
	p.stop(tb)
	nc.Close()
	fx := &mirrorFixture{w: w, url: t.url}
	fixtures[s] = fx
	return fx
}

// runRecovery recovers every conversation of the fixture's owner into a fresh directory
// and checks the outcome: every conversation written, every line, every byte, and the
// first files identical to the originals.
func runRecovery(tb testing.TB, fx *mirrorFixture, dryRun bool, parallel int) timed {
	tb.Helper()
	ctx := context.Background()
	nc := natstest.Connect(tb, fx.url)
	defer nc.Close()
	js := jsOf(tb, nc)
	m, err := recovery.NewMirror(ctx, js, mirror.DefaultNames(), owner(tb))
	if err != nil {
		tb.Fatal(err)
	}
	out := filepath.Join(tb.TempDir(), "out")
	defer os.RemoveAll(out)
	settle()
	name := "recovery"
	if dryRun {
		name = "recovery-dry-run"
	}
	stopProfile := profile(tb, name)
	defer stopProfile()
	stop := startTimed()
	sel, err := recovery.Select(ctx, m, nil, true)
	if err != nil {
		tb.Fatal(err)
	}
	reps := recovery.New(m, recovery.Options{Out: out, Parallel: parallel, DryRun: dryRun}).Run(ctx, sel)
	elapsed := stop()
	stopProfile()

	want := recovery.Written
	if dryRun {
		want = recovery.DryRun
	}
	if len(reps) != len(fx.w.files) {
		tb.Fatalf("%d conversations recovered, want %d", len(reps), len(fx.w.files))
	}
	lines, size := 0, int64(0)
	for _, r := range reps {
		if r.Result != want {
			tb.Fatalf("%s: %s (%s)", r.Key, r.Result, r.Reason)
		}
		lines += r.Lines
		size += r.Bytes
	}
	if lines != fx.w.lines || size != fx.w.bytes {
		tb.Fatalf("recovered %d lines, %d bytes; want %d, %d", lines, size, fx.w.lines, fx.w.bytes)
	}
	if !dryRun {
		for _, f := range fx.w.files[:min(3, len(fx.w.files))] {
			want, err := os.ReadFile(f.path)
			if err != nil {
				tb.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(out, filepath.FromSlash(f.rel)))
			if err != nil {
				tb.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				tb.Fatalf("%s: recovered file differs from the original", f.rel)
			}
		}
	}
	return elapsed
}

// rawRead is the ceiling of recovery: one ordered consumer over every subject of the
// owner, reading every message, bodies included.
func rawRead(tb testing.TB, fx *mirrorFixture) timed {
	tb.Helper()
	settle()
	stopProfile := profile(tb, "recovery-raw-read")
	defer stopProfile()
	elapsed, n := rawReadAll(tb, fx.url)
	if n != fx.w.lines {
		tb.Fatalf("raw read %d messages, want %d", n, fx.w.lines)
	}
	return elapsed
}
