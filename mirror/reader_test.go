package mirror_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/mirrortest"
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
