package publisher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// TestRetryBackoffGrows: the pause between retries grows (exponentially, by steps that
// double) until the cap, never exceeds it, is jittered, and starts small again after a
// reset. Until the cap every pause is at least the one before it: equal jitter keeps
// half of each step; at the cap pauses stay between half the cap and the cap.
func TestRetryBackoffGrows(t *testing.T) {
	const capPause = 5 * time.Second
	b := newRetryBackoff(capPause)
	var pauses []time.Duration
	for range 12 {
		pauses = append(pauses, b.next())
	}
	if pauses[0] > firstRetryPause || pauses[0] < firstRetryPause/2 {
		t.Errorf("first pause %v, want between %v and %v", pauses[0], firstRetryPause/2, firstRetryPause)
	}
	step := firstRetryPause
	for i := 1; i < len(pauses); i++ {
		step *= 2
		if step <= capPause && pauses[i] < pauses[i-1] {
			t.Errorf("pause %d (%v) shorter than pause %d (%v): %v", i, pauses[i], i-1, pauses[i-1], pauses)
		}
		if pauses[i] > capPause || step > capPause && pauses[i] < capPause/2 {
			t.Errorf("pause %d (%v) outside the cap's range [%v, %v]", i, pauses[i], capPause/2, capPause)
		}
	}
	// The fifth step is 16 × the first: its pause is at least 8 × the first step.
	if pauses[4] < 8*firstRetryPause {
		t.Errorf("pauses do not grow exponentially: %v", pauses)
	}
	if last := pauses[len(pauses)-1]; last < capPause/2 {
		t.Errorf("pause after 12 retries %v, want at least half the cap %v", last, capPause)
	}
	jittered := false
	for range 20 {
		other := newRetryBackoff(capPause)
		for range 4 {
			other.next()
		}
		if other.next() != pauses[4] {
			jittered = true
			break
		}
	}
	if !jittered {
		t.Error("the same pause drawn 20 times: no jitter")
	}
	b.reset()
	if p := b.next(); p > firstRetryPause {
		t.Errorf("pause after a reset %v, want at most %v", p, firstRetryPause)
	}
}

// TestClusterPressureNeverQuarantines: the cluster's refusals for lack of room are named
// by their reason and are never permanent failures (which quarantine a line); a message
// refused by the store for its own size is one, and no back-pressure.
func TestClusterPressureNeverQuarantines(t *testing.T) {
	apiErr := func(code int, desc string) error {
		return fmt.Errorf("publish: %w", &jetstream.APIError{Code: 503, ErrorCode: jetstream.ErrorCode(code), Description: desc})
	}
	for _, tc := range []struct {
		err       error
		connected bool
		pressure  string
		permanent string
	}{
		{apiErr(jsStoreFailed, "maximum bytes exceeded"), true, pressureMaxBytes, ""},
		{apiErr(jsStoreFailed, "maximum messages exceeded"), true, pressureMaxMsgs, ""},
		{apiErr(jsStoreFailed, "maximum messages per subject exceeded"), true, pressureMaxMsgsSubject, ""},
		{apiErr(jsAccountResources, "resource limits exceeded for account"), true, pressureAccount, ""},
		{apiErr(jsInsufficientResources, "insufficient resources"), true, pressureResources, ""},
		{apiErr(jsStorageResources, "insufficient storage resources available"), true, pressureResources, ""},
		{jetstream.ErrAsyncPublishTimeout, true, pressureSlowAcks, ""},
		{jetstream.ErrAsyncPublishTimeout, false, "", ""}, // an outage, not back-pressure
		{nats.ErrNoResponders, true, "", ""},
		{apiErr(jsStoreFailed, "message too large"), true, "", "too_large"},
		{apiErr(jsMessageTooLarge, "message size exceeds maximum allowed"), true, "", "too_large"},
	} {
		if got := clusterPressure(tc.err, tc.connected); got != tc.pressure {
			t.Errorf("clusterPressure(%v, connected %v) = %q, want %q", tc.err, tc.connected, got, tc.pressure)
		}
		if holdsHost(tc.pressure) != (tc.pressure != "" && tc.pressure != pressureSlowAcks && tc.pressure != pressureMaxMsgsSubject) {
			t.Errorf("%q: holds the host back %v", tc.pressure, holdsHost(tc.pressure))
		}
		if got := permanentFailure(tc.err); got != tc.permanent {
			t.Errorf("permanentFailure(%v) = %q, want %q", tc.err, got, tc.permanent)
		}
	}
}

// TestClusterFullThrottlesThenRecovers: the cluster stops taking lines — the stream at
// its max_bytes or max_msgs with discard new, the account at its storage limit, the
// server at its max_file_store. The publisher holds the host back (the gauge and the
// status say why), the pause between its probes grows, nothing is quarantined; once the
// limit is raised (or room is freed) it recovers by itself and every line of every file
// is in the stream exactly once.
func TestClusterFullThrottlesThenRecovers(t *testing.T) {
	type limit func(t *testing.T, ctx context.Context, js jetstream.JetStream, srv *natstest.Server)
	streamLimit := func(set func(*jetstream.StreamConfig)) limit {
		return func(t *testing.T, ctx context.Context, js jetstream.JetStream, srv *natstest.Server) {
			s, err := js.Stream(ctx, mirror.DefaultNames().Stream())
			if err != nil {
				t.Fatal(err)
			}
			cfg := s.CachedInfo().Config
			set(&cfg)
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
		}
	}
	accountLimit := func(room int64) limit {
		return func(t *testing.T, ctx context.Context, js jetstream.JetStream, srv *natstest.Server) {
			maxStore := int64(-1)
			if room >= 0 {
				info, err := js.AccountInfo(ctx)
				if err != nil {
					t.Fatal(err)
				}
				maxStore = int64(info.Store) + room
			}
			if err := srv.GlobalAccount().UpdateJetStreamLimits(map[string]server.JetStreamAccountLimits{
				"": {MaxMemory: -1, MaxStore: maxStore, MaxStreams: -1, MaxConsumers: -1}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const serverStore = 1 << 20
	for _, tc := range []struct {
		reason string
		server func(*server.Options)
		limit  limit
		lift   limit
	}{
		{reason: pressureMaxBytes,
			limit: streamLimit(func(c *jetstream.StreamConfig) { c.MaxBytes, c.Discard = 24<<10, jetstream.DiscardNew }),
			lift:  streamLimit(func(c *jetstream.StreamConfig) { c.MaxBytes = -1 })},
		{reason: pressureMaxMsgs,
			limit: streamLimit(func(c *jetstream.StreamConfig) { c.MaxMsgs, c.Discard = 30, jetstream.DiscardNew }),
			lift:  streamLimit(func(c *jetstream.StreamConfig) { c.MaxMsgs = -1 })},
		{reason: pressureAccount, limit: accountLimit(24 << 10), lift: accountLimit(-1)},
		{reason: pressureResources,
			// Another stream takes all but 24 KiB of the server's store; deleting it frees
			// the room.
			server: func(o *server.Options) { o.JetStreamMaxStore = serverStore },
			limit:  fillStore(serverStore - 24<<10),
			lift: func(t *testing.T, ctx context.Context, js jetstream.JetStream, srv *natstest.Server) {
				if err := js.DeleteStream(ctx, "FILLER"); err != nil {
					t.Fatal(err)
				}
			}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			srv := natstest.RunWith(t, tc.server)
			p := pressurePublisher(t, ctx, srv.URL())
			tc.limit(t, ctx, p.opts.JS, srv)
			root := t.TempDir()
			files := pressureFiles(t, root, 8, 25)
			stop, _ := startWatcher(t, ctx, p, root)
			defer stop()

			// Polled, gauge included: a probe that finds a last gap in the stream opens
			// the gate for a moment.
			waitUntil(t, "back-pressure "+tc.reason+" in the state and the gauge", func() bool {
				b := p.Backpressure()
				return b.Active && b.Reason == tc.reason &&
					testutil.ToFloat64(p.m.backpressure.WithLabelValues(tc.reason)) == 1
			})
			// The pause between probes grows while they are refused (within one episode:
			// a probe that finds a last gap opens the gate, and the next refusal starts
			// again from the first pause).
			var episode int64
			var last float64
			waitUntil(t, "the pause between probes to grow past 0.4 s", func() bool {
				b := p.Backpressure()
				if !b.Active {
					return false
				}
				if b.Episodes != episode {
					episode, last = b.Episodes, 0
				}
				if b.PauseSeconds < last {
					t.Fatalf("the pause shrank from %v s to %v s without a probe acknowledged", last, b.PauseSeconds)
				}
				last = b.PauseSeconds
				return b.PauseSeconds >= 0.4 && b.Probes >= 2 && testutil.ToFloat64(p.m.probePause) > 0
			})
			if n := testutil.ToFloat64(p.m.throttled.WithLabelValues(tc.reason)); n == 0 {
				t.Errorf("no publish counted throttled for %s", tc.reason)
			}
			if pr := p.Progress().Roots[root]; pr != nil && pr.Mirrored == len(files) {
				t.Fatal("every file mirrored while the cluster was full: the limit did not bite")
			}
			requireNothingQuarantined(t, p)
			if b := p.Backpressure(); b.Active {
				t.Logf("%s: %d publishes refused, %d probes in %v, pause %.2f s", tc.reason, b.Throttled, b.Probes,
					time.Since(*b.Since).Round(time.Millisecond), b.PauseSeconds)
			}

			tc.lift(t, ctx, p.opts.JS, srv)
			waitUntil(t, "every file mirrored after the limit was raised", func() bool {
				pr := p.Progress().Roots[root]
				return pr != nil && pr.Mirrored == len(files)
			})
			waitUntil(t, "the gate open again", func() bool { return !p.Backpressure().Active })
			if g := testutil.ToFloat64(p.m.backpressure.WithLabelValues(tc.reason)); g != 0 {
				t.Errorf("pisync_cluster_backpressure{reason=%q} = %v after recovery, want 0", tc.reason, g)
			}
			if g := testutil.ToFloat64(p.m.probePause); g != 0 {
				t.Errorf("pisync_backpressure_pause_seconds = %v after recovery, want 0", g)
			}
			requireNothingQuarantined(t, p)
			waitHeads(t, ctx, p, root, files)
			checkBothMirrored(t, ctx, p.reader, root, files, tc.reason)
			requireStreamHolds(t, ctx, p, files)
		})
	}
}

// fillStore makes another stream hold n bytes of the server's store.
func fillStore(n int64) func(t *testing.T, ctx context.Context, js jetstream.JetStream, srv *natstest.Server) {
	return func(t *testing.T, ctx context.Context, js jetstream.JetStream, srv *natstest.Server) {
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILLER", Subjects: []string{"filler"}})
		if err != nil {
			t.Fatal(err)
		}
		chunk := bytes.Repeat([]byte("f"), 32<<10)
		for {
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			left := n - int64(info.State.Bytes)
			if left <= 0 {
				return
			}
			if _, err := js.Publish(ctx, "filler", chunk[:min(int64(len(chunk)), left)]); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// pressurePublisher is publisherAt with a retry cap of 4 s: above the steps the test
// watches grow (200 ms to 3.2 s; at the cap pauses are drawn between half the cap and
// the cap, and may be shorter than the one before), short enough for a quick recovery.
func pressurePublisher(t *testing.T, ctx context.Context, url string) *Publisher {
	t.Helper()
	opts := testOptions(t, ctx, url)
	store := openStore(t, t.TempDir())
	t.Cleanup(func() { _ = store.Close() })
	opts.Checkpoints = store
	opts.CommitInterval, opts.HeadInterval = 20*time.Millisecond, 20*time.Millisecond
	opts.RetryMax = 4 * time.Second
	p, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		p.Close(cctx)
	})
	return p
}

// pressureFiles writes n sessions of a header and entries-1 entries under root.
func pressureFiles(t *testing.T, root string, n, lines int) []*sessiontest.File {
	t.Helper()
	rng := rand.New(rand.NewPCG(31, 32))
	var files []*sessiontest.File
	for i := range n {
		f := sessiontest.New(rng, root, "/home/dev/p", sessiontest.Format(i%4))
		ls := [][]byte{f.HeaderLine("/home/dev/p")}
		for range lines - 1 {
			ls = append(ls, f.Entry(300))
		}
		if err := f.Append(ls...); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

func requireNothingQuarantined(t *testing.T, p *Publisher) {
	t.Helper()
	if q := p.Quarantined(); len(q) != 0 {
		t.Fatalf("%d lines quarantined for a limit of the cluster, e.g. %+v", len(q), q[0])
	}
	for _, reason := range []string{"max_payload", "too_large", "headers_too_large", "invalid", "blob"} {
		if n := testutil.ToFloat64(p.m.quarantined.WithLabelValues(reason)); n != 0 {
			t.Errorf("pisync_lines_quarantined_total{reason=%q} = %v, want 0", reason, n)
		}
	}
}

// requireStreamHolds checks the stream as a whole: exactly one message per line of the
// files, and no message id twice.
func requireStreamHolds(t *testing.T, ctx context.Context, p *Publisher, files []*sessiontest.File) {
	t.Helper()
	want := 0
	for _, f := range files {
		want += len(f.Lines)
	}
	s, err := p.opts.JS.Stream(ctx, p.opts.Names.Stream())
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range info.State.Msgs {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		id := m.Headers().Get(nats.MsgIdHdr)
		if ids[id] {
			t.Errorf("message id %s twice in the stream", id)
		}
		ids[id] = true
	}
	if len(ids) != want || info.State.Msgs != uint64(want) {
		t.Errorf("the stream holds %d messages (%d ids), the files %d lines", info.State.Msgs, len(ids), want)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test deadline passed")
	}
}
