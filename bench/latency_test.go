package bench

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// BenchmarkLiveLatency is item 2: -live-files files receive appends at -live-rate lines
// a second in total, written the way Pi writes (one open-append-close per line, sizes
// log-uniform from 200 B to 8 KiB), and each line's latency is the time from just before
// its write to its acknowledgement by JetStream arriving in the publisher. Targets on
// loopback: p50 ≤ 2 ms, p99 ≤ 10 ms. The floor is raw synchronous publishing of lines of
// the same sizes at the same rate, on the same server, in the same run.
func BenchmarkLiveLatency(b *testing.B) {
	for range b.N {
		r := runLive(b, liveConfig{files: *flagLiveFiles, rate: *flagLiveRate, duration: *flagLiveDur, warmup: 2 * time.Second})
		reportLive(b, r)
	}
}

type liveConfig struct {
	files    int
	rate     int // lines per second over all files
	duration time.Duration
	warmup   time.Duration
}

type liveResult struct {
	lat, raw   []time.Duration // sorted
	lateWrites int             // writes more than 1 ms behind schedule (a loaded machine)
	others     float64         // % of the machine used by other processes
}

// ackRecorder timestamps each acknowledgement as it reaches the client, keyed by
// subject and ordinal, before the publisher sees it (publisher.Options.Acked).
type ackRecorder struct {
	mu   sync.Mutex
	acks map[string]time.Time
}

func (a *ackRecorder) acked(m *nats.Msg) {
	now := time.Now()
	key := m.Subject + "#" + m.Header.Get(mirror.HdrOrdinal)
	a.mu.Lock()
	a.acks[key] = now
	a.mu.Unlock()
}

func (a *ackRecorder) get(key string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.acks[key]
	return t, ok
}

func runLive(tb testing.TB, cfg liveConfig) liveResult {
	tb.Helper()
	t := newTarget(tb, 1)
	defer t.close()
	nc := t.connect(tb)
	defer nc.Close()
	names, o := mirror.DefaultNames(), owner(tb)

	// The files exist (header and a few entries) and are mirrored before the clock starts.
	root := filepath.Join(tb.TempDir(), "sessions")
	rng := rand.New(rand.NewPCG(3, 3))
	files := make([]*sessiontest.File, cfg.files)
	subjects := make([]string, cfg.files)
	var initial int64
	for i := range files {
		cwd := "/home/dev/live-" + strconv.Itoa(i%10)
		f := sessiontest.New(rng, root, cwd, sessiontest.Format(i%3))
		if err := f.Append(f.HeaderLine(cwd), f.Entry(300), f.Entry(1000)); err != nil {
			tb.Fatal(err)
		}
		files[i] = f
		initial += int64(len(f.Content()))
		c, err := mirror.NewConv(o, f.ID)
		if err != nil {
			tb.Fatal(err)
		}
		subjects[i] = names.Subject(c)
	}
	rec := &ackRecorder{acks: map[string]time.Time{}}
	settle()
	p := startPisync(tb, nc, root, *flagWindow, rec.acked)
	p.waitMirrored(tb, initial, time.Minute)

	// Lines are generated before the clock starts, so that the writer only writes.
	total := int((cfg.warmup + cfg.duration).Seconds() * float64(cfg.rate))
	type write struct {
		file int
		line []byte
		key  string
		at   time.Time
		ord  int
	}
	writes := make([]write, total)
	ords := make([]int, cfg.files)
	var written int64 = initial
	for i := range writes {
		fi := i % cfg.files
		f := files[fi]
		size, _ := lineSizeSmall(rng)
		line := append(f.Entry(size), '\n')
		ords[fi]++
		ord := 2 + ords[fi] // header and two entries come first
		writes[i] = write{file: fi, line: line, key: subjects[fi] + "#" + strconv.Itoa(ord)}
		written += int64(len(line))
	}
	interval := time.Second / time.Duration(cfg.rate)
	var res liveResult
	load := startLoad()
	stopProfile := profile(tb, "live")
	defer stopProfile()
	start := time.Now()
	for i := range writes {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		} else if d < -time.Millisecond {
			res.lateWrites++
		}
		w := &writes[i]
		w.at = time.Now()
		if err := sessiontest.AppendBytes(files[w.file].Path, w.line); err != nil {
			tb.Fatal(err)
		}
	}
	p.waitMirrored(tb, written, time.Minute)
	stopProfile()
	res.others = load.othersPercent(0)
	warm := int(cfg.warmup.Seconds() * float64(cfg.rate))
	for _, w := range writes[warm:] {
		at, ok := rec.get(w.key)
		if !ok {
			tb.Fatalf("no acknowledgement recorded for %s", w.key)
		}
		res.lat = append(res.lat, at.Sub(w.at))
	}
	p.stop(tb)
	slices.Sort(res.lat)

	// The floor: the same server, synchronous raw publishes at the same rate.
	js := jsOf(tb, nc)
	conv, _ := mirror.NewConv(o, "raw-latency")
	n := min(len(res.lat), 5*cfg.rate)
	ctx := context.Background()
	start = time.Now()
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		line := writes[i%len(writes)].line
		msg := names.NewMsg(conv, mirror.Line{Kind: mirror.KindEntry, EntryID: mirror.OrdinalID(int64(i)),
			Ordinal: int64(i), Generation: 1, SHA256: "-", Format: "v3", Host: benchHost, Source: "raw"}, line[:len(line)-1])
		t0 := time.Now()
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			tb.Fatal(err)
		}
		res.raw = append(res.raw, time.Since(t0))
	}
	slices.Sort(res.raw)
	return res
}

// lineSizeSmall is lineSize without the large lines: the latency of one ordinary line.
func lineSizeSmall(rng *rand.Rand) (int, bool) {
	return int(200 * math.Exp(rng.Float64()*math.Log(8192.0/200))), false
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func reportLive(b *testing.B, r liveResult) {
	b.ReportMetric(ms(quantile(r.lat, 0.5)), "p50-ms")
	b.ReportMetric(ms(quantile(r.lat, 0.99)), "p99-ms")
	b.ReportMetric(ms(quantile(r.lat, 0.999)), "p999-ms")
	b.ReportMetric(ms(r.lat[len(r.lat)-1]), "max-ms")
	b.ReportMetric(ms(quantile(r.raw, 0.5)), "raw-p50-ms")
	b.ReportMetric(ms(quantile(r.raw, 0.99)), "raw-p99-ms")
	b.ReportMetric(float64(len(r.lat)), "samples")
	b.ReportMetric(float64(r.lateWrites), "late-writes")
	b.ReportMetric(r.others, "others-cpu-%")
}
