package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// BenchmarkCPUPerLine is issue 15 item 4, the per-host bill: the CPU time of the daemon
// process alone (`pisync run`, a child process: its rusage at exit, graceful shutdown
// included) to mirror -cpu-sessions × -cpu-entries Pi-shaped sessions into one standalone
// nats-server (another child process, built from the nats-server module: its CPU is
// counted on neither side), in CPU-seconds per 100,000 lines and µs per line; next to the
// CPU time this process spends publishing the same messages raw (`PublishMsgAsync`, the
// ceiling of case 1, whose metadata was computed when the workload was written: it pays
// for reading the files and publishing only) into a fresh standalone server in the same
// run. Goal: 23 µs a line, hashing included (half of Telegraf's 7.04 CPU-s on 300
// sessions, 150,300 lines), at least as fast as Telegraf. The default is a third of
// issue 15's workload; `-cpu-sessions 300` is the issue's. With -telegraf-bin, Telegraf
// tailing the same files into a fresh server is a third side (telegraf_test.go), so that
// the ratio to Telegraf comes from one run on one machine.
func BenchmarkCPUPerLine(b *testing.B) {
	w := getWorkload(b, spec{name: "cpu", sessions: *flagCPUSessions, entries: *flagCPUEntries, perDir: 20, seed: 15})
	for range b.N {
		r := runCPU(b, w)
		lines := float64(w.lines)
		b.ReportMetric(r.pisyncCPU.Seconds()/lines*1e5, "cpu-s/100k-lines")
		b.ReportMetric(r.pisyncCPU.Seconds()/lines*1e6, "cpu-us/line")
		b.ReportMetric(r.rawCPU.Seconds()/lines*1e6, "raw-cpu-us/line")
		b.ReportMetric(r.pisyncCPU.Seconds()/r.rawCPU.Seconds(), "cpu-ratio")
		b.ReportMetric(r.coreCPU.Seconds()/lines*1e6, "core-cpu-us/line")
		b.ReportMetric(r.coreCPU.Seconds()/r.rawCPU.Seconds(), "core/raw-cpu")
		b.ReportMetric(r.core.Seconds(), "core-s")
		b.ReportMetric(r.pisyncCPU.Seconds(), "cpu-s")
		b.ReportMetric(r.pisync.Seconds(), "pisync-s")
		b.ReportMetric(r.raw.Seconds(), "raw-s")
		b.ReportMetric(r.raw.Seconds()/r.pisync.Seconds(), "ratio")
		b.ReportMetric(mb(r.peakRSS), "peak-rss-MB")
		b.ReportMetric(r.others, "others-cpu-%")
		b.ReportMetric(r.pisyncServerCPU.Seconds()/lines*1e6, "server-cpu-us/line")
		b.ReportMetric(r.rawServerCPU.Seconds()/lines*1e6, "raw-server-cpu-us/line")
		b.ReportMetric(r.coreServerCPU.Seconds()/lines*1e6, "core-server-cpu-us/line")
		b.ReportMetric(mb(r.pisyncServerPeak), "server-peak-rss-MB")
		b.ReportMetric(mb(r.rawServerPeak), "raw-server-peak-rss-MB")
		b.ReportMetric(lines/float64(max(r.pisyncServerReads, 1)), "server-lines/read")
		b.ReportMetric(lines/float64(max(r.rawServerReads, 1)), "raw-server-lines/read")
		b.ReportMetric(float64(r.pisyncAPI), "api-requests")
		if *flagTelegrafBin != "" {
			b.ReportMetric(r.telegrafCPU.Seconds()/lines*1e5, "telegraf-cpu-s/100k-lines")
			b.ReportMetric(r.telegrafCPU.Seconds()/lines*1e6, "telegraf-cpu-us/line")
			b.ReportMetric(r.telegraf.Seconds(), "telegraf-s")
			b.ReportMetric(mb(r.telegrafRSS), "telegraf-peak-rss-MB")
			b.ReportMetric(r.pisyncCPU.Seconds()/r.telegrafCPU.Seconds(), "pisync/telegraf-cpu")
			b.ReportMetric(r.pisync.Seconds()/r.telegraf.Seconds(), "pisync/telegraf-s")
			b.ReportMetric(r.telegrafServerCPU.Seconds()/lines*1e6, "telegraf-server-cpu-us/line")
			b.ReportMetric(lines/float64(max(r.telegrafReads, 1)), "telegraf-server-lines/read")
		}
		reportWorkload(b, w)
	}
}

var (
	flagCPUSessions = flag.Int("cpu-sessions", 100, "CPU per line: sessions (issue 15's workload: 300)")
	flagCPUEntries  = flag.Int("cpu-entries", 500, "CPU per line: entries per session")
	flagNATSServer  = flag.String("nats-server-bin", "", "CPU per line: nats-server binary (default: $NATS_SERVER_BIN, or go build github.com/nats-io/nats-server/v2)")
)

type cpuResult struct {
	pisync, raw, core, telegraf             time.Duration // wall time until every line is acknowledged
	pisyncCPU, rawCPU, coreCPU, telegrafCPU time.Duration
	// The nats-server's CPU time while it stored each side's messages: what a side's
	// messages cost the server, and why a side that is cheaper on the client can still
	// finish later on a machine whose cores are all busy.
	pisyncServerCPU, rawServerCPU, coreServerCPU, telegrafServerCPU time.Duration
	pisyncServerReads, rawServerReads, telegrafReads                int64 // the server's read calls
	pisyncServerPeak, rawServerPeak                                 int64 // the server's peak RSS
	pisyncAPI                                                       int64 // JetStream API requests the daemon made
	peakRSS, telegrafRSS                                            int64
	others                                                          float64
}

var cpuRuns int // to rotate which side goes first

// runCPU measures every side, each on a fresh standalone server, the side going first
// rotating from run to run, and checks that each stored every line.
func runCPU(tb testing.TB, w *workload) cpuResult {
	tb.Helper()
	pisyncBinary(tb)
	natsServerBinary(tb)
	cpuRuns++
	var r cpuResult
	var children time.Duration
	raw := func(side string, publish rawPublisher, into *rawResult) func() {
		return func() {
			*into = rawSide(tb, w, side, publish)
			children += into.server
		}
	}
	var rawRes, coreRes rawResult
	sides := []func(){
		raw("raw", rawPublish, &rawRes),
		// Over core NATS, acknowledgements tracked by mirror.AsyncPublisher.
		raw("core", rawCorePublish, &coreRes),
		func() { // pisync: the daemon's rusage, from start to exit
			t := standaloneTarget(tb, "1MB")
			defer t.close()
			settle()
			stopProfile := serverProfile(tb, t.profPort, "pisync")
			start := time.Now()
			d := startDaemon(tb, t.url, w.root)
			waitProfile := d.profile(tb, "cpu-per-line", 20*time.Second)
			run := d.waitMirrored(tb, start, len(w.files), w.bytes, time.Hour)
			waitProfile()
			r.pisync, r.peakRSS = run.mirrored, run.peakRSS
			d.stop(tb)
			stopProfile()
			r.pisyncCPU = rusageCPU(tb, d.proc.Cmd.ProcessState)
			nc := t.connect(tb)
			defer nc.Close()
			checkStored(tb, nc, w)
			r.pisyncServerReads, r.pisyncAPI, r.pisyncServerPeak = t.serverReads(), t.serverAPI(), t.serverPeak()
			r.pisyncServerCPU = t.serverCPU()
			children += r.pisyncCPU + r.pisyncServerCPU
		},
	}
	if *flagTelegrafBin != "" {
		sides = append(sides, func() {
			// Lines of up to 2 MB go as plain messages: Telegraf has no blobs.
			t := standaloneTarget(tb, "8MB")
			defer t.close()
			settle()
			stopProfile := serverProfile(tb, t.profPort, "telegraf")
			runTelegraf(tb, t, w, &r)
			stopProfile()
			r.telegrafReads = t.serverReads()
			r.telegrafServerCPU = t.serverCPU()
			children += r.telegrafCPU + r.telegrafServerCPU
		})
	}
	first := (cpuRuns - 1) % len(sides)
	sides = append(sides[first:], sides[:first]...)
	load := startLoad()
	for _, side := range sides {
		side()
	}
	r.raw, r.rawCPU, r.rawServerCPU, r.rawServerReads, r.rawServerPeak = rawRes.wall, rawRes.cpu, rawRes.server, rawRes.reads, rawRes.serverPeak
	r.core, r.coreCPU, r.coreServerCPU = coreRes.wall, coreRes.cpu, coreRes.server
	r.others = load.othersPercent(children)
	return r
}

// rawPublisher publishes every line of a workload (rawPublish, rawCorePublish).
type rawPublisher func(tb testing.TB, nc *nats.Conn, w *workload, window int)

// rawResult is what rawSide measures: wall and CPU time of this process while it
// publishes, the server's CPU time, read calls and peak RSS.
type rawResult struct {
	wall, cpu, server time.Duration
	reads, serverPeak int64
}

// rawSide publishes w with publish into a fresh standalone server. side names the
// server's profile (-server-profile).
func rawSide(tb testing.TB, w *workload, side string, publish rawPublisher) (r rawResult) {
	tb.Helper()
	t := standaloneTarget(tb, "1MB")
	defer t.close()
	nc := t.connect(tb)
	defer nc.Close()
	settle()
	stopProfile := serverProfile(tb, t.profPort, side)
	c0, start := selfCPU(), time.Now()
	publish(tb, nc, w, *flagWindow)
	r.wall, r.cpu = time.Since(start), selfCPU()-c0
	stopProfile()
	checkStored(tb, nc, w)
	r.reads, r.serverPeak = t.serverReads(), t.serverPeak()
	r.server = t.serverCPU()
	return r
}

// apiRequests is the count of JetStream API requests the server on monitoring port
// port has served, 0 if unknown.
func apiRequests(port int) int64 {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/varz", port))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var v struct {
		JetStream struct {
			Stats struct {
				API struct {
					Total int64 `json:"total"`
				} `json:"api"`
			} `json:"stats"`
		} `json:"jetstream"`
	}
	if json.NewDecoder(resp.Body).Decode(&v) != nil {
		return 0
	}
	return v.JetStream.Stats.API.Total
}

// readSyscalls is the count of read system calls of process pid so far, 0 if unknown.
func readSyscalls(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "syscr: "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

var ackTrackingRuns int // to alternate which side goes first, over -count too

// BenchmarkAckTracking is case 10's two raw sides alone, the side going first
// alternating from iteration to iteration: nats.go's PublishMsgAsync ("natsgo") against
// core NATS with mirror.AsyncPublisher ("core"), the daemon's acknowledgement tracking.
func BenchmarkAckTracking(b *testing.B) {
	w := getWorkload(b, spec{name: "cpu", sessions: *flagCPUSessions, entries: *flagCPUEntries, perDir: 20, seed: 15})
	natsServerBinary(b)
	var natsgo, core time.Duration
	for range b.N {
		ackTrackingRuns++
		sides := []func(){
			func() { natsgo += rawSide(b, w, "raw", rawPublish).cpu },
			func() { core += rawSide(b, w, "core", rawCorePublish).cpu },
		}
		if ackTrackingRuns%2 == 0 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, side := range sides {
			side()
		}
	}
	lines := float64(b.N * w.lines)
	b.ReportMetric(natsgo.Seconds()/lines*1e6, "natsgo-cpu-us/line")
	b.ReportMetric(core.Seconds()/lines*1e6, "core-cpu-us/line")
	b.ReportMetric(core.Seconds()/natsgo.Seconds(), "core/natsgo-cpu")
}

// rusageCPU is the CPU time (user and system) of an exited child.
func rusageCPU(tb testing.TB, ps *os.ProcessState) time.Duration {
	tb.Helper()
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		tb.Fatal("no rusage of a child process")
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func checkStored(tb testing.TB, nc *nats.Conn, w *workload) {
	tb.Helper()
	if got := streamMsgs(tb, nc); got != uint64(w.lines) {
		tb.Fatalf("%d messages in the stream, want %d", got, w.lines)
	}
}

var natsServerBin built

// natsServerBinary builds the nats-server of go.mod once per process (or takes
// -nats-server-bin).
func natsServerBinary(tb testing.TB) string {
	tb.Helper()
	prebuilt := *flagNATSServer
	if prebuilt == "" {
		prebuilt = os.Getenv("NATS_SERVER_BIN") // make test builds it once for every test
	}
	return natsServerBin.get(tb, prebuilt, "github.com/nats-io/nats-server/v2")
}

// startChild starts cmd; exited is closed once it has exited, and stop sends it SIGTERM
// (a graceful shutdown) and waits for it, killing it after 30 s (then killed is true).
func startChild(tb testing.TB, cmd *exec.Cmd) (exited <-chan struct{}, stop func() (killed bool)) {
	tb.Helper()
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return done, func() bool {
		select {
		case <-done:
			return false
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
			return false
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			return true
		}
	}
}

// standaloneTarget starts a nats-server with JetStream as a child process (the options
// of natstest's servers: loopback, file store, payloads up to maxPayload, "1MB" there)
// and provisions the mirror.
func standaloneTarget(tb testing.TB, maxPayload string) *target {
	tb.Helper()
	dir := tb.TempDir()
	port, monitor := natstest.FreePort(tb), natstest.FreePort(tb)
	conf := filepath.Join(dir, "nats.conf")
	store := filepath.Join(dir, "js")
	text := fmt.Appendf(nil, "listen: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\nmax_payload: %s\njetstream { store_dir: %q }\n", port, monitor, maxPayload, store)
	profPort := 0
	if *flagServerProfile != "" {
		profPort = natstest.FreePort(tb)
		text = fmt.Appendf(text, "prof_port: %d\n", profPort)
	}
	if err := os.WriteFile(conf, text, 0o644); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(natsServerBinary(tb), "-c", conf)
	_, stopChild := startChild(tb, cmd)
	stop := func() { stopChild() }
	tb.Cleanup(stop)
	t := &target{url: fmt.Sprintf("nats://127.0.0.1:%d", port), replicas: 1, stop: stop, storeDir: []string{store},
		serverCPU:   func() time.Duration { stop(); return rusageCPU(tb, cmd.ProcessState) },
		serverReads: func() int64 { return readSyscalls(cmd.Process.Pid) },
		serverPeak:  func() int64 { st, _ := pidStat(cmd.Process.Pid); return st.hwm },
		serverAPI:   func() int64 { return apiRequests(monitor) }, profPort: profPort}
	deadline := time.Now().Add(30 * time.Second)
	for {
		nc, err := nats.Connect(t.url)
		if err == nil {
			nc.Close()
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("nats-server not accepting connections after 30 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	nc := t.connect(tb)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := mirror.Provision(ctx, jsOf(tb, nc), mirror.DefaultNames(), mirror.Config{Replicas: 1}); err != nil {
		tb.Fatal(err)
	}
	return t
}
