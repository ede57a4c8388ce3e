package store_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/store"
)

// publishWithoutHead stores an entry as a replica does right before it dies: published
// and acknowledged, its head never written.
func (e *env) publishWithoutHead(owner, id, entryID, parent string, ordinal int64) {
	e.t.Helper()
	before := e.kvHead(owner, id)
	o, _ := mirror.NewOwner("t1", owner)
	c, _ := mirror.NewConv(o, id)
	line := entryLine(entryID, parent, "acknowledged, head never written")
	sum := sha256.Sum256([]byte(line))
	l := mirror.Line{Kind: mirror.KindEntry, EntryID: entryID, ParentID: parent, EntryType: "message", Ordinal: ordinal,
		Generation: 1, SHA256: hex.EncodeToString(sum[:]), Format: "v3", Host: "pisync-store", Source: before.Source}
	if _, err := e.js.PublishMsg(ctxFor(e.t), e.names.NewMsg(c, l, []byte(line))); err != nil {
		e.t.Fatal(err)
	}
}

// TestListAfterReplicaDiedBeforeHead: list shows what the stream holds, not a head left
// behind by a replica killed between its acknowledgement and its head update; the head is
// then repaired, and counted as one repair.
func TestListAfterReplicaDiedBeforeHead(t *testing.T) {
	m := store.NewMetrics(nil)
	e := newEnv(t, 1, store.Options{Metrics: m, HeadRepairGrace: time.Nanosecond})
	e.create("alice", "conv1")
	e.mustAppend("alice", "conv1", "", entryLine("a1b2c3d4", "", "x"))
	e.publishWithoutHead("alice", "conv1", "b2c3d4e5", "a1b2c3d4", 2)
	l := e.req("alice", "list", map[string]any{})
	if !l.OK || len(l.Sessions) != 1 {
		t.Fatalf("list: %+v", l)
	}
	if s := l.Sessions[0]; s.Entries != 2 || s.Head == nil || *s.Head != "b2c3d4e5" {
		t.Fatalf("list after the replica died: %d entries, head %v; want 2 and b2c3d4e5", s.Entries, s.Head)
	}
	if h := e.kvHeadNow("alice", "conv1"); h.Head != "b2c3d4e5" {
		t.Fatalf("head not repaired: %+v", h)
	}
	if n := testutil.ToFloat64(m.Repairs()); n != 1 {
		t.Fatalf("pisync_store_head_repairs_total %v, want 1", n)
	}
}

// TestNoRepairWithoutCrash: opens and lists on one replica while another appends (its
// heads written after its replies) repair nothing: pisync_store_head_repairs_total counts
// heads left behind by a replica that stopped, and no replica stopped here.
func TestNoRepairWithoutCrash(t *testing.T) {
	m := store.NewMetrics(nil)
	e := newEnv(t, 2, store.Options{Metrics: m})
	e.create("alice", "conv1")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				e.req("alice", "open", map[string]any{"id": "conv1"})
				e.req("alice", "list", map[string]any{})
			}
		}()
	}
	head := ""
	for i := 0; i < 300; i++ {
		id := fmt.Sprintf("e%07d", i)
		e.mustAppend("alice", "conv1", head, entryLine(id, head, "x"))
		head = id
	}
	close(stop)
	wg.Wait()
	if n := testutil.ToFloat64(m.Repairs()); n != 0 {
		t.Fatalf("pisync_store_head_repairs_total %v without any replica stopping, want 0", n)
	}
}
