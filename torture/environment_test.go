package torture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// Tenant and owner of every torture run.
const (
	tenant = "t1"
	owner  = "alice"
)

// nats is the server side of a run: one embedded server, or a 3-node cluster of which one
// node may be down.
type natsSide struct {
	t       testing.TB
	single  *natstest.Server
	cluster *natstest.Cluster
	down    int // the cluster node stopped, -1 when none
}

func startNATS(t testing.TB, s Settings) *natsSide {
	n := &natsSide{t: t, down: -1}
	if s.Cluster {
		n.cluster = natstest.RunCluster(t, 3)
	} else {
		n.single = natstest.RunWith(t, func(o *server.Options) { o.MaxPayload = s.MaxPayload })
	}
	return n
}

func (n *natsSide) url() string {
	if n.cluster != nil {
		return n.cluster.URLs()
	}
	return n.single.URL()
}

// fault stops the server (or a cluster node) for down, then starts it again; in a cluster
// the node stays down until the next fault or quiet point, and a second fault restarts it.
func (n *natsSide) fault(node int, down time.Duration) string {
	if n.cluster == nil {
		n.single.Stop()
		time.Sleep(down) // the outage itself
		n.single.Start()
		return fmt.Sprintf("server down %v", down.Round(time.Millisecond))
	}
	if n.down >= 0 {
		i := n.down
		n.up()
		return fmt.Sprintf("node %d back", i)
	}
	n.down = node % len(n.cluster.Nodes)
	n.cluster.Nodes[n.down].Stop()
	return fmt.Sprintf("node %d down", n.down)
}

// up starts a stopped cluster node again and waits for the cluster to be whole.
func (n *natsSide) up() {
	if n.cluster == nil || n.down < 0 {
		return
	}
	n.cluster.Nodes[n.down].Start()
	n.down = -1
	n.cluster.WaitMetaLeader(60 * time.Second)
}

// daemon is the pisync binary running `run` as a child process.
type daemon struct {
	bin      string
	args     []string
	logPath  string
	http     string
	proc     *daemontest.Proc // nil while stopped
	starts   int
	started  time.Time
	logFrom  int64 // size of the log when this process started
	restarts int   // start-up failures restarted the way systemd's Restart=on-failure does
}

// startupFailed says whether the daemon exited before it logged that it runs: a start-up
// error (such as a server that is not ready yet), which the supervisor answers with a
// restart, as deploy/systemd's unit does.
func (d *daemon) startupFailed() bool {
	b, err := os.ReadFile(d.logPath)
	if err != nil || int64(len(b)) < d.logFrom {
		return false
	}
	return !strings.Contains(string(b[d.logFrom:]), `"msg":"pisync running"`)
}

// supervise restarts a daemon that failed to start; any other exit is an error.
func (d *daemon) supervise() error {
	if d.proc == nil {
		return nil // stopped on purpose
	}
	err := d.running()
	if err == nil {
		return nil
	}
	if !d.startupFailed() {
		return err
	}
	d.restarts++
	d.proc = nil
	time.Sleep(500 * time.Millisecond) // RestartSec, shortened
	return d.start()
}

func (d *daemon) start() error {
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== torture: daemon start %d\n", d.starts+1)
	if fi, err := logf.Stat(); err == nil {
		d.logFrom = fi.Size()
	}
	p, err := daemontest.Start(d.bin, d.args, nil, logf)
	if err != nil {
		return err
	}
	d.starts++
	d.started = time.Now()
	d.proc = p
	return nil
}

// running reports whether the daemon process is alive; an exit nobody asked for is
// returned as an error.
func (d *daemon) running() error {
	if d.proc == nil {
		return errors.New("daemon not started")
	}
	select {
	case <-d.proc.Exited():
		return fmt.Errorf("daemon exited on its own: %v", d.proc.Err())
	default:
		return nil
	}
}

// kill sends SIGKILL and waits for the process to go.
func (d *daemon) kill() {
	if d.proc == nil {
		return
	}
	d.proc.Kill()
	d.proc = nil
}

// term sends SIGTERM and waits up to timeout for a clean exit.
func (d *daemon) term(timeout time.Duration) error {
	if d.proc == nil {
		return nil
	}
	// A signal in the first moments of the process, before main installs its handler,
	// kills it the default way: that is Go's start-up, not the daemon's shutdown. The
	// daemon's first log line (written after the handler is installed) says main runs; a
	// fixed half second was not enough for a -race binary on a loaded machine (CI seed
	// 20261201: "graceful stop: signal: terminated" 0.7 s after the start).
	for deadline := d.started.Add(10 * time.Second); time.Now().Before(deadline) && !d.logged(); {
		select {
		case <-d.proc.Exited():
		case <-time.After(20 * time.Millisecond):
			continue
		}
		break
	}
	select {
	case <-d.proc.Exited():
		if d.startupFailed() {
			// It failed to start before any signal was sent (seed 820403348502: a node
			// down, the stream's lookup timed out): a failed start, which the supervisor
			// answers with a restart, not a shutdown that went wrong.
			d.restarts++
			d.proc = nil
			return nil
		}
	default:
	}
	err := d.proc.Stop(timeout)
	d.proc = nil
	switch {
	case errors.Is(err, daemontest.ErrStopTimeout):
		return fmt.Errorf("no exit %v after SIGTERM", timeout)
	case err != nil:
		return fmt.Errorf("graceful stop: %v", err)
	}
	return nil
}

// logged reports whether the daemon started last has written to its log.
func (d *daemon) logged() bool {
	fi, err := os.Stat(d.logPath)
	return err == nil && fi.Size() > d.logFrom
}

// statusDoc is the part of /status.json the harness reads.
type statusDoc struct {
	Ready    bool   `json:"ready"`
	Reason   string `json:"reason"`
	InFlight int    `json:"in_flight"`
	Total    struct {
		Sessions     int   `json:"sessions"`
		Pending      int   `json:"pending"`
		Torn         int   `json:"torn"`
		BacklogBytes int64 `json:"backlog_bytes"`
	} `json:"total"`
}

func (d *daemon) get(path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.http+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// caughtUp says whether the daemon reports nothing left to publish.
func (d *daemon) caughtUp() (bool, string) {
	b, err := d.get("/status.json")
	if err != nil {
		return false, err.Error()
	}
	var s statusDoc
	if err := json.Unmarshal(b, &s); err != nil {
		return false, fmt.Sprintf("status.json: %v", err)
	}
	if !s.Ready || s.InFlight > 0 || s.Total.BacklogBytes > 0 {
		return false, fmt.Sprintf("ready %v (%s), %d in flight, %d bytes of backlog, %d sessions pending",
			s.Ready, s.Reason, s.InFlight, s.Total.BacklogBytes, s.Total.Pending)
	}
	return true, ""
}

// metric reads one unlabelled counter or gauge from /metrics.
func (d *daemon) metric(name string) (float64, error) {
	b, err := d.get("/metrics")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("metric %s not exported", name)
}

// logProblems returns the lines of the daemon's log that say it raced or panicked.
func logProblems(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "WARNING: DATA RACE") || strings.HasPrefix(line, "panic:") ||
			strings.HasPrefix(line, "fatal error:") {
			out = append(out, line)
		}
	}
	return out
}

// newReader binds the mirror's read API for the run's owner, retrying while the stream
// is not provisioned yet or the cluster elects leaders.
func newReader(ctx context.Context, nc *nats.Conn) (*mirror.Reader, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	o, err := mirror.NewOwner(tenant, owner)
	if err != nil {
		return nil, err
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := mirror.NewReader(cctx, js, mirror.DefaultNames(), o)
		cancel()
		if err == nil {
			return r, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("mirror read API: %w (last: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond): // poll interval
		}
	}
}
