package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/daemontest"
)

// TestStopWhileConnectingIsGraceful (torture, seed 997301228584): a SIGTERM while the
// daemon waits for NATS at start-up made it exit 1 ("connect to NATS: context
// canceled"). A stop asked for during start-up is a graceful stop.
func TestStopWhileConnectingIsGraceful(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nobody listens there now: NATS is down
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr daemontest.Output
	done := make(chan error, 1)
	go func() {
		done <- RunCommand(ctx, []string{"--nats", "nats://" + addr, "--root", t.TempDir(), "--state-dir", t.TempDir(),
			"--http-addr", "", "--tenant", "t1", "--owner", "alice"}, &bytes.Buffer{}, &stderr)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.Tail(1<<16), "cannot reach NATS yet") {
		select {
		case err := <-done:
			t.Fatalf("run ended before the stop: %v\n%s", err, stderr.Tail(1<<16))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection attempt logged:\n%s", stderr.Tail(1<<16))
		}
	}
	cancel() // what the first SIGTERM does
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stopped while connecting: %v, want a graceful stop", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after the stop")
	}
}
