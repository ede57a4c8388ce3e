package publisher

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pisync/pisync/internal/testutil/natstest"
)

// TestMetricsGatheredWhileBinding (torture T6): the daemon registers the publisher's
// metrics and serves them before publisher.New binds them to the publisher; a scrape
// in that window raced with the binding. Run under -race.
func TestMetricsGatheredWhileBinding(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	opts := testOptions(t, ctx, srv.URL())
	opts.Checkpoints = openStore(t, t.TempDir())
	m := NewMetrics()
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	opts.Metrics = m
	_, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
}
