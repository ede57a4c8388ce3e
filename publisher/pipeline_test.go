package publisher

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// TestBackfillPipelinedLiveOneAtATime pins what the one-writer rule (onewriter.go) costs.
// The lines a file held when it was opened are pipelined even after its queue drained
// once: sent one at a time, a back-fill took twice the CPU and half the speed of raw
// publishing (bench/RESULTS.md, CPU per line). Lines appended since the file was opened
// wait for the acknowledgement of the one before them, so that each is fenced on it.
// Acknowledgements are held back by a proxy: what the server stores meanwhile is what
// the publisher sent without waiting.
func TestBackfillPipelinedLiveOneAtATime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	proxy := natstest.NewProxy(t, srv.Addr())
	p := publisherAt(t, ctx, proxy.URL())

	root := t.TempDir()
	sf := sessiontest.New(rand.New(rand.NewPCG(7, 7)), root, "/home/dev/p", sessiontest.CLIV3)
	const backfill = 20
	lines := [][]byte{sf.HeaderLine("/home/dev/p")}
	for range backfill {
		lines = append(lines, sf.Message(300))
	}
	if err := sf.Append(lines...); err != nil {
		t.Fatal(err)
	}
	f, fd := openForLines(t, ctx, p, root, sf.Path, lines[0])
	off, ord := int64(0), int64(0)
	deliver := func(l []byte) {
		t.Helper()
		if err := p.Line(ctx, f, watcher.Line{Ordinal: ord, Offset: off, Len: int64(len(l)), Data: l, Seen: time.Now(), Src: fd}); err != nil {
			t.Fatalf("line %d: %v", ord, err)
		}
		off += int64(len(l)) + 1
		ord++
	}

	js, err := jetstream.New(natstest.Connect(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, mirror.DefaultNames().Stream())
	if err != nil {
		t.Fatal(err)
	}
	stored := func() uint64 {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	p.mu.Lock()
	st := p.files[f.ID]
	p.mu.Unlock()
	drained := func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.queue) == 0
	}
	waiting := func() (n int) {
		st.mu.Lock()
		defer st.mu.Unlock()
		for _, it := range st.queue {
			if it.waiting {
				n++
			}
		}
		return n
	}

	// The header and the first entry, acknowledged: the queue drains.
	deliver(lines[0])
	deliver(lines[1])
	waitUntil(t, "the first lines acknowledged", drained)

	// The rest of the back-fill while no acknowledgement comes back: all sent at once.
	proxy.Hold()
	for _, l := range lines[2:] {
		deliver(l)
	}
	waitUntil(t, "every back-filled line stored while acknowledgements are held", func() bool {
		return stored() == backfill+1
	})
	if n := waiting(); n != 0 {
		t.Fatalf("%d back-filled lines wait for the one before them, want none", n)
	}
	proxy.Release()
	waitUntil(t, "the back-fill acknowledged", drained)

	// Appends made since the file was opened: one at a time.
	var live [][]byte
	for range 5 {
		live = append(live, sf.Message(200))
	}
	if err := sf.Append(live...); err != nil {
		t.Fatal(err)
	}
	proxy.Hold()
	for _, l := range live {
		deliver(l)
	}
	waitUntil(t, "the first live line stored", func() bool { return stored() == backfill+2 })
	if n := waiting(); n != len(live)-1 {
		t.Fatalf("%d live lines wait for the one before them, want %d", n, len(live)-1)
	}
	proxy.Release()
	waitUntil(t, "every live line acknowledged", drained)
	if n := stored(); n != uint64(backfill+1+len(live)) {
		t.Fatalf("stream holds %d messages, want %d", n, backfill+1+len(live))
	}
}
