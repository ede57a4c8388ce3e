package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/natstest"
	"github.com/pisync/pisync/recovery"
)

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestExploreRead(t *testing.T) {
	if os.Getenv("EXPLORE") == "" {
		t.Skip()
	}
	fx := recoveryFixture(t, backfillSpec(*flagSessions, *flagEntries))
	ctx := context.Background()
	nc := natstest.Connect(t, fx.url)
	js, _ := jetstream.New(nc)
	names := mirror.DefaultNames()
	read := func(name string, cfg jetstream.OrderedConsumerConfig, opts ...jetstream.PullMessagesOpt) {
		c0 := cpuNow()
		start := time.Now()
		cons, err := js.OrderedConsumer(ctx, names.Stream(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		it, err := cons.Messages(opts...)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := it.Next()
			if err != nil {
				t.Fatal(err)
			}
			n++
			meta, _ := m.Metadata()
			if meta.NumPending == 0 {
				break
			}
		}
		it.Stop()
		el := time.Since(start)
		fmt.Printf("%-40s %d msgs %v  %.0f msgs/s  cpu %v\n", name, n, el, float64(n)/el.Seconds(), cpuNow()-c0)
	}
	if os.Getenv("EXPLORE") == "prof" {
		for range 4 {
			read("wildcard 1024", jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.OwnerSubjects(owner(t))}}, jetstream.PullMaxMessages(1024))
		}
		return
	}
	for range 2 {
		read("nofilter 1024", jetstream.OrderedConsumerConfig{}, jetstream.PullMaxMessages(1024))
		read("wildcard 1024", jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.OwnerSubjects(owner(t))}}, jetstream.PullMaxMessages(1024))
		read("wildcard 256", jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.OwnerSubjects(owner(t))}}, jetstream.PullMaxMessages(256))
		read("wildcard 4096", jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.OwnerSubjects(owner(t))}}, jetstream.PullMaxMessages(4096))
		read("wildcard maxbytes 8M", jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.OwnerSubjects(owner(t))}}, jetstream.PullMaxBytes(8<<20))
		read("wildcard hdrs 1024", jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.OwnerSubjects(owner(t))}, HeadersOnly: true}, jetstream.PullMaxMessages(1024))
	}
}

func TestExploreRecovery(t *testing.T) {
	if os.Getenv("EXPLORE") == "" {
		t.Skip()
	}
	fx := recoveryFixture(t, backfillSpec(*flagSessions, *flagEntries))
	for _, par := range []int{1, 4, 16} {
		for _, dry := range []bool{true, false} {
			c0 := cpuNow()
			if os.Getenv("PROF") != "" && par == 4 {
				f, _ := os.Create(fmt.Sprintf("/tmp/prof/recovery-dry%v.cpu", dry))
				pprof.StartCPUProfile(f)
			}
			d := runRecovery(t, fx, dry, par)
			if os.Getenv("PROF") != "" && par == 4 {
				pprof.StopCPUProfile()
			}
			fmt.Printf("parallel %2d dry %-5v %v  %.0f lines/s  cpu %v\n", par, dry, d, float64(fx.w.lines)/d.Seconds(), cpuNow()-c0)
		}
	}
}

type oldScan struct {
	*mirror.Reader
	js    jetstream.JetStream
	names mirror.Names
}

func (r oldScan) Scan(ctx context.Context, c mirror.Conv, opts mirror.ScanOptions, fn func(mirror.Msg) error) error {
	last, err := r.LastSeq(ctx, c)
	if err != nil {
		return err
	}
	from := max(opts.FromSeq, 1)
	if last == 0 || last < from {
		return nil
	}
	cons, err := r.js.OrderedConsumer(ctx, r.names.Stream(), jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{r.names.Subject(c)},
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       from,
		HeadersOnly:       opts.HeadersOnly,
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("read %s: create consumer: %w", c.Key, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("read %s: %w", c.Key, err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("read %s: %w", c.Key, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: metadata: %w", c.Key, err)
		}
		if l, err := mirror.ParseLine(m.Headers()); err == nil {
			msg := mirror.Msg{Line: l, Seq: meta.Sequence.Stream, Time: meta.Timestamp}
			if !opts.HeadersOnly && l.Kind != mirror.KindBlob {
				msg.Data = m.Data()
			}
			if err := fn(msg); err != nil {
				return err
			}
		}
		if meta.NumPending == 0 || meta.Sequence.Stream >= last {
			return nil
		}
	}
}

// runRecoveryWith is runRecovery with a given Mirror.
func runRecoveryWith(tb testing.TB, fx *mirrorFixture, m recovery.Mirror, dryRun bool, parallel int) time.Duration {
	ctx := context.Background()
	out := filepath.Join(tb.TempDir(), "out")
	defer os.RemoveAll(out)
	settle()
	start := time.Now()
	keys, err := recovery.Keys(ctx, m, nil, true)
	if err != nil {
		tb.Fatal(err)
	}
	reps := recovery.New(m, recovery.Options{Out: out, Parallel: parallel, DryRun: dryRun}).Run(ctx, keys)
	elapsed := time.Since(start)
	for _, r := range reps {
		if r.Result != recovery.DryRun && r.Result != recovery.Written {
			tb.Fatalf("%s: %s (%s)", r.Key, r.Result, r.Reason)
		}
	}
	return elapsed
}

func TestExploreAB(t *testing.T) {
	if os.Getenv("EXPLORE") == "" {
		t.Skip()
	}
	fx := recoveryFixture(t, backfillSpec(*flagSessions, *flagEntries))
	ctx := context.Background()
	nc := natstest.Connect(t, fx.url)
	js, _ := jetstream.New(nc)
	names := mirror.DefaultNames()
	r, err := mirror.NewReader(ctx, js, names, owner(t))
	if err != nil {
		t.Fatal(err)
	}
	stream, _ := js.Stream(ctx, names.Stream())
	consumers := func() int {
		info, _ := stream.Info(ctx)
		return info.State.Consumers
	}
	variants := []struct {
		name string
		m    recovery.Mirror
	}{{"old", oldScan{r, js, names}}, {"new", r}}
	if os.Getenv("ONLYNEW") != "" {
		variants = variants[1:]
	}
	dry := os.Getenv("WET") == ""
	for rep := range 4 {
		for _, v := range variants {
			time.Sleep(6 * time.Second) // consumers of the last run expire
			c0 := cpuNow()
			d := runRecoveryWith(t, fx, v.m, dry, 4)
			fmt.Printf("rep %d %-4s %6.0f lines/s  wall %v cpu %v consumers left %d\n", rep, v.name, float64(fx.w.lines)/d.Seconds(), d.Round(time.Millisecond), (cpuNow() - c0).Round(time.Millisecond), consumers())
		}
	}
}

func TestExploreProfile(t *testing.T) {
	if os.Getenv("EXPLORE") == "" {
		t.Skip()
	}
	fx := recoveryFixture(t, backfillSpec(*flagSessions, *flagEntries))
	runRecovery(t, fx, true, 4) // warm
	f, _ := os.Create("/tmp/prof/variant.cpu")
	pprof.StartCPUProfile(f)
	c0 := cpuNow()
	d := runRecovery(t, fx, true, 4)
	pprof.StopCPUProfile()
	fmt.Printf("dry %v cpu %v\n", d, cpuNow()-c0)
	f, _ = os.Create("/tmp/prof/raw.cpu")
	pprof.StartCPUProfile(f)
	c0 = cpuNow()
	d = rawRead(t, fx)
	pprof.StopCPUProfile()
	fmt.Printf("raw %v cpu %v\n", d, cpuNow()-c0)
}

func TestExploreOrder(t *testing.T) {
	if os.Getenv("EXPLORE") == "" {
		t.Skip()
	}
	fx := recoveryFixture(t, backfillSpec(*flagSessions, *flagEntries))
	ctx := context.Background()
	nc := natstest.Connect(t, fx.url)
	js, _ := jetstream.New(nc)
	names := mirror.DefaultNames()
	r, err := mirror.NewReader(ctx, js, names, owner(t))
	if err != nil {
		t.Fatal(err)
	}
	heads, _ := r.Heads(ctx)
	byKey := map[string]uint64{}
	for _, h := range heads {
		byKey[h.Key] = h.LastSeq
	}
	keys, _ := recovery.Keys(ctx, r, nil, true)
	seqKeys := slices.Clone(keys)
	sort.Slice(seqKeys, func(i, j int) bool { return byKey[seqKeys[i]] < byKey[seqKeys[j]] })
	run := func(name string, ks []string, par int, dry bool) {
		out := filepath.Join(t.TempDir(), "out")
		defer os.RemoveAll(out)
		settle()
		c0 := cpuNow()
		start := time.Now()
		reps := recovery.New(r, recovery.Options{Out: out, Parallel: par, DryRun: dry}).Run(ctx, ks)
		d := time.Since(start)
		for _, rep := range reps {
			if rep.Result != recovery.DryRun && rep.Result != recovery.Written {
				t.Fatalf("%s: %s", rep.Key, rep.Reason)
			}
		}
		fmt.Printf("%-12s par %2d dry %-5v %6.0f lines/s wall %v cpu %v\n", name, par, dry, float64(fx.w.lines)/d.Seconds(), d.Round(time.Millisecond), (cpuNow() - c0).Round(time.Millisecond))
	}
	for rep := range 2 {
		_ = rep
		for _, dry := range []bool{true, false} {
			run("key order", keys, 4, dry)
			run("seq order", seqKeys, 4, dry)
			run("seq order", seqKeys, 8, dry)
			run("seq order", seqKeys, 2, dry)
		}
	}
	d := rawRead(t, fx)
	fmt.Printf("raw read %6.0f lines/s\n", float64(fx.w.lines)/d.Seconds())
}

func TestExploreBackfillProfile(t *testing.T) {
	if os.Getenv("EXPLORE") == "" {
		t.Skip()
	}
	w := getWorkload(t, backfillSpec(*flagSessions, *flagEntries))
	for _, side := range []string{"raw", "pisync"} {
		tg := newTarget(t, 1)
		nc := tg.connect(t)
		settle()
		f, _ := os.Create("/tmp/prof/backfill-" + side + ".cpu")
		pprof.StartCPUProfile(f)
		c0 := cpuNow()
		start := time.Now()
		if side == "raw" {
			rawPublish(t, nc, w, *flagWindow)
		} else {
			p := startPisync(t, nc, w.root, *flagWindow, nil)
			p.waitMirrored(t, w.bytes, time.Hour)
			el := time.Since(start)
			pprof.StopCPUProfile()
			fmt.Printf("%s %v cpu %v\n", side, el, cpuNow()-c0)
			p.stop(t)
			nc.Close()
			tg.close()
			continue
		}
		el := time.Since(start)
		pprof.StopCPUProfile()
		fmt.Printf("%s %v cpu %v\n", side, el, cpuNow()-c0)
		nc.Close()
		tg.close()
	}
}

func TestExploreDaemon(t *testing.T) {
	if os.Getenv("EXPLORE") == "" {
		t.Skip()
	}
	var w *workload
	if os.Getenv("BIG") != "" {
		w = getWorkload(t, spec{name: "big", bigBytes: int64(*flagBigMiB) << 20, seed: 4})
	} else {
		w = getWorkload(t, filesSpec(*flagIdleFiles, *flagScaleEntries))
	}
	pisyncBinary(t)
	tg := newTarget(t, 1)
	defer tg.close()
	var flags []string
	if os.Getenv("VERIFYOFF") != "" {
		flags = []string{"--verify-interval", "0"}
	}
	if os.Getenv("VERIFY") != "" {
		flags = []string{"--verify-interval", "15s"}
	}
	start := time.Now()
	d := startDaemon(t, tg.url, w.root, flags...)
	os.WriteFile("/tmp/explore/daemon.pid", []byte(fmt.Sprint(d.cmd.Process.Pid)), 0o644)
	r := d.waitMirrored(t, start, len(w.files), w.bytes, time.Hour)
	fmt.Printf("mirrored %+v\n", r)
	os.WriteFile("/tmp/explore/daemon.mirrored", []byte("1"), 0o644)
	time.Sleep(*flagIdleDur)
	st := d.stat(t)
	fmt.Printf("end rss %v hwm %v cpu %v\n", mb(st.rss), mb(st.hwm), st.cpu)
}

func TestExploreHeap(t *testing.T) {
	if os.Getenv("EXPLORE") == "" {
		t.Skip()
	}
	w := getWorkload(t, filesSpec(*flagIdleFiles, *flagScaleEntries))
	tg := newTarget(t, 1)
	nc := tg.connect(t)
	p := startPisync(t, nc, w.root, *flagWindow, nil)
	p.waitMirrored(t, w.bytes, time.Hour)
	time.Sleep(3 * time.Second)
	runtime.GC()
	f, _ := os.Create("/tmp/prof/heap.pprof")
	pprof.Lookup("heap").WriteTo(f, 0)
	f.Close()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("heap inuse %v MB, sys %v MB\n", ms.HeapInuse>>20, ms.Sys>>20)
}
