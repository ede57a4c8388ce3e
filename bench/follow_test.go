package bench

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

var flagFollowBacklog = flag.Int("follow-backlog", 200, "follow: lines per file written while the follower is stopped")

// BenchmarkFollow is the warm standby (case 11): the live load of case 2 (-live-files
// files, -live-rate lines a second, written the way Pi writes) mirrored by pisync and
// followed into a second directory by `recover --follow`. The file lag of a line is from
// just before its write on the primary to its append on the standby. Target: p99 ≤ 1 s.
// Then the follower is stopped, every file gains -follow-backlog lines, and the catch-up
// (the follower started again, until every file is current) is compared with the ceiling
// of any reader: one ordered consumer reading every message of the owner.
func BenchmarkFollow(b *testing.B) {
	for range b.N {
		r := runFollow(b, followConfig{liveConfig: liveConfig{files: *flagLiveFiles, rate: *flagLiveRate,
			duration: *flagLiveDur, warmup: 2 * time.Second}, backlog: *flagFollowBacklog})
		b.ReportMetric(ms(quantile(r.lag, 0.5)), "p50-ms")
		b.ReportMetric(ms(quantile(r.lag, 0.99)), "p99-ms")
		b.ReportMetric(ms(r.lag[len(r.lag)-1]), "max-ms")
		b.ReportMetric(float64(r.caughtUpLines)/r.catchUp.wall.Seconds(), "catch-up-entries/s")
		b.ReportMetric(float64(r.rawLines)/r.raw.wall.Seconds(), "raw-read-entries/s")
		b.ReportMetric((float64(r.caughtUpLines)/r.catchUp.wall.Seconds())/(float64(r.rawLines)/r.raw.wall.Seconds()), "catch-up-ratio")
		b.ReportMetric(float64(len(r.lag)), "lines")
		b.ReportMetric(r.others, "others-cpu-%")
	}
}

type followConfig struct {
	liveConfig
	backlog int // lines per file written while the follower is stopped
}

type followResult struct {
	lag           []time.Duration // sorted
	catchUp, raw  timed
	caughtUpLines int // lines in the files the catch-up brought up to date
	rawLines      int // messages the raw read read
	others        float64
}

// appendLog records when the follower appended each line, by conversation and ordinal.
type appendLog struct {
	mu      sync.Mutex
	at      map[string]time.Time
	reports []string
}

func (a *appendLog) appended(key string, first, last int64, _ time.Time) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for o := first; o <= last; o++ {
		a.at[key+"#"+strconv.FormatInt(o, 10)] = now
	}
}

// reported keeps the follower's reports, for a failure to show.
func (a *appendLog) reported(r recovery.Report) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reports = append(a.reports, fmt.Sprintf("%s %s through ordinal %d %s", r.Key, r.Result, r.LastOrdinal, r.Reason))
}

func (a *appendLog) get(key string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.at[key]
	return t, ok
}

// following is a follower running in the benchmark's process.
type following struct {
	f      *recovery.Follower
	cancel context.CancelFunc
	done   chan error
}

func startFollowing(tb testing.TB, url, out string, log *appendLog) *following {
	tb.Helper()
	nc := natstest.Connect(tb, url)
	r, err := mirror.NewReader(context.Background(), jsOf(tb, nc), mirror.DefaultNames(), owner(tb))
	if err != nil {
		tb.Fatal(err)
	}
	opts := recovery.FollowOptions{Options: recovery.Options{Out: out}, All: true}
	if log != nil {
		opts.OnAppend = log.appended
		opts.OnReport = log.reported
	}
	fl := &following{f: recovery.NewFollower(r, opts), done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	fl.cancel = cancel
	go func() { fl.done <- fl.f.Run(ctx) }()
	return fl
}

func (fl *following) stop() {
	fl.cancel()
	<-fl.done
}

// waitCurrent polls until the follower has applied the stream through sequence through,
// with every one of n files current and nothing left behind.
func (fl *following) waitCurrent(tb testing.TB, n int, through uint64, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := fl.f.Status()
		if st.Started && st.Position >= through && st.Current == n && st.Waiting == 0 && st.Behind == 0 &&
			len(st.Left) == 0 && st.BehindSince.IsZero() {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("follower not current after %v: %+v", timeout, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func runFollow(tb testing.TB, cfg followConfig) followResult {
	tb.Helper()
	t := newTarget(tb, 1)
	defer t.close()
	nc := t.connect(tb)
	defer nc.Close()
	root := filepath.Join(tb.TempDir(), "sessions")
	standby := filepath.Join(tb.TempDir(), "standby")
	rng := rand.New(rand.NewPCG(11, 11))
	files := make([]*sessiontest.File, cfg.files)
	var initial int64
	for i := range files {
		cwd := "/home/dev/follow-" + strconv.Itoa(i%10)
		f := sessiontest.New(rng, root, cwd, sessiontest.HarnessV3)
		if err := f.Append(f.HeaderLine(cwd), f.Entry(300), f.Entry(1000)); err != nil {
			tb.Fatal(err)
		}
		files[i] = f
		initial += int64(len(f.Content()))
	}
	settle()
	p := startPisync(tb, nc, root, *flagWindow, nil)
	p.waitMirrored(tb, initial, time.Minute)
	log := &appendLog{at: map[string]time.Time{}}
	fl := startFollowing(tb, t.url, standby, log)
	fl.waitCurrent(tb, cfg.files, streamMsgs(tb, nc), time.Minute)

	total := int((cfg.warmup + cfg.duration).Seconds() * float64(cfg.rate))
	type write struct {
		file int
		line []byte
		key  string
		at   time.Time
	}
	writes := make([]write, total)
	ords := make([]int, cfg.files)
	written := initial
	for i := range writes {
		fi := i % cfg.files
		f := files[fi]
		size, _ := lineSizeSmall(rng)
		line := append(f.Entry(size), '\n')
		ords[fi]++
		writes[i] = write{file: fi, line: line, key: f.ID + "#" + strconv.Itoa(2+ords[fi])}
		written += int64(len(line))
	}
	interval := time.Second / time.Duration(cfg.rate)
	var res followResult
	load := startLoad()
	stopProfile := profile(tb, "follow")
	start := time.Now()
	for i := range writes {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		w := &writes[i]
		w.at = time.Now()
		if err := sessiontest.AppendBytes(files[w.file].Path, w.line); err != nil {
			tb.Fatal(err)
		}
	}
	p.waitMirrored(tb, written, time.Minute)
	fl.waitCurrent(tb, cfg.files, streamMsgs(tb, nc), time.Minute)
	stopProfile()
	res.others = load.othersPercent(0)
	warm := int(cfg.warmup.Seconds() * float64(cfg.rate))
	for _, w := range writes[warm:] {
		at, ok := log.get(w.key)
		if !ok {
			log.mu.Lock()
			defer log.mu.Unlock()
			tb.Fatalf("line %s was never appended by the follower; its reports: %v", w.key, log.reports)
		}
		res.lag = append(res.lag, at.Sub(w.at))
	}
	slices.Sort(res.lag)
	sameFiles(tb, root, standby, files)

	// Offline: the follower stopped while every file gains the backlog.
	fl.stop()
	for _, f := range files {
		var buf bytes.Buffer
		for range cfg.backlog {
			size, _ := lineSizeSmall(rng)
			buf.Write(f.Entry(size))
			buf.WriteByte('\n')
		}
		if err := sessiontest.AppendBytes(f.Path, buf.Bytes()); err != nil {
			tb.Fatal(err)
		}
		written += int64(buf.Len())
	}
	p.waitMirrored(tb, written, 10*time.Minute)
	p.stop(tb)
	settle()
	res.raw, res.rawLines = rawReadAll(tb, t.url)
	settle()
	stopProfile = profile(tb, "follow-catch-up")
	stop := startTimed()
	through := streamMsgs(tb, nc)
	fl = startFollowing(tb, t.url, standby, nil)
	fl.waitCurrent(tb, cfg.files, through, 10*time.Minute)
	res.catchUp = stop()
	stopProfile()
	fl.stop()
	sameFiles(tb, root, standby, files)
	for _, f := range files {
		b, err := os.ReadFile(f.Path)
		if err != nil {
			tb.Fatal(err)
		}
		res.caughtUpLines += bytes.Count(b, []byte{'\n'})
	}
	return res
}

// sameFiles checks that every file of the primary has its copy on the standby.
func sameFiles(tb testing.TB, root, standby string, files []*sessiontest.File) {
	tb.Helper()
	for _, f := range files {
		rel, err := filepath.Rel(root, f.Path)
		if err != nil {
			tb.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(standby, rel))
		if err != nil {
			tb.Fatal(err)
		}
		if want, _ := os.ReadFile(f.Path); !bytes.Equal(got, want) {
			tb.Fatalf("%s: the standby's copy differs (%d bytes, want %d)", rel, len(got), len(want))
		}
	}
}

// rawReadAll reads every message of the owner through one ordered consumer, bodies
// included: the ceiling of any reader of the mirror (recovery's, the follower's).
func rawReadAll(tb testing.TB, url string) (timed, int) {
	tb.Helper()
	ctx := context.Background()
	nc := natstest.Connect(tb, url)
	defer nc.Close()
	js := jsOf(tb, nc)
	names := mirror.DefaultNames()
	stop := startTimed()
	cons, err := js.OrderedConsumer(ctx, names.Stream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{names.OwnerSubjects(owner(tb))}, InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		tb.Fatal(err)
	}
	defer it.Stop()
	n := 0
	for {
		m, err := it.Next()
		if err != nil {
			tb.Fatal(err)
		}
		n++
		meta, err := m.Metadata()
		if err != nil {
			tb.Fatal(err)
		}
		if meta.NumPending == 0 {
			break
		}
	}
	return stop(), n
}
