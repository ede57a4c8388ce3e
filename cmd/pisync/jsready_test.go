package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
)

// A cluster that is still coming up: the commands wait for JetStream (issue 26 item 7).

// getURL returns the status code and body of a GET of url, or 0 and the error.
func getURL(url string) (int, string) {
	resp, err := http.Get(url) //nolint:noctx // a test's poll of its own server
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// startingCluster is a 3-node cluster with only its first node running: no metadata
// leader until the test starts a second one.
func startingCluster(t *testing.T) *natstest.Cluster {
	t.Helper()
	cl := natstest.NewCluster(t, 3)
	cl.Nodes[0].Start()
	return cl
}

// awaitJetStreamWait runs a command that must wait for JetStream: its /readyz says so
// (and why) and pisync_jetstream_ready is 0 while it waits, then the cluster's other
// nodes start, and /readyz says ready, pisync_jetstream_ready is 1, and the command
// logged one line when the wait began and one when it ended.
func awaitJetStreamWait(t *testing.T, cl *natstest.Cluster, base string, done <-chan error, logs *daemontest.Output) {
	t.Helper()
	waitFor(t, 60*time.Second, "/readyz to say it waits for JetStream", func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("the command ended while the cluster had no leader: %v\n%s", err, logs.Tail(4000))
		default:
		}
		code, body := getURL(base + "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for JetStream"), fmt.Sprintf("%d %q", code, body)
	})
	if _, m := getURL(base + "/metrics"); !strings.Contains(m, "pisync_jetstream_ready 0") {
		t.Errorf("metrics while waiting:\n%s", grepLines(m, "pisync_jetstream"))
	}
	// The command has waited for seconds; the cluster now elects its leader.
	cl.Nodes[1].Start()
	cl.Nodes[2].Start()
	waitFor(t, 90*time.Second, "/readyz to say ready", func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("the command ended once the cluster came up: %v\n%s", err, logs.Tail(4000))
		default:
		}
		code, body := getURL(base + "/readyz")
		return code == http.StatusOK, fmt.Sprintf("%d %q", code, body)
	})
	_, m := getURL(base + "/metrics")
	if !strings.Contains(m, "pisync_jetstream_ready 1") || strings.Contains(m, "pisync_jetstream_not_ready_total 0") {
		t.Errorf("metrics once ready:\n%s", grepLines(m, "pisync_jetstream"))
	}
	out := logs.Tail(1 << 20)
	if n := strings.Count(out, "JetStream not ready; waiting with backoff"); n != 1 {
		t.Errorf("%d log lines saying the wait began, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, `"JetStream ready"`); n != 1 {
		t.Errorf("%d log lines saying JetStream is ready, want 1:\n%s", n, out)
	}
}

// startCommand runs cmd with args in the background against a cluster with only its
// first node up, serving HTTP on a free port; the test calls stop at its end.
func startCommand(t *testing.T, cmd func(context.Context, []string, io.Writer, io.Writer) error,
	args ...string) (cl *natstest.Cluster, base string, stop func() error, done <-chan error, logs *daemontest.Output) {
	t.Helper()
	cl = startingCluster(t)
	addr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	logs = &daemontest.Output{}
	ch := make(chan error, 1)
	go func() {
		ch <- cmd(ctx, append([]string{"--nats", cl.URLs(), "--replicas", "3", "--http-addr", addr}, args...), io.Discard, logs)
	}()
	return cl, "http://" + addr, func() error { cancel(); return <-ch }, ch, logs
}

func grepLines(s, sub string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestRunWaitsForJetStream: pisync run started against a 3-node cluster before it has a
// metadata leader waits for one (not ready in /readyz meanwhile), then mirrors.
func TestRunWaitsForJetStream(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	// In-process cluster: see publisher.Options.Unfenced.
	unfencedForTests.Store(true)
	defer unfencedForTests.Store(false)
	root := t.TempDir()
	writeSessions(t, rand.New(rand.NewPCG(41, 42)), root, 3, 5)
	cl, base, stop, done, logs := startCommand(t, RunCommand, "--root", root, "--state-dir", t.TempDir(),
		"--tenant", "t1", "--owner", "alice")
	awaitJetStreamWait(t, cl, base, done, logs)
	nc := natstest.Connect(t, cl.URLs())
	allMirrored(t, newReader(t, nc, "t1", "alice"), root, 60*time.Second)
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestServeWaitsForJetStream: pisync serve, likewise.
func TestServeWaitsForJetStream(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	cl, base, stop, done, logs := startCommand(t, ServeCommand)
	awaitJetStreamWait(t, cl, base, done, logs)
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// TestRecoverWaitsForRestartedCluster: recover --all started right after every node of
// the cluster was restarted (connections are accepted before JetStream has elected its
// leaders again) waits for JetStream within --connect-timeout and restores every file.
func TestRecoverWaitsForRestartedCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	unfencedForTests.Store(true)
	defer unfencedForTests.Store(false)
	cl := natstest.RunCluster(t, 3)
	root := filepath.Join(t.TempDir(), "sessions")
	writeSessions(t, rand.New(rand.NewPCG(43, 44)), root, 4, 8)
	d := startTestDaemon(t, "--nats", cl.URLs(), "--replicas", "3", "--root", root, "--state-dir", t.TempDir())
	nc := natstest.Connect(t, cl.URLs())
	allMirrored(t, newReader(t, nc, "t1", "alice"), root, 60*time.Second)
	if err := d.stop(); err != nil { // flushes the heads
		t.Fatal(err)
	}
	nc.Close()
	want := treeOf(t, root)
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	for _, s := range cl.Nodes {
		s.Stop()
	}
	for _, s := range cl.Nodes {
		s.Start()
	}
	// No deadline on the command's context, as on the command line: each request of the
	// JetStream client then has its default timeout.
	var stdout, stderr bytes.Buffer
	err := RecoverCommand(context.Background(), []string{"--nats", cl.URLs(), "--tenant", "t1", "--owner", "alice",
		"--root", root, "--all", "--connect-timeout", "90s"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("recover --all right after a restart: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	sameTree(t, treeOf(t, root), want)
}
