package bench

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
)

// The daemon cases (idle, memory, scaling) run the real binary as a child process, so
// that its CPU time and memory are its own: the nats-server stays in this process.

var flagDaemonEnv = flag.String("daemon-env", "", "extra environment of the daemon, space-separated (GOGC=50 GOMEMLIMIT=48MiB …)")

// pisyncBinary is -pisync-bin, or cmd/pisync built once per process.
func pisyncBinary(tb testing.TB) string {
	tb.Helper()
	if *flagPisyncBin != "" {
		return *flagPisyncBin
	}
	return daemontest.Binary(tb)
}

// built is a binary go-built once per process into a directory removed at its end,
// unless one was given (prebuilt): nats-server for the CPU benchmark.
type built struct {
	once sync.Once
	path string
	err  error
}

func (b *built) get(tb testing.TB, prebuilt, pkg string) string {
	tb.Helper()
	if prebuilt != "" {
		return prebuilt
	}
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "pisync-bench-bin-")
		if err != nil {
			b.err = err
			return
		}
		atExit(func() { os.RemoveAll(dir) })
		b.path = filepath.Join(dir, filepath.Base(strings.TrimSuffix(pkg, "/v2")))
		cmd := exec.Command(daemontest.GoTool(), "build", "-o", b.path, pkg)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.path
}

// daemonProc is a running `pisync run`.
type daemonProc struct {
	proc    *daemontest.Proc
	addr    string // HTTP
	logPath string
}

// startDaemon runs `pisync run` on root against the NATS server at url ("": its
// embedded server), with its state in a fresh directory; extra flags are appended.
func startDaemon(tb testing.TB, url, root string, extra ...string) *daemonProc {
	tb.Helper()
	bin := pisyncBinary(tb)
	dir := tb.TempDir()
	d := &daemonProc{addr: fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(tb)),
		logPath: filepath.Join(dir, "pisync.log")}
	logf, err := os.Create(d.logPath)
	if err != nil {
		tb.Fatal(err)
	}
	// Without a URL the daemon runs its default, the embedded server, on a free port.
	natsFlag := []string{"--nats", url}
	if url == "" {
		natsFlag = []string{"--nats-listen", fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(tb))}
	}
	args := append(append([]string{"run"}, natsFlag...), "--root", root, "--state-dir", filepath.Join(dir, "state"),
		"--http-addr", d.addr, "--tenant", benchTenant, "--owner", benchOwner, "--host", benchHost,
		"--log-level", "warn")
	args = append(args, extra...)
	if *flagProfileDir != "" {
		args = append(args, "--pprof")
	}
	env := append(daemontest.Env(), strings.Fields(*flagDaemonEnv)...)
	d.proc, err = daemontest.Start(bin, args, env, logf)
	logf.Close() // the child has its own descriptor
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.stop(tb) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := d.get("/healthz"); err == nil {
			return d
		}
		select {
		case <-d.proc.Exited():
			tb.Fatalf("pisync exited at start: %v\n%s", d.proc.Err(), d.logTail())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pisync not serving HTTP after 30 s\n%s", d.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *daemonProc) logTail() string {
	b, _ := os.ReadFile(d.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// stop sends SIGTERM (graceful shutdown) and waits, killing after 30 s.
func (d *daemonProc) stop(tb testing.TB) {
	if !d.proc.Running() {
		return
	}
	if err := d.proc.Stop(30 * time.Second); errors.Is(err, daemontest.ErrStopTimeout) {
		tb.Errorf("pisync did not stop within 30 s of SIGTERM\n%s", d.logTail())
	}
}

// scrapeClient asks for uncompressed responses: compressing /metrics would be CPU time
// the benchmark's polling adds to the daemon's.
var scrapeClient = &http.Client{Transport: &http.Transport{DisableCompression: true}}

func (d *daemonProc) get(path string) ([]byte, error) {
	return httpGet(scrapeClient, "http://"+d.addr+path)
}

// metrics scrapes /metrics and sums the series of each family asked for whose labels
// contain the given text ("" for every series).
func (d *daemonProc) metrics(families map[string]string) (map[string]float64, error) {
	b, err := d.get("/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
			if j := strings.LastIndexByte(line, '}'); line[i] == '{' && j > i {
				labels = line[i:j]
			}
		}
		filter, ok := families[name]
		if !ok || !strings.Contains(labels, filter) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			out[name] += v
		}
	}
	return out, sc.Err()
}

// procStat is the daemon's CPU time (user + system, every thread) and memory.
type procStat struct {
	cpu      time.Duration
	rss, hwm int64 // bytes: resident now, and its peak
}

func (d *daemonProc) stat(tb testing.TB) procStat {
	tb.Helper()
	st, err := pidStat(d.proc.Pid())
	if err != nil {
		tb.Fatalf("pisync is gone: %v\n%s", err, d.logTail())
	}
	return st
}

// pidStat reads a process's CPU time and memory from /proc. Its VmHWM is the peak of
// the process's own memory: the ru_maxrss of a child's rusage is not, since exec counts
// the peak of the memory it replaces, the parent's when the child was cloned sharing it
// (os/exec does: vfork), so a child never reports less than its parent's peak.
func pidStat(pid int) (procStat, error) {
	var st procStat
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	// The fields after the command name (which may hold spaces) start with the state.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	st.cpu = time.Duration(utime+stime) * time.Second / clockTicks
	b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			st.rss = kb << 10
		case "VmHWM:":
			st.hwm = kb << 10
		}
	}
	return st, nil
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// mb converts bytes to MB (10⁶ bytes), the unit of the targets.
func mb(n int64) float64 { return float64(n) / 1e6 }

// progress is what the daemon reports through /metrics.
type progress struct {
	files    float64 // files known to the watcher
	mirrored float64 // bytes acknowledged
}

func (d *daemonProc) progress() (progress, error) {
	m, err := d.metrics(map[string]string{"pisync_watcher_files": "", "pisync_session_bytes": `state="mirrored"`})
	if err != nil {
		return progress{}, err
	}
	return progress{files: m["pisync_watcher_files"], mirrored: m["pisync_session_bytes"]}, nil
}

// daemonRun is the timeline of a daemon mirroring a workload from its start.
type daemonRun struct {
	discovered time.Duration // every file known to the watcher
	mirrored   time.Duration // every byte acknowledged
	peakRSS    int64         // VmHWM when mirrored
	cpu        time.Duration // CPU time until mirrored
	others     float64       // % of the machine used by other processes
}

// waitMirrored polls the daemon until it knows files files and has mirrored bytes bytes.
// The poll period grows with the elapsed time (1 %, at least 50 ms), so that scraping,
// which walks the daemon's state, costs it little whatever the size.
func (d *daemonProc) waitMirrored(tb testing.TB, start time.Time, files int, bytes int64, timeout time.Duration) daemonRun {
	tb.Helper()
	var r daemonRun
	for {
		p, err := d.progress()
		if err != nil {
			select {
			case <-d.proc.Exited():
				tb.Fatalf("pisync exited: %v\n%s", d.proc.Err(), d.logTail())
			default:
			}
		}
		now := time.Since(start)
		if r.discovered == 0 && p.files >= float64(files) {
			r.discovered = now
		}
		if p.mirrored >= float64(bytes) && r.discovered > 0 {
			r.mirrored = now
			st := d.stat(tb)
			r.peakRSS, r.cpu = st.hwm, st.cpu
			return r
		}
		if now > timeout {
			tb.Fatalf("after %v: %+v of %d files, %d bytes\n%s", timeout, p, files, bytes, d.logTail())
		}
		time.Sleep(max(50*time.Millisecond, now/100))
	}
}

// profile takes a CPU profile of the daemon over the next dur through its /debug/pprof
// (served with --pprof, which startDaemon adds when -cpuprofile-dir is set), in the
// background, into -cpuprofile-dir as name-<run>.cpu. The returned function waits for it.
func (d *daemonProc) profile(tb testing.TB, name string, dur time.Duration) func() {
	tb.Helper()
	if *flagProfileDir == "" {
		return func() {}
	}
	path := profilePath(tb, name)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b, err := d.get(fmt.Sprintf("/debug/pprof/profile?seconds=%d", max(1, int(dur.Seconds()))))
		if err == nil {
			err = os.WriteFile(path, b, 0o644)
		}
		if err != nil {
			tb.Logf("daemon profile %s: %v", name, err)
		}
	}()
	return func() { <-done }
}

// heapProfile writes the daemon's heap profile (live objects at the last collection)
// into -cpuprofile-dir as name-<run>.heap, when that is set.
func (d *daemonProc) heapProfile(tb testing.TB, name string) {
	tb.Helper()
	if *flagProfileDir == "" {
		return
	}
	b, err := d.get("/debug/pprof/heap?gc=1")
	if err == nil {
		err = os.WriteFile(strings.TrimSuffix(profilePath(tb, name), ".cpu")+".heap", b, 0o644)
	}
	if err != nil {
		tb.Logf("daemon heap profile %s: %v", name, err)
	}
}

// TestChildPeakRSS is why case 10 reads a child's peak from /proc: a child's ru_maxrss
// includes its parent's peak (exec counts the memory it replaces, the parent's under
// os/exec's vfork-style clone), so a benchmark holding 256 MB would see every child
// peak at 256 MB or more.
func TestChildPeakRSS(t *testing.T) {
	ballast := make([]byte, 256<<20)
	for i := 0; i < len(ballast); i += 4096 {
		ballast[i] = 1
	}
	cmd := exec.Command("cat")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	exited, stop := startChild(t, cmd)
	defer stop()
	st, err := pidStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	in.Close()
	<-exited
	runtime.KeepAlive(ballast)
	maxrss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10
	t.Logf("cat: VmHWM %.1f MB, ru_maxrss %.1f MB", mb(st.hwm), mb(maxrss))
	if st.hwm <= 0 || st.hwm >= 64<<20 {
		t.Fatalf("VmHWM of cat %.1f MB, want its own few MB", mb(st.hwm))
	}
}
