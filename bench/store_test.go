package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/store"
)

var (
	flagStoreAppends  = flag.Int("store-appends", 2000, "session store: appends timed on each side (after 100 warm-up appends)")
	flagStoreOpen     = flag.Int("store-open-entries", 10000, "session store: entries of the session opened")
	flagStoreOpens    = flag.Int("store-opens", 5, "session store: opens timed, cold and warm each")
	flagStoreSessions = flag.Int("store-sessions", 100, "session store: sessions appended to at once")
	flagStorePerSess  = flag.Int("store-session-appends", 50, "session store: appends per session when all append at once")
)

// storeConfig sizes case 9.
type storeConfig struct {
	appends, warmup, openEntries, opens, sessions, perSession int
	entryBytes                                                int // size of each entry line (a chat turn)
}

func storeConfigFromFlags() storeConfig {
	return storeConfig{appends: *flagStoreAppends, warmup: 100, openEntries: *flagStoreOpen, opens: *flagStoreOpens,
		sessions: *flagStoreSessions, perSession: *flagStorePerSess, entryBytes: 1024}
}

// storeResult is one run of case 9.
type storeResult struct {
	store, jsonl, raw  []time.Duration // append latencies, sorted
	openCold, openWarm []openTime      // open of openEntries entries
	rawRead            []time.Duration // the same session read through an ordered consumer
	pages              int             // replies of one open
	perSec, rawPerSec  float64         // appends/s, all sessions at once
	others             float64
}

// BenchmarkStore is case 9: the session store (pisync serve, the store package serving
// over NATS on loopback) against Pi's JSONL append and raw JetStream publishing with an
// expected subject sequence, in the same run.
func BenchmarkStore(b *testing.B) {
	cfg := storeConfigFromFlags()
	for i := 0; i < b.N; i++ {
		r := runStore(b, cfg)
		reportStore(b, cfg, r)
	}
}

// storeFixture is one server with the mirror provisioned, a client connection and the
// serve replica answering on it.
type storeFixture struct {
	tgt    *target
	client *nats.Conn
	js     jetstream.JetStream
	names  mirror.Names
	owner  mirror.Owner
	rep    *replica
}

// replica is one store serving on its own connection, as `pisync serve` runs it.
type replica struct {
	nc  *nats.Conn
	st  *store.Store
	svc *store.Service
}

func startReplica(tb testing.TB, url string, names mirror.Names) *replica {
	tb.Helper()
	nc := natstest.Connect(tb, url)
	st, err := store.New(benchCtx(tb), jsOf(tb, nc), names, store.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	svc, err := st.Serve(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return &replica{nc: nc, st: st, svc: svc}
}

func (r *replica) stop() {
	_ = r.svc.Stop()
	r.nc.Close()
}

func benchCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// storeReply is every field of a store reply the benchmark reads.
type storeReply struct {
	OK    bool `json:"ok"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Seq        uint64            `json:"seq"`
	Head       *string           `json:"head"`
	Generation int               `json:"generation"`
	LastSeq    uint64            `json:"lastSeq"`
	Entries    []store.OpenEntry `json:"entries"`
	Next       *store.OpenNext   `json:"next"`
}

// request sends one request to the store as the bench owner and decodes the reply; a
// reply that is not ok fails the benchmark. wait is the time from the request sent to
// the reply received, decoding excluded.
func (f *storeFixture) request(tb testing.TB, op string, body any) (r storeReply, wait time.Duration) {
	b, err := json.Marshal(body)
	if err != nil {
		tb.Fatal(err)
	}
	t0 := time.Now()
	m, err := f.client.Request(f.names.StoreSubject(f.owner, op), b, 30*time.Second)
	wait = time.Since(t0)
	if err != nil {
		tb.Fatalf("%s: %v", op, err)
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		tb.Fatalf("%s reply: %v", op, err)
	}
	if !r.OK {
		tb.Fatalf("%s: %+v", op, r.Error)
	}
	return r, wait
}

// newSession creates a store-born session and returns the file that generates its lines.
func (f *storeFixture) newSession(tb testing.TB, rng *rand.Rand, cwd string) *sessiontest.File {
	sf := sessiontest.New(rng, tb.TempDir(), cwd, sessiontest.HarnessV3)
	_, _ = f.request(tb, "create", map[string]string{"line": string(sf.HeaderLine(cwd))})
	return sf
}

// appendLine appends a line of sf through the store, after the leaf head, and keeps it
// in sf.Lines.
func (f *storeFixture) appendLine(tb testing.TB, sf *sessiontest.File, head string, line []byte) {
	var expected any
	if head != "" {
		expected = head
	}
	_, _ = f.request(tb, "append", map[string]any{"id": sf.ID, "expectedHead": expected, "line": string(line)})
	sf.Lines = append(sf.Lines, line)
}

// rawLine is the message metadata the store would give line at ordinal of generation 1:
// the raw side publishes the same subject, headers and body.
func rawLine(line []byte, ordinal int64) mirror.Line {
	m := classify(line, ordinal)
	return mirror.Line{Kind: m.kind, EntryID: m.entryID, ParentID: m.parentID, EntryType: m.entryType, Ordinal: ordinal,
		Generation: 1, SHA256: m.sha, Format: string(session.FormatV3), Host: "pisync-store", Source: "raw.jsonl"}
}

// openAll reads a session through open and its continuations, as a client does, and
// returns its entry lines, the number of replies, and the time spent waiting for them:
// the store's and the network's share of an open, without the client's decoding (Go's
// encoding/json takes about as long again as the rest; the Node client's is in the
// Node figures).
func (f *storeFixture) openAll(tb testing.TB, id string) (lines []string, pages int, wait time.Duration) {
	r, w := f.request(tb, "open", map[string]any{"id": id})
	gen, last := r.Generation, r.LastSeq
	pages, wait = 1, w
	for {
		for _, e := range r.Entries {
			if e.Line == nil {
				tb.Fatalf("entry %d sent by reference: the benchmark's entries are small", e.Ordinal)
			}
			lines = append(lines, *e.Line)
		}
		if r.Next == nil {
			return lines, pages, wait
		}
		r, w = f.request(tb, "open", map[string]any{"id": id, "generation": gen, "lastSeq": last, "after": r.Next.After})
		pages, wait = pages+1, wait+w
	}
}

func runStore(tb testing.TB, cfg storeConfig) storeResult {
	tb.Helper()
	tgt := newTarget(tb, 1)
	defer tgt.close()
	f := &storeFixture{tgt: tgt, client: tgt.connect(tb), names: mirror.DefaultNames(), owner: owner(tb)}
	defer f.client.Close()
	f.js = jsOf(tb, f.client)
	f.rep = startReplica(tb, tgt.url, f.names)
	defer func() { f.rep.stop() }()
	rng := rand.New(rand.NewPCG(9, 9))
	settle()
	load := startLoad()
	var res storeResult
	stop := profile(tb, "store-append")
	res.store, res.jsonl, res.raw = storeLatencies(tb, f, rng, cfg)
	stop()
	stop = profile(tb, "store-open")
	res.openCold, res.openWarm, res.rawRead, res.pages = storeOpens(tb, f, rng, cfg)
	stop()
	stop = profile(tb, "store-concurrent")
	res.perSec, res.rawPerSec = storeConcurrent(tb, f, rng, cfg)
	stop()
	res.others = load.othersPercent(0)
	return res
}

// storeLatencies times appends one after the other on each side, in rounds of 100 that
// alternate the sides, so that a change of the machine's speed during the run falls on
// all three alike: through the store (request to reply), Pi's JSONL append (what Pi's
// JsonlSessionStorage.appendEntry does: appendFile of the line and a newline, that is
// open, write, close, no fsync), and a raw synchronous JetStream publish of the same
// message with Nats-Expected-Last-Subject-Sequence.
func storeLatencies(tb testing.TB, f *storeFixture, rng *rand.Rand, cfg storeConfig) (st, jl, raw []time.Duration) {
	sf := f.newSession(tb, rng, "/bench/append")
	jf := sessiontest.New(rng, tb.TempDir(), "/bench/append", sessiontest.HarnessV3)
	if err := jf.Append(jf.HeaderLine("/bench/append")); err != nil {
		tb.Fatal(err)
	}
	rawConv, err := mirror.NewConv(f.owner, "raw-append")
	if err != nil {
		tb.Fatal(err)
	}
	rawSeq, ordinal := uint64(0), int64(0)
	ctx := benchCtx(tb)
	storeOne := func() time.Duration {
		head := sf.Leaf()
		line := sf.Message(cfg.entryBytes)
		t0 := time.Now()
		f.appendLine(tb, sf, head, line)
		return time.Since(t0)
	}
	jsonlOne := func() time.Duration {
		line := jf.Message(cfg.entryBytes)
		t0 := time.Now()
		if err := sessiontest.AppendBytes(jf.Path, append(line, '\n')); err != nil {
			tb.Fatal(err)
		}
		return time.Since(t0)
	}
	rawOne := func() time.Duration {
		line := jf.Message(cfg.entryBytes)
		ordinal++
		m := f.names.NewMsg(rawConv, rawLine(line, ordinal), line)
		t0 := time.Now()
		ack, err := f.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(rawSeq))
		d := time.Since(t0)
		if err != nil {
			tb.Fatalf("raw publish: %v", err)
		}
		rawSeq = ack.Sequence
		return d
	}
	for i := 0; i < cfg.warmup; i++ {
		storeOne()
		jsonlOne()
		rawOne()
	}
	for done := 0; done < cfg.appends; done += 100 {
		n := min(100, cfg.appends-done)
		for i := 0; i < n; i++ {
			jl = append(jl, jsonlOne())
		}
		for i := 0; i < n; i++ {
			raw = append(raw, rawOne())
		}
		for i := 0; i < n; i++ {
			st = append(st, storeOne())
		}
	}
	// Every line is in the store, in order.
	lines, _, _ := f.openAll(tb, sf.ID)
	if want := sf.Lines; len(lines) != len(want) || lines[len(lines)-1] != string(want[len(want)-1]) {
		tb.Fatalf("the store has %d lines, %d were appended", len(lines), len(want))
	}
	slices.Sort(st)
	slices.Sort(jl)
	slices.Sort(raw)
	return st, jl, raw
}

// storeOpens times opens of a session of cfg.openEntries entries (timeOpen): cold, each on
// a replica that has never seen the session (a replica started, or restarted, since it
// was written), and warm, on a replica that knows the conversation and has just appended
// to it (the snapshot is new, so open reads it). raw is the ceiling of a cold open: the
// time to read every message of the session, bodies included, through an ordered
// consumer on its subject (mirror.Reader.Scan, what a cold open does before it answers).
func storeOpens(tb testing.TB, f *storeFixture, rng *rand.Rand, cfg storeConfig) (cold, warm []openTime, raw []time.Duration, pages int) {
	sf := f.newSession(tb, rng, "/bench/open")
	o := f.owner
	ctx := benchCtx(tb)
	for i := 0; i < cfg.openEntries; i++ {
		head := sf.Leaf()
		line := sf.Message(cfg.entryBytes)
		// In process, so that writing the session costs no request round trip: the same
		// Append the service calls.
		if _, e := f.rep.st.Append(ctx, o, sf.ID, head, line); e != nil {
			tb.Fatalf("append %d: %v", i, e)
		}
		sf.Lines = append(sf.Lines, line)
	}
	for i := 0; i < cfg.opens; i++ {
		f.rep.stop()
		f.rep = startReplica(tb, f.tgt.url, f.names)
		settle()
		cold = append(cold, timeOpen(tb, f, sf))
	}
	r, err := mirror.NewReader(ctx, f.js, f.names, o)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := r.Conv(sf.ID)
	if err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < cfg.opens; i++ {
		settle()
		n, t0 := 0, time.Now()
		if err := r.Scan(ctx, c, mirror.ScanOptions{}, func(m mirror.Msg) error { n++; return nil }); err != nil {
			tb.Fatal(err)
		}
		raw = append(raw, time.Since(t0))
		if n != len(sf.Lines)+1 {
			tb.Fatalf("read %d messages, the session has %d lines and its header", n, len(sf.Lines))
		}
	}
	slices.Sort(raw)
	for i := 0; i < cfg.opens; i++ {
		head := sf.Leaf()
		f.appendLine(tb, sf, head, sf.Message(cfg.entryBytes))
		warm = append(warm, timeOpen(tb, f, sf))
	}
	pages = cold[0].pages
	return cold, warm, raw, pages
}

// openTime is one timed open.
type openTime struct {
	wait, client, cpu time.Duration // see timeOpen
	pages             int
}

// timeOpen opens sf and checks that it read every line: wait is the time waiting for the
// replies, client the time from the first request to the last reply decoded, cpu the
// CPU time of the whole process (server, store and client) meanwhile.
func timeOpen(tb testing.TB, f *storeFixture, sf *sessiontest.File) openTime {
	cpu0, t0 := selfCPU(), time.Now()
	lines, pages, wait := f.openAll(tb, sf.ID)
	ot := openTime{wait: wait, client: time.Since(t0), cpu: selfCPU() - cpu0, pages: pages}
	if len(lines) != len(sf.Lines) || lines[len(lines)-1] != string(sf.Lines[len(sf.Lines)-1]) {
		tb.Fatalf("open read %d entries, the session has %d", len(lines), len(sf.Lines))
	}
	return ot
}

// medianOf is the median of one field of opens.
func medianOf(opens []openTime, field func(openTime) time.Duration) time.Duration {
	d := make([]time.Duration, len(opens))
	for i, o := range opens {
		d[i] = field(o)
	}
	slices.Sort(d)
	return quantile(d, 0.5)
}

// storeConcurrent measures appends/s with cfg.sessions sessions each appending
// cfg.perSession entries one after the other, all sessions at once, over one client
// connection; and the ceiling, raw synchronous publishes with the expected subject
// sequence on as many subjects at once.
func storeConcurrent(tb testing.TB, f *storeFixture, rng *rand.Rand, cfg storeConfig) (perSec, rawPerSec float64) {
	type prepared struct {
		sf    *sessiontest.File
		heads []string
		lines [][]byte
	}
	sess := make([]prepared, cfg.sessions)
	for i := range sess {
		p := prepared{sf: f.newSession(tb, rng, "/bench/many")}
		for j := 0; j < cfg.perSession; j++ {
			p.heads = append(p.heads, p.sf.Leaf())
			p.lines = append(p.lines, p.sf.Message(cfg.entryBytes))
		}
		sess[i] = p
	}
	run := func(one func(i, j int)) float64 {
		var wg sync.WaitGroup
		t0 := time.Now()
		for i := range sess {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < cfg.perSession; j++ {
					one(i, j)
				}
			}()
		}
		wg.Wait()
		return float64(cfg.sessions*cfg.perSession) / time.Since(t0).Seconds()
	}
	settle()
	perSec = run(func(i, j int) {
		p := sess[i]
		f.appendLine(tb, p.sf, p.heads[j], p.lines[j])
	})
	ctx := benchCtx(tb)
	seqs := make([]uint64, cfg.sessions)
	settle()
	rawPerSec = run(func(i, j int) {
		p := sess[i]
		c, err := mirror.NewConv(f.owner, fmt.Sprintf("raw-many-%d", i))
		if err != nil {
			tb.Error(err)
			return
		}
		ack, err := f.js.PublishMsg(ctx, f.names.NewMsg(c, rawLine(p.lines[j], int64(j+1)), p.lines[j]), jetstream.WithExpectLastSequencePerSubject(seqs[i]))
		if err != nil {
			tb.Errorf("raw publish: %v", err)
			return
		}
		seqs[i] = ack.Sequence
	})
	// Every session holds its appends.
	for _, p := range sess[:min(3, len(sess))] {
		if lines, _, _ := f.openAll(tb, p.sf.ID); len(lines) != cfg.perSession {
			tb.Fatalf("session %s has %d entries, %d were appended", p.sf.ID, len(lines), cfg.perSession)
		}
	}
	return perSec, rawPerSec
}

func reportStore(b *testing.B, cfg storeConfig, r storeResult) {
	b.ReportMetric(ms(quantile(r.store, 0.5)), "p50-ms")
	b.ReportMetric(ms(quantile(r.store, 0.99)), "p99-ms")
	b.ReportMetric(ms(quantile(r.jsonl, 0.5)), "jsonl-p50-ms")
	b.ReportMetric(ms(quantile(r.jsonl, 0.99)), "jsonl-p99-ms")
	b.ReportMetric(ms(quantile(r.raw, 0.5)), "raw-p50-ms")
	b.ReportMetric(ms(quantile(r.raw, 0.99)), "raw-p99-ms")
	b.ReportMetric(ratio(quantile(r.store, 0.5), quantile(r.raw, 0.5)), "raw-ratio-p50")
	b.ReportMetric(ratio(quantile(r.store, 0.99), quantile(r.raw, 0.99)), "raw-ratio-p99")
	b.ReportMetric(ratio(quantile(r.store, 0.5), quantile(r.jsonl, 0.5)), "jsonl-ratio-p50")
	b.ReportMetric(ratio(quantile(r.store, 0.99), quantile(r.jsonl, 0.99)), "jsonl-ratio-p99")
	wait := func(o openTime) time.Duration { return o.wait }
	client := func(o openTime) time.Duration { return o.client }
	cpu := func(o openTime) time.Duration { return o.cpu }
	b.ReportMetric(ms(medianOf(r.openCold, wait)), "open-cold-ms")
	b.ReportMetric(ms(medianOf(r.openCold, client)), "open-cold-client-ms")
	b.ReportMetric(ms(medianOf(r.openCold, cpu)), "open-cold-cpu-ms")
	b.ReportMetric(ms(quantile(r.rawRead, 0.5)), "raw-read-ms")
	b.ReportMetric(ratio(medianOf(r.openCold, wait), quantile(r.rawRead, 0.5)), "open-cold-raw-ratio")
	b.ReportMetric(ms(medianOf(r.openWarm, wait)), "open-warm-ms")
	b.ReportMetric(ms(medianOf(r.openWarm, client)), "open-warm-client-ms")
	b.ReportMetric(ms(medianOf(r.openWarm, cpu)), "open-warm-cpu-ms")
	b.ReportMetric(float64(r.pages), "open-pages")
	b.ReportMetric(float64(cfg.openEntries), "open-entries")
	b.ReportMetric(r.perSec, "appends/s")
	b.ReportMetric(r.rawPerSec, "raw-appends/s")
	b.ReportMetric(r.perSec/r.rawPerSec, "appends-ratio")
	b.ReportMetric(float64(cfg.sessions), "concurrent-sessions")
	b.ReportMetric(r.others, "others-cpu-%")
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}
