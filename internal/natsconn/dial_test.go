package natsconn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pisync/pisync/internal/testutil/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDialMetrics: a connection sets pisync_nats_connected, a server restart counts a
// disconnection and a reconnection, and the gauge follows.
func TestDialMetrics(t *testing.T) {
	s := natstest.Run(t)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	nc, err := Dial(context.Background(), s.URL(), "test", 5*time.Second, zap.NewNop(), m)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := testutil.ToFloat64(m.connected); got != 1 {
		t.Fatalf("connected %v after Dial", got)
	}
	s.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(m.reconnects) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no reconnection counted")
		}
		time.Sleep(20 * time.Millisecond) // polling a counter, with a deadline
	}
	if d, c := testutil.ToFloat64(m.disconnect), testutil.ToFloat64(m.connected); d != 1 || c != 1 {
		t.Errorf("disconnects %v, connected %v after a restart", d, c)
	}
}

// TestDialTimeout: with nobody listening, Dial gives up at the timeout, the error names
// the URL without its credentials and says what failed, and the failures are warned
// about once, not per attempt.
func TestDialTimeout(t *testing.T) {
	url := fmt.Sprintf("nats://alice:s3cret@127.0.0.1:%d", natstest.FreePort(t))
	core, logs := observer.New(zapcore.InfoLevel)
	start := time.Now()
	nc, err := Dial(context.Background(), url, "test", 1500*time.Millisecond, zap.New(core), nil)
	if err == nil {
		nc.Close()
		t.Fatal("connected to nobody")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("gave up after %v", d)
	}
	msg := err.Error()
	if strings.Contains(msg, "s3cret") || !strings.Contains(msg, "nats://***@127.0.0.1") || !strings.Contains(msg, "--connect-timeout") {
		t.Errorf("error %q", msg)
	}
	if n := logs.FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
		t.Errorf("%d warnings for one cause, want 1: %v", n, logs.AllUntimed())
	}
	if strings.Contains(fmt.Sprint(logs.AllUntimed()), "s3cret") {
		t.Error("the log shows the password")
	}
}

// TestDialCancel: a cancelled context stops the retries and the error says both.
func TestDialCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err := Dial(ctx, fmt.Sprintf("nats://127.0.0.1:%d", natstest.FreePort(t)), "test", 0, zap.NewNop(), nil)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "the last attempt failed") {
		t.Errorf("error %v", err)
	}
}

func TestHint(t *testing.T) {
	for _, tc := range []struct{ err, want string }{
		{"nats: authorization violation", "--nats-user"},
		{"nats: secure connection required", "tls:// URL"},
		{"nats: secure connection not available", "TLS is configured"},
		{"remote error: tls: bad certificate", "--tls-cert"},
		{"dial tcp: connection refused", ""},
	} {
		if got := Hint(errors.New(tc.err)); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("Hint(%q) = %q, want one naming %q", tc.err, got, tc.want)
		}
	}
}
