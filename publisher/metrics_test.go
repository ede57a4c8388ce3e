package publisher

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

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
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
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

// counted is the sum of the counters c collects, whichever their labels: its series exist
// at zero from the start.
func counted(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	var sum float64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Error(err)
			continue
		}
		sum += d.GetCounter().GetValue()
	}
	return sum
}
