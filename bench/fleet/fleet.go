package fleet

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// Fleet is the simulated hosts and their Pi.
type Fleet struct {
	Hosts []*Host
	pis   []*pi

	failedStarts atomic.Int64 // daemon starts that failed and were retried
}

// newFleet lays out mix.Hosts hosts under dir and writes their sessions.
func newFleet(dir, url string, replicas int, cfg Config, log *zap.Logger) (*Fleet, error) {
	mix := cfg.Mix
	f := &Fleet{}
	for i := range mix.Hosts {
		name := fmt.Sprintf("host-%04d", i)
		h := &Host{
			Name: name, Kind: mix.kindOf(i),
			Root:  filepath.Join(dir, name, "sessions"),
			State: filepath.Join(dir, name, "state"),
			url:   url, replicas: replicas, reconnect: cfg.Reconnect, ackWait: cfg.AckTimeout, log: log.With(zap.String("host", name)),
		}
		f.Hosts = append(f.Hosts, h)
		f.pis = append(f.pis, &pi{h: h, rng: rand.New(rand.NewPCG(uint64(i), 15))})
	}
	var g errgroup.Group
	g.SetLimit(8)
	for i, h := range f.Hosts {
		p := f.pis[i]
		g.Go(func() error {
			if err := os.MkdirAll(h.Root, 0o700); err != nil {
				return err
			}
			switch h.Kind {
			case Backfilling:
				return p.prepare(mix.BackfillFiles, mix.BackfillEntries)
			default:
				lo, hi := float64(mix.IdleFiles[0]), float64(mix.IdleFiles[1])
				n := int(lo * math.Pow(hi/lo, p.rng.Float64()))
				return p.prepare(n, 2)
			}
		})
	}
	return f, g.Wait()
}

// start starts the daemons of the hosts of the given kinds, at most parallel at once.
func (f *Fleet) start(ctx context.Context, parallel int, kinds ...Kind) error {
	var g errgroup.Group
	g.SetLimit(parallel)
	for _, h := range f.Hosts {
		if !hasKind(kinds, h.Kind) {
			continue
		}
		g.Go(func() error {
			// A start the cluster does not answer in time fails, as the daemon's does, and
			// is started again after 2 s, as systemd's Restart=on-failure does.
			var err error
			for range 10 {
				if err = h.start(ctx); err == nil {
					return nil
				}
				f.failedStarts.Add(1)
				h.log.Warn("start failed; restarting in 2 s", zap.Error(err))
				time.Sleep(2 * time.Second)
			}
			return err
		})
	}
	return g.Wait()
}

func (f *Fleet) stop() error {
	var g errgroup.Group
	g.SetLimit(32)
	for _, h := range f.Hosts {
		if h.pub != nil {
			g.Go(h.stop)
		}
	}
	return g.Wait()
}

// converse runs the live conversations of the appending hosts until ctx ends.
func (f *Fleet) converse(ctx context.Context, every time.Duration) (wait func() error) {
	var g errgroup.Group
	for i, h := range f.Hosts {
		if h.Kind == Appending {
			g.Go(func() error { return f.pis[i].converse(ctx, every) })
		}
	}
	return g.Wait
}

// written returns what each host's Pi has written so far, in bytes.
func (f *Fleet) written() []int64 {
	out := make([]int64, len(f.pis))
	for i, p := range f.pis {
		out[i] = p.written.Load()
	}
	return out
}

// lines is the number of lines written across the fleet.
func (f *Fleet) lines() int64 {
	var n int64
	for _, p := range f.pis {
		n += p.lines.Load()
	}
	return n
}

// caughtUp polls the started hosts until each is connected and has every byte of
// target acknowledged, and returns when each got there, measured from since (a host
// not there by the deadline gets -1).
func (f *Fleet) caughtUp(ctx context.Context, since time.Time, target []int64, deadline time.Duration) []time.Duration {
	at := make([]time.Duration, len(f.Hosts))
	left := map[int]bool{}
	for i, h := range f.Hosts {
		at[i] = -1
		if h.pub != nil {
			left[i] = true
		}
	}
	end := time.Now().Add(deadline)
	for len(left) > 0 && time.Now().Before(end) && ctx.Err() == nil {
		var mu sync.Mutex
		var g errgroup.Group
		g.SetLimit(4)
		var todo []int
		for i := range left {
			todo = append(todo, i)
		}
		for _, i := range todo {
			h := f.Hosts[i]
			g.Go(func() error {
				if !h.nc.IsConnected() || !h.ready() {
					return nil
				}
				if acked, _ := h.mirrored(); acked >= target[i] {
					mu.Lock()
					at[i] = time.Since(since)
					delete(left, i)
					mu.Unlock()
				}
				return nil
			})
		}
		_ = g.Wait()
		time.Sleep(200 * time.Millisecond) // polling progress, with a deadline
	}
	return at
}

// percentiles of the durations of the hosts of the given kinds (-1: not caught up).
func percentiles(hosts []*Host, at []time.Duration, kinds ...Kind) (p50, p99, worst time.Duration, missing int) {
	var ds []time.Duration
	for i, h := range hosts {
		if !hasKind(kinds, h.Kind) || h.pub == nil {
			continue
		}
		if at[i] < 0 {
			missing++
			continue
		}
		ds = append(ds, at[i])
	}
	if len(ds) == 0 {
		return 0, 0, 0, missing
	}
	sort.Slice(ds, func(a, b int) bool { return ds[a] < ds[b] })
	pick := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	return pick(0.5), pick(0.99), ds[len(ds)-1], missing
}

func hasKind(kinds []Kind, k Kind) bool {
	for _, x := range kinds {
		if x == k {
			return true
		}
	}
	return len(kinds) == 0
}

// rss returns the process's resident memory now and at its peak, in bytes.
func rss() (now, peak int64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			now = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return now, peak
}
