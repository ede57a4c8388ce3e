package store_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pisync/pisync/store"
)

// TestRequestCountedBeforeReply: a client that has its reply finds the request in the
// counters already, so a dashboard or a test reading /metrics right after a request
// never sees it missing.
func TestRequestCountedBeforeReply(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := store.NewMetrics(reg)
	count := func(op, code string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "pisync_store_requests_total" {
				continue
			}
			for _, c := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range c.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				if l["op"] == op && l["code"] == code {
					return c.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	e := newEnv(t, 1, store.Options{Metrics: m})
	const id = "0199a1c2-7d3e-7000-8000-00000000abcd"
	if r := e.req("alice", "create", map[string]any{"line": headerLine(id, "/srv/app")}); !r.OK {
		t.Fatalf("create: %+v", r)
	}
	for i := 1; i <= 500; i++ {
		r := e.req("alice", "open", map[string]any{"id": id})
		if !r.OK {
			t.Fatalf("open %d: %+v", i, r)
		}
		if got := count("open", store.CodeOK); got != float64(i) {
			t.Fatalf("after %d opens answered, pisync_store_requests_total{op=open,code=ok} = %v", i, got)
		}
		r = e.req("alice", "open", map[string]any{"id": "0199a1c2-7d3e-7000-8000-0000000000ff"})
		if r.code() != store.CodeNotFound {
			t.Fatalf("open of an unknown id: %+v", r)
		}
		if got := count("open", store.CodeNotFound); got != float64(i) {
			t.Fatalf("after %d opens not found, pisync_store_requests_total{op=open,code=not_found} = %v", i, got)
		}
	}
}
