package bench

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// BenchmarkIdle is item 3: -idle-files session files (-scale-entries entries each),
// mirrored, then no writes for -idle-duration: the daemon's CPU time over that time as a
// percentage of one core, and its resident memory (the highest sampled each second, and
// the peak of the whole run, back-fill included). Targets: CPU ≤ 1 %, RSS ≤ 60 MB.
//
// With the daemon's defaults the window holds one periodic rescan and no background
// verification (its first pass starts one interval, 10 min, after start). Background
// verification reads files never verified at 1 a second by default (--verify-first-rate),
// so its first pass over 10,000 files takes 2.8 hours; later passes read only what
// changed. The "first-verification" variant starts verification 15 s after start and reads
// 20 files a second (500 s for 10,000 files), so that the window falls inside that pass;
// the "verified" variant runs passes every 15 s and measures once two have completed
// (the first at 1,000 files a second): the steady state of a verified host.
func BenchmarkIdle(b *testing.B) {
	for _, v := range []struct {
		name     string
		passes   int  // verification passes completed before the window
		embedded bool // the daemon's embedded server instead of one in this process
		flags    []string
	}{
		{"defaults", 0, false, nil},
		{"embedded", 0, true, nil},
		{"first-verification", 0, false, []string{"--verify-interval", "15s", "--verify-first-rate", "20"}},
		{"verified", 2, false, []string{"--verify-interval", "15s", "--verify-rate", "1000", "--verify-first-rate", "1000"}},
	} {
		b.Run(v.name, func(b *testing.B) {
			for range b.N {
				r := runIdle(b, *flagIdleFiles, *flagScaleEntries, *flagIdleDur, v.passes, v.embedded, v.flags...)
				b.ReportMetric(r.cpuPercent, "cpu-%")
				b.ReportMetric(mb(r.idleRSS), "rss-MB")
				b.ReportMetric(mb(r.heap), "heap-MB")
				b.ReportMetric(mb(r.peakRSS), "peak-rss-MB")
				b.ReportMetric(r.backfill.Seconds(), "backfill-s")
				b.ReportMetric(float64(r.files), "files")
				b.ReportMetric(r.others, "others-cpu-%")
			}
		})
	}
}

type idleResult struct {
	files      int
	backfill   time.Duration
	cpuPercent float64
	idleRSS    int64 // highest VmRSS sampled while idle
	peakRSS    int64 // VmHWM at the end
	heap       int64 // Go heap in use at the end (spans holding objects)
	others     float64
}

func runIdle(tb testing.TB, files, entries int, dur time.Duration, passes int, embedded bool, flags ...string) idleResult {
	tb.Helper()
	w := getWorkload(tb, filesSpec(files, entries))
	pisyncBinary(tb) // built before the clock starts
	url := ""
	if !embedded {
		t := newTarget(tb, 1)
		defer t.close()
		url = t.url
	}
	settle()
	start := time.Now()
	d := startDaemon(tb, url, w.root, flags...)
	run := d.waitMirrored(tb, start, files, w.bytes, time.Hour)
	if passes > 0 {
		d.waitVerified(tb, passes, files, 10*time.Minute)
	}
	// The back-fill's aftermath settles first: heads and checkpoints written (within a
	// second), the heap collected and returned (once the daemon has been quiet for 2 s, and
	// again after 12 s, when the embedded server's caches have expired: cmd/pisync/memory.go).
	time.Sleep(min(30*time.Second, dur))
	s0 := d.stat(tb)
	load := startLoad()
	waitProfile := d.profile(tb, "idle-"+profileName(flags), dur)
	defer waitProfile()
	t0 := time.Now()
	r := idleResult{files: files, backfill: run.mirrored, idleRSS: s0.rss}
	for time.Since(t0) < dur {
		time.Sleep(min(time.Second, dur-time.Since(t0)))
		r.idleRSS = max(r.idleRSS, d.stat(tb).rss)
	}
	s1 := d.stat(tb)
	r.others = load.othersPercent(s1.cpu - s0.cpu)
	r.cpuPercent = 100 * (s1.cpu - s0.cpu).Seconds() / time.Since(t0).Seconds()
	r.peakRSS = s1.hwm
	if m, err := d.metrics(map[string]string{"go_memstats_heap_inuse_bytes": ""}); err == nil {
		r.heap = int64(m["go_memstats_heap_inuse_bytes"])
	}
	d.heapProfile(tb, "idle-heap-"+profileName(flags))
	d.stop(tb)
	return r
}

// BenchmarkBigFile is item 4: one session file of -big-mib MiB back-filled by the
// daemon; its peak resident memory (VmHWM). Target ≤ 100 MB.
func BenchmarkBigFile(b *testing.B) {
	w := getWorkload(b, spec{name: "big", bigBytes: int64(*flagBigMiB) << 20, seed: 4})
	for range b.N {
		r := runDaemonBackfill(b, w)
		b.ReportMetric(mb(r.peakRSS), "peak-rss-MB")
		b.ReportMetric(float64(w.bytes)/r.mirrored.Seconds()/1e6, "MB/s")
		b.ReportMetric(r.mirrored.Seconds(), "backfill-s")
		b.ReportMetric(r.cpu.Seconds(), "cpu-s")
		b.ReportMetric(r.others, "others-cpu-%")
		reportWorkload(b, w)
	}
}

// BenchmarkScaling is item 5: for each count in -scale, that many small sessions
// (-scale-entries entries each) back-filled by a fresh daemon: the time until the
// watcher knows every file, the time until every byte is acknowledged, and the peak
// resident memory. RESULTS.md gives the growth from one count to the next.
func BenchmarkScaling(b *testing.B) {
	for _, n := range splitInts(*flagScale) {
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) {
			w := getWorkload(b, filesSpec(n, *flagScaleEntries))
			for range b.N {
				r := runDaemonBackfill(b, w)
				b.ReportMetric(r.discovered.Seconds(), "discovery-s")
				b.ReportMetric(r.mirrored.Seconds(), "mirrored-s")
				b.ReportMetric(mb(r.peakRSS), "peak-rss-MB")
				b.ReportMetric(r.cpu.Seconds(), "cpu-s")
				b.ReportMetric(float64(w.lines)/r.mirrored.Seconds(), "entries/s")
				b.ReportMetric(r.others, "others-cpu-%")
				reportWorkload(b, w)
			}
		})
	}
}

// runDaemonBackfill starts a daemon on w against a fresh server and waits until every
// byte is mirrored.
func runDaemonBackfill(tb testing.TB, w *workload) daemonRun {
	tb.Helper()
	pisyncBinary(tb) // built before the clock starts
	t := newTarget(tb, 1)
	defer t.close()
	settle()
	load := startLoad()
	start := time.Now()
	d := startDaemon(tb, t.url, w.root)
	// The first 20 s of the back-fill (most of it for the big file), while it runs.
	waitProfile := d.profile(tb, fmt.Sprintf("daemon-backfill-%d-files", len(w.files)), 20*time.Second)
	r := d.waitMirrored(tb, start, len(w.files), w.bytes, 2*time.Hour)
	waitProfile()
	r.others = load.othersPercent(r.cpu)
	d.stop(tb)
	return r
}

// waitVerified polls the daemon until passes background verification passes have
// completed, the last one finding every one of files identical.
func (d *daemonProc) waitVerified(tb testing.TB, passes, files int, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m, err := d.metrics(map[string]string{"pisync_verify_passes_total": "", "pisync_verified_sessions": `result="identical"`})
		if err == nil && m["pisync_verify_passes_total"] >= float64(passes) {
			if got := m["pisync_verified_sessions"]; got != float64(files) {
				tb.Fatalf("verification found %v of %d files identical", got, files)
			}
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("after %v: %v verification passes, want %d (%v)\n%s", timeout, m["pisync_verify_passes_total"], passes, err, d.logTail())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// profileName names a variant of the idle case by its flags.
func profileName(flags []string) string {
	if len(flags) == 0 {
		return "defaults"
	}
	return strings.ReplaceAll(strings.Join(flags, "_"), "--", "")
}
