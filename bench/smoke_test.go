package bench

import (
	"testing"
	"time"
)

// TestSmoke runs every case of the suite at a tiny size, so that the suite keeps working:
// CI runs it with the other tests, in seconds. Its figures mean nothing; what it checks
// is that each case runs to its end and that the checks inside the cases pass (every
// line in the stream, every byte mirrored, recovered files equal to the originals). The
// full suite is bench/run.sh.
func TestSmoke(t *testing.T) {
	tiny := spec{name: "smoke", sessions: 6, entries: 20, perDir: 2, seed: 9, blob: true}
	t.Run("backfill", func(t *testing.T) {
		w := getWorkload(t, tiny)
		if w.blobs == 0 {
			t.Fatal("the smoke workload has no blob line")
		}
		r := runBackfill(t, "smoke", w, 1, 64)
		if r.pisync <= 0 || r.raw <= 0 {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("live", func(t *testing.T) {
		r := runLive(t, liveConfig{files: 4, rate: 200, duration: 300 * time.Millisecond, warmup: 100 * time.Millisecond})
		if len(r.lat) == 0 || len(r.raw) == 0 {
			t.Fatalf("no latency measured: %+v", r)
		}
	})
	t.Run("follow", func(t *testing.T) {
		r := runFollow(t, followConfig{liveConfig: liveConfig{files: 4, rate: 200, duration: 300 * time.Millisecond, warmup: 100 * time.Millisecond}, backlog: 10})
		if len(r.lag) == 0 || r.caughtUpLines == 0 || r.rawLines == 0 {
			t.Fatalf("nothing measured: %+v", r)
		}
	})
	t.Run("recovery", func(t *testing.T) {
		fx := recoveryFixture(t, tiny)
		rawRead(t, fx)
		runRecovery(t, fx, true, 4)
		runRecovery(t, fx, false, 4)
	})
	t.Run("daemon", func(t *testing.T) {
		r := runIdle(t, 20, 2, time.Second, 0, false)
		if r.idleRSS <= 0 || r.peakRSS <= 0 {
			t.Fatalf("%+v", r)
		}
		if r := runIdle(t, 20, 2, time.Second, 2, false, "--verify-interval", "500ms", "--verify-rate", "1000", "--verify-first-rate", "1000"); r.idleRSS <= 0 {
			t.Fatalf("verified: %+v", r)
		}
		runDaemonBackfill(t, getWorkload(t, spec{name: "smoke-big", bigBytes: 2 << 20, seed: 4}))
		runDaemonBackfill(t, getWorkload(t, filesSpec(30, 2)))
		if r := runCPU(t, getWorkload(t, spec{name: "smoke-cpu", sessions: 4, entries: 20, perDir: 2, seed: 15})); r.pisyncCPU <= 0 || r.rawCPU <= 0 || r.coreCPU <= 0 {
			t.Fatalf("CPU per line: %+v", r)
		}
	})
	t.Run("store", func(t *testing.T) {
		// Entries of 16 KiB, so that open needs more than one reply.
		r := runStore(t, storeConfig{appends: 20, warmup: 5, openEntries: 120, opens: 1, sessions: 5, perSession: 5, entryBytes: 16 << 10})
		if len(r.store) != 20 || len(r.raw) != 20 || len(r.jsonl) != 20 || len(r.rawRead) != 1 || r.pages < 2 || r.perSec <= 0 || r.rawPerSec <= 0 {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("capacity", func(t *testing.T) {
		r := runCapacity(t, 300, 500, 300, 0)
		if r.convHot <= 0 || r.headHot <= 0 || r.diskPerEntry <= r.payloadPerEntry {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("a 3-node cluster: not in -short")
		}
		runBackfill(t, "smoke-cluster", getWorkload(t, tiny), 3, 64)
	})
}
