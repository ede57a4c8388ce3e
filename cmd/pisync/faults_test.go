package main

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// childEnv makes the test binary act as the pisync command (see TestMain); used only by
// tests that need the daemon in a process of its own when no built binary is at hand.
const childEnv = "PISYNC_TEST_CHILD"

// TestLineInTwoWritesPublishedOnceWhole: a line written in two writes with a pause
// between is published once, complete.
func TestLineInTwoWritesPublishedOnceWhole(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	srv := natstest.Run(t)
	root := t.TempDir()
	f := sessiontest.New(rng, root, "/p", sessiontest.HarnessV3)
	if err := f.Append(f.HeaderLine("/p"), f.Entry(400)); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 20*time.Second)

	line := f.Message(3000)
	err := f.AppendSplit(line, 1200, func() {
		// The first half is on disk: the daemon must hold it back, not publish it.
		waitFor(t, 5*time.Second, "torn tail seen", func() (bool, string) {
			p := d.pub.Progress()
			rp := p.Roots[root]
			return rp != nil && rp.TornBytes == 1200, "torn bytes not reported yet"
		})
		for _, m := range readStream(t, nc) {
			if m.line.Ordinal == 2 {
				t.Fatal("half a line was published")
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	allMirrored(t, r, root, 20*time.Second)
	msgs := readStream(t, nc)
	if len(msgs) != 3 || !bytes.Equal(msgs[2].data, line) {
		t.Fatalf("want 3 messages, the last the whole line; got %d", len(msgs))
	}
}

// TestBlobLineRoundTrip: a 3 MB line goes through the object store and reads back
// byte-identical through the mirror read API.
func TestBlobLineRoundTrip(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	srv := natstest.Run(t)
	root := t.TempDir()
	f := sessiontest.New(rng, root, "/img", sessiontest.HarnessV3)
	big := f.ImageEntry(2_300_000) // 3.07 MB once base64-encoded
	if len(big) < 3_000_000 {
		t.Fatalf("test line only %d bytes", len(big))
	}
	if err := f.Append(f.HeaderLine("/img"), f.Entry(300), big, f.Entry(300)); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _ := r.Conv(f.ID)
	g, err := r.ReadGeneration(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := g.Msgs[2]
	if m.Kind != mirror.KindBlob || len(m.Data) != 0 || m.BlobSize != int64(len(big)) {
		t.Fatalf("line 3 is %+v with %d body bytes, want a blob reference", m.Line, len(m.Data))
	}
	rc, err := r.Blob(ctx, m.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("blob read back differs (err %v, %d bytes)", err, len(got))
	}
	if m.EntryType != "message" || m.EntryID == "" {
		t.Fatalf("blob message lost its envelope: %+v", m.Line)
	}
}

// TestStateDirLostNoDuplicates: the state directory is deleted (or its checkpoint store
// corrupted) between two runs; the second run learns from the mirror what it holds and
// publishes nothing twice, although the 1 s duplicate window has long passed.
func TestStateDirLostNoDuplicates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		harm func(t *testing.T, state string)
	}{
		{"deleted", func(t *testing.T, state string) {
			if err := os.RemoveAll(state); err != nil {
				t.Fatal(err)
			}
		}},
		{"corrupt", func(t *testing.T, state string) {
			db := filepath.Join(state, "checkpoints", "checkpoints.db")
			if err := os.WriteFile(db, bytes.Repeat([]byte{0xAB}, 8192), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(7, 8))
			srv := natstest.Run(t)
			root, state := t.TempDir(), t.TempDir()
			files := writeSessions(t, rng, root, 8, 40)

			d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", state, "--duplicate-window", "1s")
			nc := natstest.Connect(t, srv.URL())
			r := newReader(t, nc, "t1", "alice")
			allMirrored(t, r, root, 30*time.Second)
			if err := d.stop(); err != nil {
				t.Fatal(err)
			}
			tc.harm(t, state)
			for _, f := range files[:4] {
				if err := f.Append(f.Entry(600)); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(1100 * time.Millisecond) // let the 1 s duplicate window pass: it must not be what saves us
			d = startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", state, "--duplicate-window", "1s")
			defer d.stop()
			allMirrored(t, r, root, 30*time.Second)
			requireExactlyOnce(t, nc, files, 0)
			requireNoDuplicateAcks(t, d)
		})
	}
}

// TestEmbeddedServerByDefault: with no --nats the daemon starts its own JetStream server
// on the listen address, its store under the state directory, and mirrors there.
func TestEmbeddedServerByDefault(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	root, state := t.TempDir(), t.TempDir()
	writeSessions(t, rng, root, 3, 5)
	listen := "127.0.0.1:" + strconv.Itoa(natstest.FreePort(t))
	d := startTestDaemon(t, "--nats-listen", listen, "--root", root, "--state-dir", state)
	defer d.stop()
	nc := natstest.Connect(t, "nats://"+listen)
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 30*time.Second)
	if _, err := os.Stat(filepath.Join(state, "jetstream")); err != nil {
		t.Errorf("embedded store not under the state directory: %v", err)
	}
	nc.Close()
}

// TestServerOutage: the server is stopped for 10 s while lines keep being appended, then
// restarted on the same store: everything arrives, once.
func TestServerOutage(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("10 s outage")
	}
	rng := rand.New(rand.NewPCG(9, 10))
	srv := natstest.Run(t)
	root := t.TempDir()
	files := writeSessions(t, rng, root, 5, 10)
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir(), "--ack-timeout", "2s")
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 30*time.Second)

	srv.Stop()
	waitFor(t, 5*time.Second, "daemon sees the outage", func() (bool, string) {
		ok, why := d.ready()
		return !ok, why
	})
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		f := files[i%len(files)]
		if err := f.Append(f.Entry(200 + rng.IntN(3000))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the writer's pace during the outage
	}
	srv.Restart()
	allMirrored(t, r, root, 60*time.Second)
	requireExactlyOnce(t, nc, files, 0)
}

// TestSIGKILLExactlyOnce kills the daemon process at 30 random moments of a back-fill
// plus live-append workload, with a 1 s duplicate window and every restart more than
// 1 s later: at the end every line is in the stream exactly once.
func TestSIGKILLExactlyOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("30 kills")
	}
	bin := daemontest.Binary(t)
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (reproduce with -args -chaos.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	srv := natstest.Run(t)
	root, state := t.TempDir(), t.TempDir()
	files := writeSessions(t, rng, root, 40, 150)

	ctx, stopWriter := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	var mu sync.Mutex
	go func() { // live appends, some of them in two writes
		defer wg.Done()
		wrng := rand.New(rand.NewPCG(seed, 12))
		for ctx.Err() == nil {
			mu.Lock()
			f := files[wrng.IntN(len(files))]
			line := f.Entry(200 + wrng.IntN(6000))
			var err error
			if wrng.IntN(4) == 0 {
				err = f.AppendSplit(line, 1+wrng.IntN(len(line)), nil)
			} else {
				err = f.Append(line)
			}
			mu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(2+wrng.IntN(10)) * time.Millisecond): // writer pace
			}
		}
	}()
	killRng := rand.New(rand.NewPCG(seed, 13)) // the files own rng; the writer goroutine uses it
	args := []string{"run", "--nats", srv.URL(), "--root", root, "--state-dir", state,
		"--http-addr", "", "--duplicate-window", "1s", "--tenant", "t1", "--owner", "alice", "--log-level", "warn"}
	for i := range 30 {
		cmd := exec.Command(bin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(20+killRng.IntN(1500)) * time.Millisecond) // a random moment to kill at
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		if bytes.Contains(stderr.Bytes(), []byte(`"level":"error"`)) {
			t.Logf("run %d logged errors:\n%s", i, stderr.String())
		}
		time.Sleep(1100 * time.Millisecond) // the 1 s duplicate window must have passed
	}
	stopWriter()
	wg.Wait()

	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 120*time.Second)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("graceful stop: %v\n%s", err, stderr.String())
	}
	msgs := requireExactlyOnce(t, nc, files, 0)
	t.Logf("seed %d: %d lines mirrored exactly once across 30 SIGKILLs", seed, len(msgs))
}
