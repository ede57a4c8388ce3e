package main

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// TestDaemonThrottledByFullStream: the stream is at its max_bytes with discard new. The
// daemon slows down instead of quarantining: /status.json, the status page and /metrics
// say the cluster holds it back and why, while lines appended meanwhile wait in the
// files. Once the limit is raised it recovers by itself, without a restart, and every
// line is in the stream exactly once.
func TestDaemonThrottledByFullStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	nc := natstest.Connect(t, srv.URL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := mirror.DefaultNames()
	if err := mirror.Provision(ctx, js, names, mirror.Config{}); err != nil {
		t.Fatal(err)
	}
	setStreamMaxBytes := func(n int64) {
		t.Helper()
		s, err := js.Stream(ctx, names.Stream())
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.MaxBytes, cfg.Discard = n, jetstream.DiscardNew
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	setStreamMaxBytes(64 << 10)

	rng := rand.New(rand.NewPCG(61, 62))
	root := t.TempDir()
	files := writeSessions(t, rng, root, 6, 20) // about 500 KiB: most of it does not fit
	d, base := startHTTPTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	defer d.stop()

	var doc statusDoc
	waitFor(t, 30*time.Second, "status.json to show the back-pressure", func() (bool, string) {
		doc = getStatus(t, base)
		b := doc.Backpressure
		return b.Active && b.Reason == "max_bytes" && b.Since != nil && b.PauseSeconds > 0,
			"backpressure " + strings.TrimSpace(b.Reason) + " " + b.Error
	})
	if !strings.Contains(doc.Backpressure.Error, "maximum bytes exceeded") {
		t.Errorf("status.json gives the server's refusal as %q", doc.Backpressure.Error)
	}
	// Lines appended while the cluster is full wait in their files.
	for _, f := range files[:3] {
		if err := f.Append(f.Entry(500), f.Entry(700)); err != nil {
			t.Fatal(err)
		}
	}
	if n := metricValue(t, d, "pisync_publish_throttled_total", map[string]string{"reason": "max_bytes"}); n == 0 {
		t.Error("no publish counted in pisync_publish_throttled_total{reason=max_bytes}")
	}
	// Polled: a probe that finds a last gap in the stream opens the gate for a moment.
	waitFor(t, 10*time.Second, "the page and /metrics to show the back-pressure", func() (bool, string) {
		code, page, _ := httpGet(t, base+"/")
		if code != 200 {
			t.Fatalf("/: %d", code)
		}
		text := pageText(page)
		for _, want := range []string{"The cluster holds publishing back (max_bytes)", "nothing is quarantined", "maximum bytes exceeded"} {
			if !strings.Contains(text, want) {
				return false, "status page lacks " + want + ":\n" + text
			}
		}
		_, metrics, _ := httpGet(t, base+"/metrics")
		if !strings.Contains(metrics, `pisync_cluster_backpressure{reason="max_bytes"} 1`) {
			return false, `/metrics lacks pisync_cluster_backpressure{reason="max_bytes"} 1`
		}
		return true, ""
	})
	requireNoneQuarantined(t, d)

	setStreamMaxBytes(-1)
	allMirrored(t, newReader(t, nc, "t1", "alice"), root, 60*time.Second)
	waitFor(t, 10*time.Second, "the back-pressure to end", func() (bool, string) {
		doc = getStatus(t, base)
		return !doc.Backpressure.Active && doc.Backpressure.Episodes > 0, doc.Backpressure.Reason
	})
	if g := metricValue(t, d, "pisync_cluster_backpressure", nil); g != 0 {
		t.Errorf("pisync_cluster_backpressure sums to %v after recovery, want 0", g)
	}
	if _, page, _ := httpGet(t, base+"/"); strings.Contains(pageText(page), "The cluster holds publishing back") {
		t.Error("the status page still shows the back-pressure after recovery")
	}
	requireNoneQuarantined(t, d)
	requireExactlyOnce(t, nc, files, 0)
}

// TestSlowAcksNoLossNoDuplicates: the server stores what the daemon publishes but its
// answers are held back longer than the ack timeout, the connection staying up. The
// daemon reports slow acknowledgements as back-pressure and slows down; when the answers
// flow again it resends what it could not confirm with the same message ids, and the
// stream holds every line exactly once, those appended meanwhile included.
func TestSlowAcksNoLossNoDuplicates(t *testing.T) {
	srv := natstest.Run(t)
	proxy := natstest.NewProxy(t, srv.Addr())
	rng := rand.New(rand.NewPCG(63, 64))
	root := t.TempDir()
	files := writeSessions(t, rng, root, 4, 5)
	d := startTestDaemon(t, "--nats", proxy.URL(), "--root", root, "--state-dir", t.TempDir(), "--ack-timeout", "300ms")
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 30*time.Second)

	proxy.Hold()
	held := true
	defer func() {
		if held {
			proxy.Release()
		}
	}()
	for _, f := range files {
		if err := f.Append(f.Entry(400), f.Entry(900), f.Entry(300)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "slow acknowledgements reported as back-pressure", func() (bool, string) {
		b := d.pub.Backpressure()
		return b.Active && b.Reason == "slow_acks", b.Reason
	})
	if !d.nc.IsConnected() {
		t.Fatal("the connection dropped: this is an outage, not slow acknowledgements")
	}
	if n := metricValue(t, d, "pisync_publish_throttled_total", map[string]string{"reason": "slow_acks"}); n == 0 {
		t.Error("no publish counted in pisync_publish_throttled_total{reason=slow_acks}")
	}
	// Appended while the acknowledgements are late: they wait at the gate.
	for _, f := range files[:2] {
		if err := f.Append(f.Entry(600)); err != nil {
			t.Fatal(err)
		}
	}
	proxy.Release()
	held = false
	allMirrored(t, r, root, 30*time.Second)
	waitFor(t, 10*time.Second, "the back-pressure to end", func() (bool, string) {
		b := d.pub.Backpressure()
		return !b.Active, b.Reason
	})
	requireNoneQuarantined(t, d)
	requireExactlyOnce(t, nc, files, 0)
}

func requireNoneQuarantined(t *testing.T, d *daemon) {
	t.Helper()
	if n := metricValue(t, d, "pisync_lines_quarantined_total", nil); n != 0 {
		t.Fatalf("%v lines quarantined for a condition of the cluster", n)
	}
	if q := d.pub.Quarantined(); len(q) != 0 {
		t.Fatalf("quarantined %+v", q)
	}
}
