package main

import (
	"flag"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

// outageFor is short in `make test`; `make soak` runs the long version.
var outageFor = flag.Duration("outage", 30*time.Second, "length of the long NATS outage test")

// TestLongOutageMemoryFlat: NATS is unreachable for -outage (30 s; 2 min and about 100 MB
// of lines with `make soak`) while about 800 KB per second of lines are appended. The daemon's memory stays flat (the files are the buffer, not the
// heap), readiness goes false, and everything arrives once after the server returns.
func TestLongOutageMemoryFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("long outage")
	}
	rng := rand.New(rand.NewPCG(41, 42))
	srv := natstest.Run(t)
	root := t.TempDir()
	files := writeSessions(t, rng, root, 20, 5)
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir(),
		"--ack-timeout", "2s", "--window-bytes", "8388608")
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 30*time.Second)

	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	base := heap()
	srv.Stop()
	waitFor(t, 10*time.Second, "not ready during the outage", func() (bool, string) {
		ok, why := d.ready()
		return !ok, why
	})
	var peak uint64
	var written int64
	extra := 0
	deadline := time.Now().Add(*outageFor)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		for range 200 { // ~800 KB per second
			// Written without keeping a copy (File.Append would), so that the heap
			// measured is the daemon's.
			f := files[rng.IntN(len(files))]
			line := f.Message(2000 + rng.IntN(4000))
			if err := sessiontest.AppendBytes(f.Path, append(line, '\n')); err != nil {
				t.Fatal(err)
			}
			written += int64(len(line) + 1)
			extra++
		}
		<-tick.C // the writer's pace
		peak = max(peak, heap())
	}
	growth := int64(peak) - int64(base)
	t.Logf("outage of %v: %d MB appended, heap %d MB → peak %d MB", *outageFor, written>>20, base>>20, peak>>20)
	if growth > 48<<20 {
		t.Fatalf("heap grew by %d MB while %d MB were appended during the outage", growth>>20, written>>20)
	}
	srv.Restart()
	waitFor(t, 30*time.Second, "ready again", func() (bool, string) { return d.ready() })
	allMirrored(t, r, root, 120*time.Second)
	requireExactlyOnce(t, nc, files, extra)
}
