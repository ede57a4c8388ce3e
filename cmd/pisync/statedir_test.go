package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
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
	requireNoDuplicateAcks(t, d)
}

// TestHeadWrittenAfterCrashBeforeHeadFlush: a daemon killed after committing its
// checkpoints but before writing the heads left conversations whose lines are all in the
// mirror and whose heads are missing. The next start writes them, although no line is
// left to publish.
func TestHeadWrittenAfterCrashBeforeHeadFlush(t *testing.T) {
	rng := rand.New(rand.NewPCG(73, 74))
	srv := natstest.Run(t)
	root, state := t.TempDir(), t.TempDir()
	files := writeSessions(t, rng, root, 4, 6)
	args := []string{"--nats", srv.URL(), "--root", root, "--state-dir", state}
	d := startTestDaemon(t, args...)
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 20*time.Second)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	heads := func() map[string]mirror.Head {
		hs, err := r.Heads(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]mirror.Head{}
		for _, h := range hs {
			out[h.Key] = h
		}
		return out
	}
	written := heads()
	if len(written) != len(files) {
		t.Fatalf("%d heads after a graceful stop, want %d", len(written), len(files))
	}

	// The state of the crash: checkpoints that do not record the heads as written, and
	// no heads in the mirror.
	store, _, err := checkpoint.Open(filepath.Join(state, "checkpoints"), nil)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := store.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if rec.HeadSeq != rec.StreamSeq || rec.StreamSeq == 0 {
			t.Errorf("%s: checkpoint records head sequence %d for stream sequence %d after a graceful stop", rec.Rel, rec.HeadSeq, rec.StreamSeq)
		}
		rec.HeadSeq = 0
		store.Put(rec)
	}
	if err := store.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), mirror.DefaultNames().HeadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		c, _ := r.Conv(f.ID)
		if err := kv.Purge(context.Background(), c.HeadKey()); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(heads()); n != 0 {
		t.Fatalf("%d heads left after purging them", n)
	}

	d = startTestDaemon(t, args...)
	defer d.stop()
	waitFor(t, 20*time.Second, "every head written again", func() (bool, string) {
		got := heads()
		for key, want := range written {
			h, ok := got[key]
			if !ok {
				return false, "no head for " + key
			}
			if h.LastSeq != want.LastSeq || h.Head != want.Head || h.Entries != want.Entries {
				return false, fmt.Sprintf("%s: head %+v, want %+v", key, h, want)
			}
		}
		return true, ""
	})
}
