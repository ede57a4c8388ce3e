package bench

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// What one JetStream server pays for pisync's objects (docs/capacity.md): heap per
// conversation (a subject of the entries stream), per head (a key of the heads bucket),
// per message id inside the duplicate window, and disk per entry. The server runs in this
// process; the client keeps nothing once its publishes are acknowledged, so the growth
// of the live heap after a collection is the server's.

var (
	flagCapConvs   = flag.Int("capacity-convs", 200_000, "capacity: conversations (subjects) and heads (keys) created")
	flagCapIDs     = flag.Int("capacity-ids", 500_000, "capacity: message ids published inside the duplicate window")
	flagCapEntries = flag.Int("capacity-entries", 100_000, "capacity: Pi-shaped entries stored, for the disk cost")
	flagCapSettle  = flag.Duration("capacity-settle", 130*time.Second, "capacity: quiet time before the settled heap is read (the file store drops per-block subject state after 2 min)")
)

// capacityResult is what BenchmarkClusterCost reports, per unit.
type capacityResult struct {
	convHot, convSettled float64 // heap bytes per conversation: right after creation, and once idle
	headHot, headSettled float64 // heap bytes per head
	idBytes              float64 // heap bytes per message id in the duplicate window
	diskPerEntry         float64 // store bytes per entry on disk, headers and indexes included
	payloadPerEntry      float64 // of which the line itself
	storedPerEntry       float64 // the stream's own count of bytes per message (subject, headers, body)
}

func BenchmarkClusterCost(b *testing.B) {
	for i := 0; i < b.N; i++ {
		r := runCapacity(b, *flagCapConvs, *flagCapIDs, *flagCapEntries, *flagCapSettle)
		b.ReportMetric(r.convHot, "conv-hot-B")
		b.ReportMetric(r.convSettled, "conv-B")
		b.ReportMetric(r.headHot, "head-hot-B")
		b.ReportMetric(r.headSettled, "head-B")
		b.ReportMetric(r.idBytes, "msgid-B")
		b.ReportMetric(r.diskPerEntry, "disk-per-entry-B")
		b.ReportMetric(r.payloadPerEntry, "payload-per-entry-B")
		b.ReportMetric(r.storedPerEntry, "stored-per-entry-B")
	}
}

func runCapacity(tb testing.TB, convs, ids, entries int, settle time.Duration) capacityResult {
	var r capacityResult
	names := mirror.DefaultNames()
	o := owner(tb)
	ctx := context.Background()

	// One fresh server per measure, so that each one's growth is its own.
	measure := func(what string, wait time.Duration, fill func(js jetstream.JetStream) error) (hot, settled float64) {
		srv := natstest.Run(tb)
		defer func() { srv.Stop(); os.RemoveAll(srv.StoreDir()) }()
		nc := natstest.Connect(tb, srv.URL())
		defer nc.Close()
		js := jsOf(tb, nc)
		if err := mirror.Provision(ctx, js, names, mirror.Config{}); err != nil {
			tb.Fatal(err)
		}
		base := liveHeap()
		if err := fill(js); err != nil {
			tb.Fatalf("%s: %v", what, err)
		}
		hot = float64(liveHeap() - base)
		if wait > 0 {
			time.Sleep(wait) // the quiet time is what is measured, not a synchronization
		}
		settled = float64(liveHeap() - base)
		return hot, settled
	}

	hot, settled := measure("conversations", settle, func(js jetstream.JetStream) error {
		return publishAll(ctx, js, convs, func(i int) *nats.Msg {
			c, _ := mirror.NewConv(o, fmt.Sprintf("0192f0a4-%04x-7000-8000-%012x", i>>16, i))
			return &nats.Msg{Subject: names.Subject(c), Data: []byte(`{"type":"session"}`)}
		})
	})
	r.convHot, r.convSettled = hot/float64(convs), settled/float64(convs)

	hot, settled = measure("heads", settle, func(js jetstream.JetStream) error {
		head := []byte(strings.Repeat("h", 480)) // a head's JSON is 400 to 550 bytes
		return publishAll(ctx, js, convs, func(i int) *nats.Msg {
			c, _ := mirror.NewConv(o, fmt.Sprintf("0192f0a4-%04x-7000-8000-%012x", i>>16, i))
			return &nats.Msg{Subject: "$KV." + names.HeadsBucket() + "." + c.HeadKey(), Data: head}
		})
	})
	r.headHot, r.headSettled = hot/float64(convs), settled/float64(convs)

	// Message ids: the same messages with and without ids, on one subject; the difference
	// is the duplicate window's index.
	c, _ := mirror.NewConv(o, "0192f0a4-0000-7000-8000-000000000001")
	without, _ := measure("messages without ids", 0, func(js jetstream.JetStream) error {
		return publishAll(ctx, js, ids, func(i int) *nats.Msg {
			return &nats.Msg{Subject: names.Subject(c), Data: []byte(`{}`)}
		})
	})
	with, _ := measure("messages with ids", 0, func(js jetstream.JetStream) error {
		return publishAll(ctx, js, ids, func(i int) *nats.Msg {
			m := &nats.Msg{Subject: names.Subject(c), Header: nats.Header{}, Data: []byte(`{}`)}
			m.Header.Set(nats.MsgIdHdr, c.MsgID(1, fmt.Sprintf("%08x", i)))
			return m
		})
	})
	r.idBytes = (with - without) / float64(ids)

	r.diskPerEntry, r.payloadPerEntry, r.storedPerEntry = diskCost(tb, entries)
	return r
}

// diskCost stores Pi-shaped entries with pisync's headers (100 conversations, log-uniform
// line sizes as in the back-fill workload, no blobs) and returns the bytes the store
// directory holds per entry, the average line, and the stream's own bytes per message.
func diskCost(tb testing.TB, entries int) (disk, payload, stored float64) {
	ctx := context.Background()
	names := mirror.DefaultNames()
	o := owner(tb)
	srv := natstest.Run(tb)
	defer func() { srv.Stop(); os.RemoveAll(srv.StoreDir()) }()
	nc := natstest.Connect(tb, srv.URL())
	defer nc.Close()
	js := jsOf(tb, nc)
	if err := mirror.Provision(ctx, js, names, mirror.Config{}); err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	var lineBytes int64
	err := publishAll(ctx, js, entries, func(i int) *nats.Msg {
		conv := i % 100
		c, _ := mirror.NewConv(o, fmt.Sprintf("0192f0a4-0000-7000-8000-%012x", conv))
		n := 0
		for n == 0 || n > 64<<10 {
			n, _ = lineSize(rng)
		}
		body := []byte(`{"type":"message","id":"` + fmt.Sprintf("%08x", i) + `","parentId":"` + fmt.Sprintf("%08x", i-1) +
			`","timestamp":"2026-11-01T09:00:00.000Z","message":{"role":"user","content":"` + strings.Repeat("x", max(n-140, 1)) + `"}}`)
		lineBytes += int64(len(body))
		l := mirror.Line{Kind: mirror.KindEntry, EntryID: fmt.Sprintf("%08x", i), ParentID: fmt.Sprintf("%08x", i-1),
			EntryType: "message", Ordinal: int64(i/100 + 1), Generation: 1, SHA256: strings.Repeat("ab", 32),
			Format: "v3", Host: "host-0042.example.com", Source: "--home-alice-src-project--/2026-11-01T09-00-00-000Z_0192f0a4-0000-7000-8000-000000000000.jsonl"}
		return names.NewMsg(c, l, body)
	})
	if err != nil {
		tb.Fatal(err)
	}
	s, err := js.Stream(ctx, names.Stream())
	if err != nil {
		tb.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if info.State.Msgs != uint64(entries) {
		tb.Fatalf("stream holds %d messages, want %d", info.State.Msgs, entries)
	}
	nc.Close()
	srv.Stop() // flushes the blocks and writes the index
	var onDisk int64
	streamDir := filepath.Join(srv.StoreDir(), "jetstream")
	filepath.WalkDir(streamDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(p, names.Stream()) {
			if fi, err := d.Info(); err == nil {
				onDisk += fi.Size()
			}
		}
		return nil
	})
	if onDisk == 0 {
		tb.Fatalf("no store files of %s under %s", names.Stream(), streamDir)
	}
	n := float64(entries)
	return float64(onDisk) / n, float64(lineBytes) / n, float64(info.State.Bytes) / n
}

// publishAll publishes n messages asynchronously, at most 1,024 in flight, and waits for
// every acknowledgement.
func publishAll(ctx context.Context, js jetstream.JetStream, n int, msg func(i int) *nats.Msg) error {
	const window = 1024
	futs := make(chan jetstream.PubAckFuture, window)
	errc := make(chan error, 1)
	go func() {
		var first error
		for f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				if first == nil {
					first = fmt.Errorf("message %s: %w", f.Msg().Subject, err)
				}
			case <-time.After(30 * time.Second):
				if first == nil {
					first = fmt.Errorf("no acknowledgement within 30s")
				}
			}
		}
		errc <- first
	}()
	var err error
	for i := 0; i < n && err == nil; i++ {
		var f jetstream.PubAckFuture
		if f, err = js.PublishMsgAsync(msg(i)); err == nil {
			futs <- f
		}
	}
	close(futs)
	if ackErr := <-errc; err == nil {
		err = ackErr
	}
	return err
}

// liveHeap is the heap still reachable after two collections.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
