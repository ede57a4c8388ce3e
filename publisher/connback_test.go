package publisher

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
)

// TestConnBackWakesOnReconnect: a reconciliation waiting on connBack is woken when the
// connection to a real server comes back after a restart, not before, and the next wait
// is a fresh one (it does not fire again without another reconnection).
func TestConnBackWakesOnReconnect(t *testing.T) {
	srv := natstest.Run(t)
	nc := natstest.Connect(t, srv.URL())
	var b connBack
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go b.watch(ctx, &wg, nc)
	defer func() { cancel(); wg.Wait() }()

	woken := b.wait()
	srv.Stop()
	select {
	case <-woken:
		t.Fatal("woken while the server is down")
	case <-time.After(200 * time.Millisecond): // nothing may happen meanwhile
	}
	srv.Start()
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("not woken within 10 s of the server's return")
	}
	if next := b.wait(); next == woken {
		t.Fatal("the next wait is the channel already closed")
	}
}
