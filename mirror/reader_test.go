package mirror_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// TestCountsPages: an owner with more conversations than one stream info response lists
// (the server pages subject details by 100,000) gets every one of them, so that
// recover --all and status see all of an owner's conversations.
func TestCountsPages(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 100,000 messages (about 6 s, 20 s with -race)")
	}
	const n = 100_000 + 123
	tm := mirrortest.New(t)
	ctx := mirrortest.Ctx(t)
	// Plain publishes, which the stream stores as well: acknowledging each would make the
	// test ten times slower under the race detector.
	nc := tm.JS.Conn()
	for i := range n {
		c, err := mirror.NewConv(tm.Owner, fmt.Sprintf("c%06d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(tm.Names.Subject(c), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	stream, err := tm.JS.Stream(ctx, tm.Names.Stream())
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs >= n {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the stream holds %d messages, want %d", info.State.Msgs, n)
		case <-time.After(50 * time.Millisecond):
		}
	}
	counts, err := tm.Reader.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) != n {
		t.Fatalf("%d conversations counted, want %d", len(counts), n)
	}
	for _, k := range []string{"c000000", fmt.Sprintf("c%06d", n-1)} {
		if counts[k] != 1 {
			t.Errorf("%s: %d messages, want 1", k, counts[k])
		}
	}
}

// TestListHeadsWhileHeadsAreWritten: a listing taken while daemons write heads has every
// key the bucket holds throughout, once, and none deleted before it. The watch's
// end-of-values marker alone came before a key rewritten during the watch in about one
// listing in twenty (recover --all, verify and the store's list then missed it).
func TestListHeadsWhileHeadsAreWritten(t *testing.T) {
	tm := mirrortest.New(t)
	ctx := mirrortest.Ctx(t)
	kv, err := tm.JS.KeyValue(ctx, tm.Names.HeadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	var convs []mirror.Conv
	for i := range 5 {
		c, err := mirror.NewConv(tm.Owner, fmt.Sprintf("c%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := tm.Writer.PutHead(ctx, c, mirror.Head{Conversation: c.Key, Generation: 1, Source: c.Key + ".jsonl"}); err != nil {
			t.Fatal(err)
		}
		convs = append(convs, c)
	}
	if err := kv.Delete(ctx, convs[4].HeadKey()); err != nil {
		t.Fatal(err)
	}
	want := []string{"c0", "c1", "c2", "c3"}

	writing, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // rewrites c0, c1 and c2 with the values they have, as a daemon's update does
		defer close(done)
		for i := 0; writing.Err() == nil; i++ {
			key := convs[i%3].HeadKey()
			if e, err := kv.Get(writing, key); err == nil {
				_, _ = kv.Update(writing, key, e.Value(), e.Revision())
			}
		}
	}()
	defer func() { stop(); <-done }()
	for i := range 500 {
		list, err := tm.Reader.ListHeads(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, h := range list.Heads {
			got = append(got, h.Conversation)
		}
		if !slices.Equal(got, want) || len(list.Bad) > 0 {
			t.Fatalf("listing %d: heads of %v (bad %v), want %v", i, got, list.Bad, want)
		}
	}
}
