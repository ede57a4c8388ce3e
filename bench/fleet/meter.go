package fleet

import (
	"bytes"
	"maps"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/google/pprof/profile"
	"github.com/nats-io/nats.go"
)

// requests counts the JetStream API requests and key-value writes the fleet makes, as
// the cluster sees them (a subscriber on the account receives a copy of each), per
// second and per kind of request.
type requests struct {
	nc *nats.Conn

	mu     sync.Mutex
	start  time.Time
	perSec []int // requests in each second since start
	byOp   map[string]int
	byHost map[string]int // by the host named in the subject (owner filter, key, subject)
}

func countRequests(url string) (*requests, error) {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	r := &requests{nc: nc, start: time.Now(), byOp: map[string]int{}, byHost: map[string]int{}}
	for _, subj := range []string{"$JS.API.>", "$KV.>"} {
		sub, err := nc.Subscribe(subj, r.count)
		if err != nil {
			nc.Close()
			return nil, err
		}
		_ = sub.SetPendingLimits(-1, -1) // a storm must not make the meter drop requests
	}
	return r, nc.Flush()
}

func (r *requests) count(m *nats.Msg) {
	// "$JS.API.DIRECT.GET.PISYNC_ENTRIES.…" → "DIRECT.GET"; "$KV.PISYNC_HEADS.…" → "KV.PISYNC_HEADS"
	op := strings.TrimPrefix(strings.TrimPrefix(m.Subject, "$JS.API."), "$")
	if parts := strings.SplitN(op, ".", 3); len(parts) >= 2 {
		op = parts[0] + "." + parts[1]
	}
	r.mu.Lock()
	sec := int(time.Since(r.start) / time.Second)
	for len(r.perSec) <= sec {
		r.perSec = append(r.perSec, 0)
	}
	r.perSec[sec]++
	r.byOp[op]++
	r.byHost[hostInSubject.FindString(m.Subject)]++
	r.mu.Unlock()
}

// window is what was counted between two marks.
type window struct {
	total  int
	peak   int // most requests in one second
	byOp   map[string]int
	byHost map[string]int
}

// mark is a point in the count; since(mark) is what was counted after it.
type mark struct {
	sec          int
	byOp, byHost map[string]int
}

func (r *requests) mark() mark {
	_ = r.nc.Flush()
	r.mu.Lock()
	defer r.mu.Unlock()
	return mark{sec: int(time.Since(r.start) / time.Second), byOp: maps.Clone(r.byOp), byHost: maps.Clone(r.byHost)}
}

func (r *requests) since(m mark) window {
	_ = r.nc.Flush()
	r.mu.Lock()
	defer r.mu.Unlock()
	sec, ops := m.sec, m.byOp
	w := window{byOp: map[string]int{}, byHost: map[string]int{}}
	for k, v := range r.byHost {
		if d := v - m.byHost[k]; d > 0 {
			w.byHost[k] = d
		}
	}
	for i := sec; i < len(r.perSec); i++ {
		w.peak = max(w.peak, r.perSec[i])
	}
	// Totals from the counts by kind: the mark's second is shared with what came before.
	for k, v := range r.byOp {
		if d := v - ops[k]; d > 0 {
			w.byOp[k] = d
			w.total += d
		}
	}
	return w
}

func (r *requests) close() { r.nc.Close() }

// The cluster's goroutines carry this profiler label (set around starting the servers
// and inherited by every goroutine they start), so that the CPU the servers spend is
// told apart from the simulated daemons' in the same process.
const partLabel, clusterPart = "part", "cluster"

// cpuSplit profiles the process until stop is called and returns the CPU seconds
// spent by the cluster and by everything else.
type cpuSplit struct{ buf bytes.Buffer }

func startCPU() (*cpuSplit, error) {
	c := &cpuSplit{}
	return c, pprof.StartCPUProfile(&c.buf)
}

func (c *cpuSplit) stop() (cluster, rest float64, err error) {
	pprof.StopCPUProfile()
	p, err := profile.Parse(&c.buf)
	if err != nil {
		return 0, 0, err
	}
	idx := len(p.SampleType) - 1 // cpu/nanoseconds
	for _, s := range p.Sample {
		v := float64(s.Value[idx]) / 1e9
		if len(s.Label[partLabel]) > 0 && s.Label[partLabel][0] == clusterPart {
			cluster += v
		} else {
			rest += v
		}
	}
	return cluster, rest, nil
}

// serverHeap returns the live heap allocated by nats-server code (the cluster's
// streams, buckets, routes and client connections), from a heap profile after a
// collection, and the whole live heap.
func serverHeap() (server, all int64, err error) {
	runtime.GC()
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 0); err != nil {
		return 0, 0, err
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		return 0, 0, err
	}
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == "inuse_space" {
			idx = i
		}
	}
	for _, s := range p.Sample {
		v := s.Value[idx]
		all += v
		if fromServer(s) {
			server += v
		}
	}
	return server, all, nil
}

func fromServer(s *profile.Sample) bool {
	for _, loc := range s.Location {
		for _, l := range loc.Line {
			if l.Function != nil && strings.HasPrefix(l.Function.Name, "github.com/nats-io/nats-server/v2/") {
				return true
			}
		}
	}
	return false
}
