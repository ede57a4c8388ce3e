package natsconn

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/testutil/natstest"
)

// TestBackoffDelay: every wait lies in [0, min(Max, Base·2ⁿ⁻¹)], the ceiling doubles
// until it reaches Max and stays there for any n, and the draws use the whole interval
// (full jitter, not a fixed wait plus a little noise).
func TestBackoffDelay(t *testing.T) {
	b := Backoff{Base: 250 * time.Millisecond, Max: 30 * time.Second}
	for _, tc := range []struct {
		n       int
		ceiling time.Duration
	}{
		{0, 250 * time.Millisecond}, // treated as the first attempt
		{1, 250 * time.Millisecond},
		{2, 500 * time.Millisecond},
		{3, time.Second},
		{7, 16 * time.Second},
		{8, 30 * time.Second}, // 32 s, capped
		{9, 30 * time.Second},
		{64, 30 * time.Second},
		{1 << 30, 30 * time.Second}, // no overflow
	} {
		var lo, hi time.Duration = tc.ceiling, 0
		var sum time.Duration
		const draws = 2000
		for range draws {
			d := b.Delay(tc.n)
			if d < 0 || d > tc.ceiling {
				t.Fatalf("Delay(%d) = %v, outside [0, %v]", tc.n, d, tc.ceiling)
			}
			lo, hi, sum = min(lo, d), max(hi, d), sum+d
		}
		// With 2,000 uniform draws the extremes fall within 1 % of the edges and the
		// mean within 5 % of the middle, except with probability below 10⁻⁸.
		if lo > tc.ceiling/50 || hi < tc.ceiling-tc.ceiling/50 {
			t.Errorf("Delay(%d) drew only within [%v, %v] of [0, %v]", tc.n, lo, hi, tc.ceiling)
		}
		if mean := sum / draws; mean < tc.ceiling*45/100 || mean > tc.ceiling*55/100 {
			t.Errorf("Delay(%d) mean %v, want about %v", tc.n, mean, tc.ceiling/2)
		}
	}
}

// TestReconnectSpreads: a real server stopped for a while, then started again. The
// client's attempts while it is down follow the backoff (their number stays near
// log₂(Max/Base) plus outage/(Max/2), far from a tight loop), it reconnects within one
// capped wait of the server's return, and the next outage starts from Base again (the
// backoff was reset by the success).
func TestReconnectSpreads(t *testing.T) {
	s := natstest.Run(t)
	b := Backoff{Base: 20 * time.Millisecond, Max: 160 * time.Millisecond}
	var failed, first atomic.Int64
	// b.Option, with the attempt numbers the client passes recorded.
	delay := nats.CustomReconnectDelay(func(n int) time.Duration {
		first.CompareAndSwap(0, int64(n))
		return b.Delay(n)
	})
	nc, err := Dial(context.Background(), s.URL(), "test", 5*time.Second, zap.NewNop(), nil, delay,
		nats.ReconnectErrHandler(func(*nats.Conn, error) { failed.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for round := range 2 {
		failed.Store(0)
		first.Store(0)
		s.Stop()
		waitFor(t, "the client to see the server gone", func() bool { return !nc.IsConnected() })
		const outage = 1500 * time.Millisecond
		time.Sleep(outage) // the outage itself, not a synchronisation
		n := failed.Load()
		// Ceilings 20, 40, 80 ms, then 160 ms: about 70 ms of expected waits to reach the
		// cap, then 80 ms on average: about 20 attempts in 1.5 s. No wait at all would
		// make thousands.
		if n < 4 || n > 80 {
			t.Errorf("round %d: %d failed attempts in a %v outage, want about 20", round, n, outage)
		}
		if f := first.Load(); f != 1 {
			t.Errorf("round %d: the first wait of the outage was for attempt %d, want 1 (reset by the last success)", round, f)
		}
		back := time.Now()
		s.Start()
		waitFor(t, "the reconnection", nc.IsConnected)
		if d := time.Since(back); d > b.Max+time.Second {
			t.Errorf("round %d: reconnected %v after the server came back, want within one capped wait (%v)", round, d, b.Max)
		}
	}
}

// waitFor polls cond until it holds, failing after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, with a deadline
	}
}
