// Package bench measures pisync against raw JetStream in the same run, so that every
// throughput is a ratio to the ceiling on the machine at hand. README.md says what each
// case measures; run.sh runs the full suite and writes RESULTS.md; TestSmoke runs every
// case at a tiny size so that CI keeps the suite working.
package bench

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/pisync/pisync/internal/testutil/daemontest"
)

// Sizes of the full suite (run.sh). TestSmoke ignores them and runs tiny sizes.
var (
	flagSessions     = flag.Int("sessions", 1000, "back-fill, recovery and cluster: sessions")
	flagEntries      = flag.Int("entries", 500, "back-fill, recovery and cluster: entries per session")
	flagSmallSess    = flag.Int("small-sessions", 200, "issue 2 back-fill: sessions")
	flagSmallEntries = flag.Int("small-entries", 500, "issue 2 back-fill: entries per session")
	flagClusterSess  = flag.Int("cluster-sessions", 0, "cluster back-fill: sessions (0: -sessions)")
	flagLiveFiles    = flag.Int("live-files", 100, "live latency: files appended to")
	flagLiveRate     = flag.Int("live-rate", 1000, "live latency: lines per second over all files")
	flagLiveDur      = flag.Duration("live-duration", 20*time.Second, "live latency: measured time (after a warm-up)")
	flagIdleFiles    = flag.Int("idle-files", 10000, "idle: session files")
	flagIdleDur      = flag.Duration("idle-duration", 60*time.Second, "idle: measured time")
	flagBigMiB       = flag.Int("big-mib", 2048, "memory: size of the one big session file, MiB")
	flagScale        = flag.String("scale", "100,1000,10000,100000", "scaling: file counts")
	flagScaleEntries = flag.Int("scale-entries", 4, "scaling and idle: entries per file")
	flagWindow       = flag.Int("window", 1024, "in-flight messages, pisync and raw alike")
	flagPisyncBin    = flag.String("pisync-bin", "", "daemon binary (default: go build ./cmd/pisync)")
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		// Configuration lines of the benchmark format (read by benchtable and benchstat).
		fmt.Printf("go: %s\n", runtime.Version())
		fmt.Printf("nats-server: %s\n", server.VERSION)
		fmt.Printf("nats.go: %s\n", moduleVersion("github.com/nats-io/nats.go"))
		fmt.Printf("cores: %d\n", runtime.NumCPU())
		fmt.Printf("memory: %s\n", memTotal())
		fmt.Printf("kernel: %s\n", kernel())
		fmt.Printf("started: %s\n", time.Now().UTC().Format(time.RFC3339))
	}
	code := m.Run()
	cleanupAll()
	daemontest.Remove()
	os.Exit(code)
}

// moduleVersion is the version of a module the build uses: from the build information,
// or from go.mod (test binaries may lack the former).
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	if b, err := os.ReadFile("../go.mod"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == path {
				return f[1]
			}
		}
	}
	return "unknown"
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
			var kb int64
			fmt.Sscan(f[1], &kb)
			return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
		}
	}
	return "unknown"
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return runtime.GOOS
	}
	return "linux " + strings.TrimSpace(string(b))
}

// cleanups run at the end of the process: workload files and fixtures shared by the
// runs of a benchmark (-count), removed even when a benchmark fails.
var cleanups []func()

func atExit(f func()) { cleanups = append(cleanups, f) }

func cleanupAll() {
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
}

// settle puts the process and the machine in the same state before every measured
// phase: dirty pages flushed (a phase must not pay for the writes of the one before),
// and the heap collected and returned to the system (a phase must not profit from the
// memory another one faulted in).
func settle() {
	syscall.Sync()
	runtime.GC()
	debug.FreeOSMemory()
}

func timeDiv(n int) time.Duration { return time.Duration(n) }

// reportWorkload reports the size of w along with the figures (constant over runs).
func reportWorkload(b *testing.B, w *workload) {
	b.ReportMetric(float64(len(w.files)), "sessions")
	b.ReportMetric(float64(w.lines), "lines")
	b.ReportMetric(float64(w.bytes)/1e6, "workload-MB")
}

// loadMeter measures how much of the machine other processes used during a phase: the
// machine's busy CPU time (/proc/stat) less this process's and less any child measured
// separately. On a shared machine it says how far a figure can be trusted.
type loadMeter struct {
	busy, total float64 // jiffies of the machine
	self        time.Duration
}

func startLoad() loadMeter {
	busy, total := machineCPU()
	return loadMeter{busy: busy, total: total, self: selfCPU()}
}

// othersPercent is the share of the machine's CPU capacity (every core) used by other
// processes since start; children is the CPU time of this process's children over the
// same time, which are not others.
func (m loadMeter) othersPercent(children time.Duration) float64 {
	busy, total := machineCPU()
	if total <= m.total {
		return 0
	}
	own := (selfCPU() - m.self + children).Seconds() * clockTicks
	return max(0, 100*(busy-m.busy-own)/(total-m.total))
}

func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0
	}
	for i, s := range f[1:] {
		v, _ := strconv.ParseFloat(s, 64)
		switch i {
		case 3, 4: // idle, iowait
		case 8, 9: // guest time is part of user time already
			continue
		default:
			busy += v
		}
		total += v
	}
	return busy, total
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
