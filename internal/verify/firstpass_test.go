package verify

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats.go v1.55.0 leaks this goroutine now and then, on its own (see cmd/pisync's
		// TestMain); a connection left open is still caught.
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

// timedScans records when background verification reads each conversation.
type timedScans struct {
	BackgroundMirror
	mu    sync.Mutex
	times []time.Time
}

func (s *timedScans) Scan(ctx context.Context, c mirror.Conv, opts mirror.ScanOptions, fn func(mirror.Msg) error) error {
	s.mu.Lock()
	s.times = append(s.times, time.Now())
	s.mu.Unlock()
	return s.BackgroundMirror.Scan(ctx, c, opts, fn)
}

// apiRequests records when the server receives each JetStream API request.
type apiRequests struct {
	mu    sync.Mutex
	times []time.Time
}

// within counts the times in [from, from+d).
func within(times []time.Time, from time.Time, d time.Duration) int {
	n := 0
	for _, at := range times {
		if !at.Before(from) && at.Before(from.Add(d)) {
			n++
		}
	}
	return n
}

// TestBackgroundFirstPassIsSpread (issue 15): without saved verdicts (the first start of
// a host or of the version that keeps them, a lost state directory) the first pass read
// every file at --verify-rate, at once: a fleet upgraded together read every file of
// every host within the same minute. Files without a verdict are read at most FirstRate a
// second, the passes that follow taking up where the last stopped, and every file is still
// verified within files/FirstRate; the files waiting show as unverified meanwhile.
//
// PISYNC_FIRSTPASS_FILES=1000 measures docs/capacity.md §3 (about 18 minutes).
func TestBackgroundFirstPassIsSpread(t *testing.T) {
	files, firstRate, rate, interval := 40, 20.0, 1000.0, 250*time.Millisecond
	if n, _ := strconv.Atoi(os.Getenv("PISYNC_FIRSTPASS_FILES")); n > 0 {
		// The daemon's defaults but a shorter interval: one pass a minute, the first one
		// after a minute instead of ten.
		files, firstRate, rate, interval = n, 1, 20, time.Minute
	}
	srv := natstest.Run(t)
	var api apiRequests
	nc := natstest.Connect(t, srv.URL())
	if _, err := nc.Subscribe("$JS.API.>", func(*nats.Msg) {
		api.mu.Lock()
		api.times = append(api.times, time.Now())
		api.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	tm, dir, golden, _ := mirroredGoldenOn(t, mirrortest.For(t, srv.URL(), "t1", "alice"))
	var targets []Target // copies of one mirrored file: each is identical to the conversation
	for i := range files {
		path := filepath.Join(dir, fmt.Sprintf("copy-%04d.jsonl", i))
		mirrortest.WriteFile(t, path, mirrortest.JoinLines(golden[0].lines))
		targets = append(targets, Target{Root: dir, Path: path, Key: golden[0].m.Conv})
	}
	if err := nc.Flush(); err != nil { // the set-up's requests are in
		t.Fatal(err)
	}
	api.mu.Lock()
	api.times = nil
	api.mu.Unlock()

	sc := &timedScans{BackgroundMirror: tm.Reader}
	metrics := NewVerifyMetrics(prometheus.NewRegistry())
	metrics.Init([]string{dir})
	b := &Background{Mirror: sc, List: func() []Target { return targets }, Interval: interval,
		Rate: rate, FirstRate: firstRate, Metrics: metrics, StateFile: filepath.Join(t.TempDir(), "verified.json")}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Run(ctx)
	}()
	defer func() { cancel(); <-done }()

	gauge := func(result string) int {
		return int(testutil.ToFloat64(metrics.sessions.WithLabelValues(dir, result)))
	}
	started := time.Now()
	period := time.Duration(float64(files) / firstRate * float64(time.Second))
	deadline := started.Add(interval + period + 30*time.Second) // slack for a loaded machine
	mostWaiting := 0
	for gauge("identical") < files {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d files verified after %v, want all within about %v",
				gauge("identical"), files, time.Since(started).Round(time.Millisecond), interval+period)
		}
		mostWaiting = max(mostWaiting, gauge("unverified"))
		time.Sleep(5 * time.Millisecond) // polling a gauge: nothing to wait on
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	sc.mu.Lock()
	scans := append([]time.Time(nil), sc.times...)
	sc.mu.Unlock()
	api.mu.Lock()
	reqs := append([]time.Time(nil), api.times...)
	api.mu.Unlock()
	if len(reqs) == 0 || len(scans) < files {
		t.Fatalf("%d requests, %d reads; want at least one request and %d reads", len(reqs), len(scans), files)
	}
	first := reqs[0] // the first pass's count of the mirror's messages
	coverage := scans[len(scans)-1].Sub(first)
	const window = 500 * time.Millisecond
	early := within(scans, first, window)
	t.Logf("%d files: %d JetStream API requests and %d reads within %v of the first pass, %d within its first minute; every file verified %v after it began (%v after the start), %d requests in all",
		files, within(reqs, first, window), early, window, within(reqs, first, time.Minute),
		coverage.Round(time.Millisecond), time.Since(started).Round(time.Millisecond), len(reqs))
	// FirstRate·window reads, one more for a tick's rounding: never the whole host.
	if most := int(firstRate*window.Seconds()) + 1; early > most {
		t.Errorf("%d of %d files read within %v of the first pass, want at most %d (%v a second)", early, files, window, most, firstRate)
	}
	if coverage < period*3/4 {
		t.Errorf("every file verified %v after the first pass began, want the reads spread over about %v", coverage, period)
	}
	if mostWaiting == 0 {
		t.Errorf("no file ever shown as unverified: coverage progress is invisible")
	}
	if got := gauge("unverified"); got != 0 {
		t.Errorf("%d files still shown as unverified once all are verified", got)
	}
}

// TestBackgroundFirstReadBudget: a pass reads FirstRate·Interval files without a verdict
// at most and shows the rest as unverified; a file found drifted is read on every pass
// outside that budget, and files that cannot be read go behind those never tried instead
// of spending every pass's budget.
func TestBackgroundFirstReadBudget(t *testing.T) {
	type want struct{ identical, drifted, failed, unverified int }
	cases := []struct {
		name    string
		good    int  // files identical to their conversation
		broken  int  // files listed first that cannot be read (gone)
		drifted bool // a file listed first lacks the conversation's last line
		passes  []want
	}{
		{name: "five files, two a pass", good: 5, passes: []want{{2, 0, 0, 3}, {4, 0, 0, 1}, {5, 0, 0, 0}, {5, 0, 0, 0}}},
		{name: "unreadable files do not hold the others back", good: 3, broken: 2,
			passes: []want{{0, 0, 2, 3}, {2, 0, 0, 3}, {3, 0, 1, 1}, {3, 0, 2, 0}}},
		{name: "a drifted file is read on every pass", good: 3, drifted: true,
			passes: []want{{1, 1, 0, 2}, {3, 1, 0, 0}, {3, 1, 0, 0}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tm, dir, golden, _ := mirroredGolden(t)
			ctx := mirrortest.Ctx(t)
			var targets []Target
			add := func(name string, lines [][]byte) {
				path := filepath.Join(dir, name)
				if lines != nil {
					mirrortest.WriteFile(t, path, mirrortest.JoinLines(lines))
				}
				targets = append(targets, Target{Root: dir, Path: path, Key: golden[0].m.Conv})
			}
			for i := range tc.broken {
				add(fmt.Sprintf("gone-%d.jsonl", i), nil)
			}
			if tc.drifted {
				add("drifted.jsonl", golden[0].lines[:len(golden[0].lines)-1])
			}
			for i := range tc.good {
				add(fmt.Sprintf("good-%d.jsonl", i), golden[0].lines)
			}
			metrics := NewVerifyMetrics(nil)
			metrics.Init([]string{dir})
			// Two first reads a pass, 10 ms apart; everything else at once.
			b := &Background{Mirror: tm.Reader, List: func() []Target { return targets }, Interval: 20 * time.Millisecond,
				Rate: 1000, FirstRate: 100, Metrics: metrics}
			for i, w := range tc.passes {
				b.pass(ctx)
				got := want{}
				for result, n := range map[string]*int{"identical": &got.identical, "drifted": &got.drifted, "failed": &got.failed, "unverified": &got.unverified} {
					*n = int(testutil.ToFloat64(metrics.sessions.WithLabelValues(dir, result)))
				}
				if got != w {
					t.Errorf("pass %d: %+v, want %+v", i+1, got, w)
				}
			}
		})
	}
}
