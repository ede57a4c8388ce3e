package main

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// TestClusterLeaderLoss runs against a 3-node cluster with an R3 stream and kills the
// stream leader in the middle of a back-fill, then again during live appends: nothing is
// lost and nothing is duplicated.
func TestClusterLeaderLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	// In-process cluster: see publisher.Options.Unfenced.
	unfencedForTests.Store(true)
	defer unfencedForTests.Store(false)
	rng := rand.New(rand.NewPCG(31, 32))
	cl := natstest.RunCluster(t, 3)
	root := t.TempDir()
	files := writeSessions(t, rng, root, 30, 200)
	d := startTestDaemon(t, "--nats", cl.URLs(), "--replicas", "3", "--root", root,
		"--state-dir", t.TempDir(), "--ack-timeout", "2s")
	defer d.stop()

	killLeader := func(when string) {
		t.Helper()
		var leader *natstest.Server
		waitFor(t, 20*time.Second, "a stream leader", func() (bool, string) {
			leader = cl.StreamLeader(mirror.DefaultNames().Stream())
			return leader != nil, "none yet"
		})
		t.Logf("killing stream leader %s %s", leader.Name(), when)
		leader.Stop()
		waitFor(t, 30*time.Second, "a new stream leader", func() (bool, string) {
			return cl.StreamLeader(mirror.DefaultNames().Stream()) != nil, "none yet"
		})
		leader.Restart()
		// The node back and current again before the test goes on: the next kill, and
		// the reader at the end, need a JetStream API with a quorum behind it.
		cl.WaitMetaLeader(60 * time.Second)
	}

	// Only the moment of the first kill: a loaded machine takes longer to get there.
	waitFor(t, 3*time.Minute, "back-fill under way", func() (bool, string) {
		p := d.pub.Progress().Roots[root]
		return p != nil && p.MirroredBytes > p.Bytes/4, "not a quarter yet"
	})
	killLeader("during the back-fill")

	for i := range 300 {
		f := files[i%len(files)]
		if err := f.Append(f.Entry(200 + rng.IntN(4000))); err != nil {
			t.Fatal(err)
		}
		if i == 150 {
			killLeader("during live appends")
		}
	}
	nc := natstest.Connect(t, cl.URLs())
	r := newReader(t, nc, "t1", "alice")
	// A generous bound: on a loaded machine the three in-process nodes (with -race) lose
	// heartbeats and elect again for a while before the reads settle.
	allMirrored(t, r, root, 300*time.Second)
	requireExactlyOnce(t, nc, files, 0)
}
