package mirror_test

import (
	"fmt"
	"testing"

	"github.com/pisync/pisync/internal/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// TestCountsPages: an owner with more conversations than one stream info response lists
// (the server pages subject details by 100,000) gets every one of them, so that
// recover --all and status see all of an owner's conversations.
func TestCountsPages(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 100,000 messages")
	}
	const n = 100_000 + 123
	tm := mirrortest.New(t)
	ctx := mirrortest.Ctx(t)
	for i := range n {
		c, err := mirror.NewConv(tm.Owner, fmt.Sprintf("c%06d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tm.JS.PublishAsync(tm.Names.Subject(c), nil); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-tm.JS.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal(ctx.Err())
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
