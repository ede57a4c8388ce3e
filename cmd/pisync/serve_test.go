package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// servedStore is a `pisync serve` run by the test, with its HTTP address.
type servedStore struct {
	http string
	nc   *nats.Conn
	stop func() error
}

// startServe runs ServeCommand on the server at url until the test ends and waits until
// /readyz answers.
func startServe(t *testing.T, url string, args ...string) *servedStore {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	args = append([]string{"--nats", url, "--http-addr", addr, "--log-level", "warn"}, args...)
	go func() { done <- ServeCommand(ctx, args, io.Discard, io.Discard) }()
	var once bool
	var result error
	stop := func() error {
		if !once {
			once = true
			cancel()
			result = <-done
		}
		return result
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	s := &servedStore{http: "http://" + addr, nc: natstest.Connect(t, url), stop: stop}
	waitFor(t, 30*time.Second, "serve to be ready", func() (bool, string) {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("serve ended before it was ready: %v", err)
		default:
		}
		code, body := s.get(t, "/readyz")
		return code == http.StatusOK, fmt.Sprintf("%d %s", code, body)
	})
	return s
}

func (s *servedStore) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(s.http + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// request sends one store request for tenant t1, owner alice, and decodes the reply.
func (s *servedStore) request(t *testing.T, op string, body any) map[string]any {
	t.Helper()
	o, err := mirror.NewOwner("t1", "alice")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.nc.Request(mirror.DefaultNames().StoreSubject(o, op), b, 10*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	var out map[string]any
	if err := json.Unmarshal(msg.Data, &out); err != nil {
		t.Fatalf("%s: reply %q: %v", op, msg.Data, err)
	}
	return out
}

// metricFamilies scrapes /metrics.
func (s *servedStore) metricFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := s.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// serveWorkload makes every store metric appear: a create, an append, a conflicting
// append and an open.
func serveWorkload(t *testing.T, s *servedStore) {
	t.Helper()
	const id = "0199a1c2-7d3e-7000-8000-00000000abcd"
	header := `{"type":"session","version":3,"id":"` + id + `","timestamp":"2026-12-01T18:00:00.000Z","cwd":"/srv/app"}`
	if r := s.request(t, "create", map[string]any{"line": header}); r["ok"] != true {
		t.Fatalf("create: %v", r)
	}
	entry := func(eid, text string) string {
		return `{"type":"message","id":"` + eid + `","parentId":null,"timestamp":"2026-12-01T18:00:01.000Z","message":{"role":"user","content":"` + text + `"}}`
	}
	if r := s.request(t, "append", map[string]any{"id": id, "expectedHead": nil, "line": entry("a1b2c3d4", "hi")}); r["ok"] != true {
		t.Fatalf("append: %v", r)
	}
	r := s.request(t, "append", map[string]any{"id": id, "expectedHead": nil, "line": entry("b1b2c3d4", "again")})
	if r["ok"] != false {
		t.Fatalf("append on a stale head: %v, want a conflict", r)
	}
	if e, _ := r["error"].(map[string]any); e["code"] != "conflict" || e["head"] != "a1b2c3d4" {
		t.Fatalf("append on a stale head: %v, want conflict with head a1b2c3d4", r)
	}
	if r := s.request(t, "open", map[string]any{"id": id}); r["ok"] != true || r["head"] != "a1b2c3d4" {
		t.Fatalf("open: %v", r)
	}
}

// TestServeCommand runs `pisync serve` as a user would: health before and after NATS,
// requests answered over NATS, and the request counters on /metrics by op and code.
func TestServeCommand(t *testing.T) {
	srv := natstest.Run(t)
	s := startServe(t, srv.URL())
	if code, body := s.get(t, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	serveWorkload(t, s)
	mfs := s.metricFamilies(t)
	count := func(op, code string) float64 {
		for _, m := range mfs["pisync_store_requests_total"].GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["op"] == op && l["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
		return 0
	}
	for _, c := range []struct {
		op, code string
		want     float64
	}{{"create", "ok", 1}, {"append", "ok", 1}, {"append", "conflict", 1}, {"open", "ok", 1}} {
		if got := count(c.op, c.code); got != c.want {
			t.Errorf("pisync_store_requests_total{op=%q,code=%q} = %v, want %v", c.op, c.code, got, c.want)
		}
	}
	if n := mfs["pisync_store_append_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n != 1 {
		t.Errorf("pisync_store_append_seconds counts %d appends, want 1", n)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve did not stop cleanly: %v", err)
	}
}
