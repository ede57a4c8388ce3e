package publisher

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// TestResumeFromLaggingReplicaResendsNothing (torture T10): a daemon mirrored lines past
// its checkpoint and died before committing it, while a node of the R3 cluster was down.
// The node comes back just before the daemon starts again: the resume must learn what
// the leader acknowledged past the checkpoint, whichever replica answers its reads.
// Reading the restarted replica, it found nothing past the checkpoint and sent every line
// again (duplicates the window caught; past the window, lines stored twice).
func TestResumeFromLaggingReplicaResendsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster := natstest.RunCluster(t, 3)
	url := cluster.URLs()
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	names := mirror.DefaultNames()
	mirrortest.Provision(t, ctx, js, names, mirror.Config{Replicas: 3})
	root, stateDir := t.TempDir(), t.TempDir()
	f := sessiontest.New(rand.New(rand.NewPCG(10, 10)), root, "/home/dev/p", sessiontest.CLIV3)
	lines := [][]byte{f.HeaderLine("/home/dev/p")}
	for range 50 {
		lines = append(lines, f.Entry(300))
	}
	if err := f.Append(lines...); err != nil {
		t.Fatal(err)
	}
	var last *Publisher
	run := func(what string) {
		t.Helper()
		runDaemon(t, ctx, url, stateDir, watcher.Options{Roots: []string{root}}, f.ID, what, nil,
			func(p *Publisher, c mirror.Conv) bool {
				last = p
				pr := p.Progress().Roots[root]
				return pr != nil && pr.Mirrored == 1 && newestIs(ctx, p, c, 1, f.Lines)
			})
	}
	run("the file mirrored")
	// A stream far larger than what the node will miss: a replica serves direct gets
	// once it holds 90 % of its stream, so the restarted node answers at once.
	mirrortest.FillStream(t, ctx, js, names, 20_000)
	for round := range 3 {
		saved := copyDir(t, stateDir)
		follower := cluster.StreamFollower(names.Stream(), 20*time.Second)
		follower.Stop()
		more := make([][]byte, 0, 1000)
		for range cap(more) {
			more = append(more, f.Entry(300))
		}
		if err := f.Append(more...); err != nil {
			t.Fatal(err)
		}
		run("the appended lines mirrored with a node down")
		// The daemon "died before committing": its state is the one before.
		restoreDir(t, saved, stateDir)
		follower.Start()
		run("the file found mirrored after the node came back")
		if n := testutil.ToFloat64(last.m.duplicates); n != 0 {
			t.Fatalf("round %d: %v lines sent again that the mirror held", round, n)
		}
	}
}

// restoreDir puts saved (a copyDir) back in dir's place.
func restoreDir(t *testing.T, saved, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(saved, dir); err != nil {
		t.Fatal(err)
	}
}

// copyDir copies the files of dir (one level) into a new temporary directory.
func copyDir(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
