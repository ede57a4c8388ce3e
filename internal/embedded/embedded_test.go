package embedded

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/pisync/pisync/internal/testutil/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestIsLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.8.9.1": true, "::1": true, "localhost": true, "LOCALHOST": true,
		"": false, "0.0.0.0": false, "::": false, "10.1.2.3": false, "nats.example.org": false,
	} {
		if got := IsLoopback(host); got != want {
			t.Errorf("IsLoopback(%q) = %v", host, got)
		}
	}
}

// TestStart: the server accepts connections with JetStream on, with the payload limit
// the blob threshold relies on, and keeps its store private under the directory given.
func TestStart(t *testing.T) {
	port := natstest.FreePort(t)
	store := filepath.Join(t.TempDir(), "state", "jetstream")
	ns, err := Start(zaptest.NewLogger(t), "127.0.0.1", port, store)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if fi, err := os.Stat(store); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("store %s: %v, %v; want mode 0700", store, fi, err)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(); err != nil {
		t.Fatalf("JetStream is not enabled: %v", err)
	}
	if mp := nc.MaxPayload(); mp != 1<<20 {
		t.Errorf("max payload %d, want 1 MiB", mp)
	}
}
