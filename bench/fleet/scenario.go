package fleet

import (
	"context"
	"fmt"
	"regexp"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/natsconn"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// Config is one run of the simulator: fill the mirror, measure a steady state, take
// the whole cluster down for Outage, and measure the storm of the fleet coming back.
type Config struct {
	Mix      Mix
	Steady   time.Duration // how long the steady state is measured
	Outage   time.Duration // how long every node of the cluster is down
	Deadline time.Duration // longest wait for the fleet to catch up, at fill and after the outage
	// Reconnect is the daemons' reconnection policy (default natsconn.Reconnect, the
	// daemon's); the smoke test shortens it to fit CI.
	Reconnect natsconn.Backoff
	// AckTimeout is the daemons' --ack-timeout (default 10 s, the daemon's).
	AckTimeout time.Duration
	Log        *zap.Logger
}

// Result is what a run measured.
type Result struct {
	Hosts, Files int
	ByKind       map[Kind]int

	Fill         time.Duration // until every idle and appending host was mirrored from nothing
	FillRequests int

	// Steady state: requests per host per hour, by kind of host; lines appended.
	SteadyPerHostHour map[Kind]float64
	SteadyLines       int64
	SteadyByOp        map[string]int

	// The storm, measured from the moment the nodes were started again.
	StreamLeader time.Duration             // until the entries stream had a leader again
	Reconnected  [3]time.Duration          // p50, p99, last host connected again
	CaughtUp     map[Kind][3]time.Duration // p50, p99, last host with everything written before it acknowledged
	Missing      int                       // hosts not caught up by the deadline
	StormTotal   int                       // requests from the restart until the last host caught up
	StormPeak    int                       // most requests in one second
	StormByOp    map[string]int
	ServerCPU    float64 // CPU-seconds of the cluster during the storm
	FleetCPU     float64 // CPU-seconds of everything else (the simulated daemons)
	StormSeconds float64
	ServerHeap   int64 // live heap allocated by nats-server code after the storm
	HeapAll      int64
	PeakRSS      int64 // process, whole run

	// The fleet restart: every daemon stopped and started again at once.
	Restart struct {
		Seconds             float64 // until the last host caught up
		CaughtUp            [3]time.Duration
		Missing             int
		Total, Peak         int
		ByOp                map[string]int
		ServerCPU, FleetCPU float64
	}

	FailedStarts int64  // daemon starts the cluster did not answer in time (retried after 2 s)
	StreamMsgs   uint64 // messages in the entries stream at the end
	Lines        int64  // lines written across the fleet
}

var hostInSubject = regexp.MustCompile(`host-\d{4}`)

// Run runs the simulator once against a fresh 3-node cluster with R3 stream and buckets.
func Run(t testing.TB, cfg Config) Result {
	t.Helper()
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var c *natstest.Cluster
	// Every goroutine of the servers inherits this label: their CPU is told apart.
	pprof.Do(ctx, pprof.Labels(partLabel, clusterPart), func(context.Context) { c = natstest.RunCluster(t, 3) })
	url := c.URLs()
	provision(t, ctx, url)
	reqs, err := countRequests(url)
	if err != nil {
		t.Fatal(err)
	}
	defer reqs.close()

	if cfg.Reconnect.Max == 0 {
		cfg.Reconnect = natsconn.Reconnect
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = 10 * time.Second
	}
	f, err := newFleet(t.TempDir(), url, 3, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.stop(); err != nil {
			t.Errorf("stopping the fleet: %v", err)
		}
	}()
	res := Result{Hosts: len(f.Hosts), ByKind: map[Kind]int{}}
	for _, h := range f.Hosts {
		res.ByKind[h.Kind]++
	}

	// Fill: idle and appending hosts mirror their sessions from nothing.
	fillStart := time.Now()
	m := reqs.mark()
	if err := f.start(ctx, 32, Idle, Appending); err != nil {
		t.Fatal(err)
	}
	fillDone := make(chan struct{})
	go logFill(t, f, fillDone)
	at := f.caughtUp(ctx, fillStart, f.written(), cfg.Deadline)
	close(fillDone)
	if _, _, _, missing := percentiles(f.Hosts, at); missing > 0 {
		t.Fatalf("fill: %d hosts not mirrored after %v", missing, cfg.Deadline)
	}
	res.Fill = time.Since(fillStart)
	res.FillRequests = reqs.since(m).total
	res.Files = countFiles(f)

	// Steady state: the live conversations go on, the idle hosts idle.
	convCtx, stopConv := context.WithCancel(ctx)
	waitConv := f.converse(convCtx, cfg.Mix.AppendEvery)
	defer func() {
		stopConv()
		if err := waitConv(); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(cfg.Mix.AppendEvery) // let the conversations get going (not a synchronisation)
	linesBefore := f.lines()
	m = reqs.mark()
	time.Sleep(cfg.Steady) // the measured window itself
	steady := reqs.since(m)
	res.SteadyLines = f.lines() - linesBefore
	res.SteadyByOp = steady.byOp
	res.SteadyPerHostHour = perHostHour(f, steady.byHost, cfg.Steady)

	// Back-filling hosts start just before the outage: their back-fill is cut by it.
	if err := f.start(ctx, 32, Backfilling); err != nil {
		t.Fatal(err)
	}
	time.Sleep(min(2*time.Second, cfg.Outage)) // back-fill under way (not a synchronisation)

	// The outage: every node down, then up again on the same stores.
	for _, n := range c.Nodes {
		n.Stop()
	}
	time.Sleep(cfg.Outage) // the outage itself
	cpu, err := startCPU()
	if err != nil {
		t.Fatal(err)
	}
	m = reqs.mark()
	restart := time.Now()
	pprof.Do(ctx, pprof.Labels(partLabel, clusterPart), func(context.Context) {
		for _, n := range c.Nodes {
			n.Start()
		}
	})
	target := f.written()
	leader := make(chan time.Duration, 1)
	go func() { leader <- streamLeaderAfter(ctx, c, restart) }()
	at = f.caughtUp(ctx, restart, target, cfg.Deadline)
	res.StreamLeader = <-leader
	res.StormSeconds = time.Since(restart).Seconds()
	storm := reqs.since(m)
	res.StormTotal, res.StormPeak, res.StormByOp = storm.total, storm.peak, storm.byOp
	if res.ServerCPU, res.FleetCPU, err = cpu.stop(); err != nil {
		t.Fatal(err)
	}
	res.CaughtUp = map[Kind][3]time.Duration{}
	for _, k := range []Kind{Idle, Appending, Backfilling} {
		p50, p99, worst, missing := percentiles(f.Hosts, at, k)
		res.CaughtUp[k] = [3]time.Duration{p50, p99, worst}
		res.Missing += missing
	}
	p50, p99, worst, _ := percentiles(f.Hosts, reconnectedSince(f, restart))
	res.Reconnected = [3]time.Duration{p50, p99, worst}
	if res.ServerHeap, res.HeapAll, err = serverHeap(); err != nil {
		t.Fatal(err)
	}
	_, res.PeakRSS = rss()

	// The fleet restart: every daemon stopped, then all started at once (a rollout, the
	// hosts' power back), while the conversations go on.
	if err := f.stop(); err != nil {
		t.Fatal(err)
	}
	if cpu, err = startCPU(); err != nil {
		t.Fatal(err)
	}
	m = reqs.mark()
	restart = time.Now()
	target = f.written()
	if err := f.start(ctx, len(f.Hosts)); err != nil {
		t.Fatal(err)
	}
	at = f.caughtUp(ctx, restart, target, cfg.Deadline)
	res.Restart.Seconds = time.Since(restart).Seconds()
	rs := reqs.since(m)
	res.Restart.Total, res.Restart.Peak, res.Restart.ByOp = rs.total, rs.peak, rs.byOp
	if res.Restart.ServerCPU, res.Restart.FleetCPU, err = cpu.stop(); err != nil {
		t.Fatal(err)
	}
	res.Restart.CaughtUp[0], res.Restart.CaughtUp[1], res.Restart.CaughtUp[2], res.Restart.Missing = percentiles(f.Hosts, at)

	stopConv()
	if err := waitConv(); err != nil {
		t.Error(err)
	}
	waitConv = func() error { return nil }
	res.Lines = f.lines()
	res.FailedStarts = f.failedStarts.Load()
	res.StreamMsgs = streamMsgs(t, ctx, url, f, res.Lines)
	return res
}

// streamLeaderAfter polls until the entries stream has a leader and returns when it
// got one, measured from since.
func streamLeaderAfter(ctx context.Context, c *natstest.Cluster, since time.Time) time.Duration {
	for ctx.Err() == nil {
		if c.StreamLeader(mirror.DefaultNames().Stream()) != nil {
			return time.Since(since)
		}
		time.Sleep(20 * time.Millisecond) // polling the cluster's state
	}
	return -1
}

// logFill logs the progress of the fill every 30 s until done is closed.
func logFill(t testing.TB, f *Fleet, done <-chan struct{}) {
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		var acked, written int64
		for i, h := range f.Hosts {
			if h.pub != nil {
				a, _ := h.mirrored()
				acked += a
				written += f.pis[i].written.Load()
			}
		}
		t.Logf("fill: %d of %d MiB mirrored", acked>>20, written>>20)
	}
}

// reconnectedSince returns when each host connected again after since (-1: not).
func reconnectedSince(f *Fleet, since time.Time) []time.Duration {
	at := make([]time.Duration, len(f.Hosts))
	for i, h := range f.Hosts {
		at[i] = -1
		if r := time.Unix(0, h.reconnected.Load()); r.After(since) {
			at[i] = r.Sub(since)
		}
	}
	return at
}

// provision creates the R3 stream and buckets before the fleet starts, as the first
// daemon (or `pisync run --provision update` by an operator) does once: creating an R3
// object store takes the cluster seconds, too long for hundreds of daemons racing to
// create it at once (each daemon's own provisioning then only finds it there).
func provision(t testing.TB, ctx context.Context, url string) {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := mirror.Provision(ctx, js, mirror.DefaultNames(), mirror.Config{Replicas: 3}); err != nil {
		t.Fatal(err)
	}
}

// streamMsgs waits (briefly) until the entries stream holds want messages, and returns
// what it holds.
func streamMsgs(t testing.TB, ctx context.Context, url string, f *Fleet, want int64) uint64 {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		s, err := js.Stream(ctx, mirror.DefaultNames().Stream())
		if err != nil {
			continue
		}
		info, err := s.Info(ctx)
		if err != nil {
			continue
		}
		if n = info.State.Msgs; n == uint64(want) {
			break
		}
	}
	return n
}

func countFiles(f *Fleet) int {
	n := 0
	for _, h := range f.Hosts {
		if h.pub == nil {
			continue
		}
		if r := h.pub.Progress().Roots[h.Root]; r != nil {
			n += r.Sessions
		}
	}
	return n
}

// perHostHour turns the requests of a window, by host, into requests per host per
// hour, averaged over the hosts of each kind.
func perHostHour(f *Fleet, byHost map[string]int, window time.Duration) map[Kind]float64 {
	sum, hosts := map[Kind]float64{}, map[Kind]int{}
	for _, h := range f.Hosts {
		if h.pub == nil {
			continue
		}
		sum[h.Kind] += float64(byHost[h.Name])
		hosts[h.Kind]++
	}
	out := map[Kind]float64{}
	for k, s := range sum {
		out[k] = s / float64(hosts[k]) * float64(time.Hour) / float64(window)
	}
	return out
}

// String is the run as the lines of a report.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "hosts %d (idle %d, appending %d, back-filling %d), %d sessions, %d lines\n",
		r.Hosts, r.ByKind[Idle], r.ByKind[Appending], r.ByKind[Backfilling], r.Files, r.Lines)
	fmt.Fprintf(&b, "fill: %v, %d requests\n", r.Fill.Round(time.Second), r.FillRequests)
	fmt.Fprintf(&b, "steady: requests per host per hour idle %.0f, appending %.0f; %d lines; by op %v\n",
		r.SteadyPerHostHour[Idle], r.SteadyPerHostHour[Appending], r.SteadyLines, r.SteadyByOp)
	fmt.Fprintf(&b, "storm: entries stream led again after %v\n", r.StreamLeader.Round(time.Millisecond))
	fmt.Fprintf(&b, "storm: reconnected p50 %v p99 %v last %v\n", r.Reconnected[0].Round(time.Millisecond),
		r.Reconnected[1].Round(time.Millisecond), r.Reconnected[2].Round(time.Millisecond))
	for _, k := range []Kind{Idle, Appending, Backfilling} {
		d := r.CaughtUp[k]
		fmt.Fprintf(&b, "storm: %s caught up p50 %v p99 %v last %v\n", k, d[0].Round(time.Millisecond),
			d[1].Round(time.Millisecond), d[2].Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "storm: %d requests in %.1f s, peak %d/s, missing %d; by op %v\n",
		r.StormTotal, r.StormSeconds, r.StormPeak, r.Missing, r.StormByOp)
	fmt.Fprintf(&b, "storm: server CPU %.1f s (%.0f%% of a core), fleet CPU %.1f s; server heap %d MiB of %d MiB; peak RSS %d MiB\n",
		r.ServerCPU, 100*r.ServerCPU/r.StormSeconds, r.FleetCPU, r.ServerHeap>>20, r.HeapAll>>20, r.PeakRSS>>20)
	rr := r.Restart
	fmt.Fprintf(&b, "restart: caught up p50 %v p99 %v last %v, missing %d; %d requests (%.1f per host), peak %d/s; server CPU %.1f s, fleet CPU %.1f s; by op %v\n",
		rr.CaughtUp[0].Round(time.Millisecond), rr.CaughtUp[1].Round(time.Millisecond), rr.CaughtUp[2].Round(time.Millisecond),
		rr.Missing, rr.Total, float64(rr.Total)/float64(r.Hosts), rr.Peak, rr.ServerCPU, rr.FleetCPU, rr.ByOp)
	fmt.Fprintf(&b, "stream: %d messages for %d lines written; %d daemon starts failed and were retried\n", r.StreamMsgs, r.Lines, r.FailedStarts)
	return b.String()
}
