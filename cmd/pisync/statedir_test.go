package main

import (
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pisync/pisync/natstest"
)

// TestStateDirUnwritable: the checkpoint store stops accepting writes (made immutable,
// which binds root too). Publishing goes on, the failure is counted, and after a restart
// with the stale store the mirror is consulted, so nothing is published twice.
func TestStateDirUnwritable(t *testing.T) {
	rng := rand.New(rand.NewPCG(71, 72))
	srv := natstest.Run(t)
	root, state := t.TempDir(), t.TempDir()
	files := writeSessions(t, rng, root, 5, 10)
	args := []string{"--nats", srv.URL(), "--root", root, "--state-dir", state, "--duplicate-window", "1s"}
	d := startTestDaemon(t, args...)
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 20*time.Second)

	db := filepath.Join(state, "checkpoints", "checkpoints.db")
	if out, err := exec.Command("chattr", "+i", db).CombinedOutput(); err != nil {
		d.stop()
		t.Skipf("cannot make the store immutable here (needs chattr and CAP_LINUX_IMMUTABLE): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-i", db).Run() })
	for _, f := range files {
		if err := f.Append(f.Entry(400), f.Entry(400)); err != nil {
			t.Fatal(err)
		}
	}
	allMirrored(t, r, root, 20*time.Second)
	waitFor(t, 10*time.Second, "commit failures counted", func() (bool, string) {
		n := metricValue(t, d, "pisync_checkpoint_errors_total", map[string]string{"reason": "commit"})
		return n > 0, "none yet"
	})
	if err := d.stop(); err == nil {
		t.Error("stop reported no error although the final checkpoint commit cannot be written")
	}
	if err := exec.Command("chattr", "-i", db).Run(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the 1 s duplicate window must not be what saves us
	d = startTestDaemon(t, args...)
	defer d.stop()
	for _, f := range files[:2] {
		if err := f.Append(f.Entry(400)); err != nil {
			t.Fatal(err)
		}
	}
	allMirrored(t, r, root, 20*time.Second)
	requireExactlyOnce(t, nc, files, 0)
}
