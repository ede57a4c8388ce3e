package fleet

import (
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/natsconn"
)

// TestFleetSmoke runs the simulator small: five hosts (three idle, one appending, one
// back-filling) through fill, steady state, a short outage of the whole cluster and a
// restart of every daemon. Every host catches up by itself and every line is in the
// mirror exactly once. It takes about 30 s on 2 cores, most of it the 3-node cluster
// electing its leaders again after the outage: too long for the default run, so it
// runs with PISYNC_FLEET_SMOKE=1 (make fleet-smoke).
func TestFleetSmoke(t *testing.T) {
	if os.Getenv("PISYNC_FLEET_SMOKE") == "" {
		t.Skip("set PISYNC_FLEET_SMOKE=1 (make fleet-smoke)")
	}
	res := Run(t, Config{
		Mix: Mix{
			Hosts: 5, IdleFiles: [2]int{10, 40}, Appending: 0.2, Backfilling: 0.2,
			AppendEvery: 200 * time.Millisecond, BackfillFiles: 20, BackfillEntries: 10,
		},
		Steady: 500 * time.Millisecond, Outage: 500 * time.Millisecond, Deadline: time.Minute,
		Reconnect:  natsconn.Backoff{Base: 50 * time.Millisecond, Max: 500 * time.Millisecond},
		AckTimeout: time.Second,
	})
	t.Log("\n" + res.String())
	if res.Missing > 0 || res.Restart.Missing > 0 {
		t.Errorf("%d hosts did not catch up after the outage, %d after the restart", res.Missing, res.Restart.Missing)
	}
	if res.ByKind[Idle] != 3 || res.ByKind[Appending] != 1 || res.ByKind[Backfilling] != 1 {
		t.Errorf("mix %v, want 3 idle, 1 appending, 1 back-filling", res.ByKind)
	}
	if res.StreamMsgs != uint64(res.Lines) {
		t.Errorf("the stream holds %d messages for %d lines written", res.StreamMsgs, res.Lines)
	}
	if res.SteadyLines == 0 || res.SteadyPerHostHour[Appending] == 0 {
		t.Errorf("steady state: %d lines, %.0f requests per appending host per hour", res.SteadyLines, res.SteadyPerHostHour[Appending])
	}
	if res.ServerCPU <= 0 || res.ServerHeap <= 0 {
		t.Errorf("the cluster's CPU (%.2f s) and heap (%d B) were not told apart", res.ServerCPU, res.ServerHeap)
	}
}

// TestFleet is the measured run (make fleet): PISYNC_FLEET=N hosts, most idle with 100
// to 5,000 mirrored sessions, one in 12 appending a line every 5 s, one in 50
// back-filling 200 sessions; steady state measured for a minute, then a 60 s outage of
// the whole cluster (PISYNC_FLEET_OUTAGE).
func TestFleet(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("PISYNC_FLEET"))
	if n == 0 {
		t.Skip("set PISYNC_FLEET=N (make fleet)")
	}
	outage := time.Minute
	if s := os.Getenv("PISYNC_FLEET_OUTAGE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		outage = d
	}
	deadline := 15 * time.Minute
	if s := os.Getenv("PISYNC_FLEET_DEADLINE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		deadline = d
	}
	var log *zap.Logger
	if path := os.Getenv("PISYNC_FLEET_LOG"); path != "" {
		cfg := zap.NewProductionConfig()
		cfg.OutputPaths = []string{path}
		var err error
		if log, err = cfg.Build(); err != nil {
			t.Fatal(err)
		}
	}
	maxFiles := 5000
	if s := os.Getenv("PISYNC_FLEET_MAX_FILES"); s != "" {
		maxFiles, _ = strconv.Atoi(s)
	}
	res := Run(t, Config{
		Mix: Mix{
			Hosts: n, IdleFiles: [2]int{100, maxFiles}, Appending: 1.0 / 12, Backfilling: 1.0 / 50,
			AppendEvery: 5 * time.Second, BackfillFiles: 200, BackfillEntries: 20,
		},
		Steady: time.Minute, Outage: outage, Deadline: deadline, Log: log,
	})
	t.Log("\n" + res.String())
	if res.Missing > 0 || res.Restart.Missing > 0 {
		t.Errorf("%d hosts did not catch up after the outage, %d after the restart", res.Missing, res.Restart.Missing)
	}
	if res.StreamMsgs != uint64(res.Lines) {
		t.Errorf("the stream holds %d messages for %d lines written", res.StreamMsgs, res.Lines)
	}
}
