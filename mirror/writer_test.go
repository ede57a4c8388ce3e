package mirror_test

import (
	"fmt"
	"testing"

	"github.com/pisync/pisync/internal/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// TestHeadRevisionsBounded pins issue 13 item 10: the writer remembered the revision of
// every head it ever wrote, so a daemon's memory grew with every conversation it had
// seen. The memory is now bounded, and a head whose revision was forgotten is still
// updated with compare-and-set, also when another writer moved it meanwhile.
func TestHeadRevisionsBounded(t *testing.T) {
	const bound, convs = 8, 40
	tm := mirrortest.New(t)
	ctx := mirrortest.Ctx(t)
	other := mirrortest.For(t, tm.JS.Conn().ConnectedUrl(), "t1", "alice").Writer
	tm.Writer.SetMaxRevisions(bound)
	head := func(c mirror.Conv, gen int, seq uint64) mirror.Head {
		return mirror.Head{Conversation: c.Key, Key: c.Key, Tenant: "t1", Owner: "alice", Generation: gen, LastSeq: seq}
	}
	var all []mirror.Conv
	for i := range convs {
		c, err := mirror.NewConv(tm.Owner, fmt.Sprintf("conv-%02d", i))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, c)
		if err := tm.Writer.PutHead(ctx, c, head(c, 1, 10)); err != nil {
			t.Fatal(err)
		}
		if n := tm.Writer.Revisions(); n > bound {
			t.Fatalf("after %d heads the writer remembers %d revisions, bound %d", i+1, n, bound)
		}
	}
	for i, c := range all {
		if i%2 == 0 { // another writer moves the head under us
			if err := other.PutHead(ctx, c, head(c, 1, 15)); err != nil {
				t.Fatal(err)
			}
		}
		if err := tm.Writer.PutHead(ctx, c, head(c, 1, 20)); err != nil {
			t.Fatalf("%s: second update: %v", c.Key, err)
		}
		h, _, err := tm.Reader.Head(ctx, c)
		if err != nil || h.LastSeq != 20 {
			t.Fatalf("%s: head %+v, %v; want LastSeq 20", c.Key, h, err)
		}
	}
	if n := tm.Writer.Revisions(); n > bound {
		t.Errorf("the writer remembers %d revisions, bound %d", n, bound)
	}
}
