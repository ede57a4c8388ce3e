package publisher

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// BenchmarkLine is the publisher's per-line path of a back-fill (bench/RESULTS.md, issue
// 15: CPU per line): Pi-shaped entries of about 2.6 KB through Line (hash, classify,
// message build, publish) into a real server in this process, every acknowledgement
// collected and the frontier moved before the clock stops. "raw" publishes the same
// bytes with prebuilt headers (one message id each), the floor that nats.go and the
// server cost. Allocations count the server's too; compare allocs/op between builds, not
// with zero. The machine's load moves ns/op; allocs/op and B/op do not.
func BenchmarkLine(b *testing.B) {
	b.Run("pisync", benchLinePisync)
	b.Run("raw", benchLineRaw)
}

// benchLines are templates of Pi-shaped entries whose 8-hex-digit id is rewritten for
// each line, so that every line has its own message id without generating b.N entries.
type benchLines struct {
	lines [][]byte
	idAt  []int // offset of the id's first digit in each template
	buf   []byte
}

func newBenchLines(b *testing.B, sf *sessiontest.File) *benchLines {
	bl := &benchLines{}
	for range 64 {
		l := sf.Message(2600)
		at := bytes.Index(l, []byte(`"id":"`))
		if at < 0 || len(l) < at+6+8 {
			b.Fatalf("no id in %.80s", l)
		}
		bl.lines = append(bl.lines, l)
		bl.idAt = append(bl.idAt, at+6)
	}
	return bl
}

// line i, valid until the next call (like the watcher's buffer).
func (bl *benchLines) line(i int) []byte {
	k := i % len(bl.lines)
	bl.buf = append(bl.buf[:0], bl.lines[k]...)
	id := strconv.AppendUint(nil, uint64(i)|1<<31, 16)
	copy(bl.buf[bl.idAt[k]:], id[len(id)-8:])
	return bl.buf
}

func benchLinePisync(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := testOptions(b, ctx, natstest.Run(b).URL())
	store, _, err := checkpoint.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	opts.Checkpoints = store
	p, err := New(ctx, opts)
	if err != nil {
		b.Fatal(err)
	}
	p.Start()
	defer p.Close(context.Background())

	root := b.TempDir()
	sf := sessiontest.New(rand.New(rand.NewPCG(15, 15)), root, "/home/dev/p", sessiontest.CLIV3)
	hdr := sf.HeaderLine("/home/dev/p")
	if err := sf.Append(hdr); err != nil {
		b.Fatal(err)
	}
	fd, err := os.Open(sf.Path)
	if err != nil {
		b.Fatal(err)
	}
	defer fd.Close()
	info, err := fd.Stat()
	if err != nil {
		b.Fatal(err)
	}
	rel, _ := filepath.Rel(root, sf.Path)
	// The file's size at open is taken as far beyond every line: all are back-filled
	// (pipelined), none live (one at a time).
	f := watcher.File{Root: root, Rel: filepath.ToSlash(rel), Path: sf.Path, Lead: &watcher.Lead{Lines: [][]byte{hdr}}, Size: 1 << 50,
		ID: watcher.FileIDOf(info)}
	if _, err := p.Open(ctx, f, watcher.Discovered); err != nil {
		b.Fatal(err)
	}
	bl := newBenchLines(b, sf)
	p.mu.Lock()
	st := p.files[f.ID]
	p.mu.Unlock()
	off := int64(0)
	deliver := func(ord int64, l []byte) {
		if err := p.Line(ctx, f, watcher.Line{Ordinal: ord, Offset: off, Len: int64(len(l)), Data: l, Seen: time.Now(), Src: fd}); err != nil {
			b.Fatalf("line %d: %v", ord, err)
		}
		off += int64(len(l)) + 1
	}
	drain := func() {
		for deadline := time.Now().Add(time.Minute); ; {
			st.mu.Lock()
			n := len(st.queue)
			st.mu.Unlock()
			if n == 0 {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d lines unacknowledged after a minute", n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	deliver(0, hdr)
	drain()

	b.ReportAllocs()
	b.SetBytes(int64(len(bl.lines[0]) + 1))
	cpu := processCPU(b)
	b.ResetTimer()
	for i := range b.N {
		deliver(int64(i)+1, bl.line(i))
	}
	drain()
	b.StopTimer()
	cpu()
}

func benchLineRaw(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := testOptions(b, ctx, natstest.Run(b).URL())
	conv, err := mirror.NewConv(opts.Owner, "c1")
	if err != nil {
		b.Fatal(err)
	}
	sf := sessiontest.New(rand.New(rand.NewPCG(15, 15)), b.TempDir(), "/home/dev/p", sessiontest.CLIV3)
	bl := newBenchLines(b, sf)
	// One message per template, its headers those of a real line; only the id changes.
	tmpl := make([]*nats.Msg, len(bl.lines))
	for k, l := range bl.lines {
		tmpl[k] = opts.Names.NewMsg(conv, mirror.Line{Kind: mirror.KindEntry, EntryID: "x", EntryType: "message", Ordinal: int64(k),
			Generation: 1, SHA256: "0000000000000000000000000000000000000000000000000000000000000000", Format: "v3", Host: "h1",
			Source: "--home-dev-p--/s.jsonl"}, l)
	}
	futs := make(chan jetstream.PubAckFuture, 256) // in flight: fewer than testOptions lets nats.go hold
	done := make(chan error, 1)
	go func() {
		for fut := range futs {
			select {
			case <-fut.Ok():
			case err := <-fut.Err():
				done <- err
				for range futs {
				}
				return
			}
		}
		done <- nil
	}()

	b.ReportAllocs()
	b.SetBytes(int64(len(bl.lines[0]) + 1))
	cpu := processCPU(b)
	b.ResetTimer()
	for i := range b.N {
		t := tmpl[i%len(tmpl)]
		h := make(nats.Header, len(t.Header))
		for k, v := range t.Header {
			h[k] = v
		}
		h[mirror.HdrMsgID] = []string{strconv.Itoa(i)}
		fut, err := opts.JS.PublishMsgAsync(&nats.Msg{Subject: t.Subject, Header: h, Data: bl.line(i)})
		if err != nil {
			b.Fatal(err)
		}
		futs <- fut
	}
	close(futs)
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	cpu()
}

// processCPU starts counting the CPU time of this process (the server's included); the
// function it returns reports it per line as cpu-ns/op. Wall time waits for the other
// processes of a loaded machine, CPU time less so.
func processCPU(b *testing.B) func() {
	start := cpuTime(b)
	return func() {
		b.ReportMetric(float64((cpuTime(b)-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
