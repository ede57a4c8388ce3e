package store_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/store"
)

// TestOpenReadsWhatTheLeaderAcknowledged (torture T9's cluster reads, in the store): a
// replica that has served a conversation opens it again right after a node of the R3
// cluster came back, while another replica appended to it with that node down. Every
// open must return every entry the leader acknowledged, whichever replica answers the
// replica's reads. Its direct gets enter the cluster at the node it is connected to,
// whose replica answers them first: the restarted one here, behind its leader.
func TestOpenReadsWhatTheLeaderAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	cluster := natstest.RunCluster(t, 3)
	ctx := ctxFor(t)
	js, err := jetstream.New(natstest.Connect(t, cluster.URLs()))
	if err != nil {
		t.Fatal(err)
	}
	names := mirror.DefaultNames()
	mirrortest.Provision(t, ctx, js, names, mirror.Config{Replicas: 3})
	mirrortest.FillStream(t, ctx, js, names, 20_000)
	o, err := mirror.NewOwner("t1", "alice")
	if err != nil {
		t.Fatal(err)
	}
	const appended = 1000 // below a tenth of the stream: the restarted node serves direct gets
	for round := range 3 {
		follower := cluster.StreamFollower(names.Stream(), 30*time.Second)
		var up []string // the nodes that stay up
		for _, n := range cluster.Nodes {
			if n != follower {
				up = append(up, n.URL())
			}
		}
		e := &env{t: t, client: natstest.Connect(t, strings.Join(up, ",")), names: names}
		// The replica serving the opens talks to the follower alone, and comes back with it.
		rnc, err := nats.Connect(follower.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond),
			nats.IgnoreDiscoveredServers())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rnc.Close)
		svc := serveOn(t, rnc, names)
		// The other replica appends in process, serving nothing: every open goes to the first.
		writer := newStoreOn(t, natstest.Connect(t, strings.Join(up, ",")), names)

		id := fmt.Sprintf("conv%d", round)
		if _, _, ce := writer.Create(ctx, o, []byte(headerLine(id, "/srv/app"))); ce != nil {
			t.Fatalf("create %s: %v", id, ce)
		}
		head, want := "", []string(nil)
		appendN := func(n int) {
			for i := range n {
				eid := fmt.Sprintf("r%dx%06d", round, len(want))
				l := entryLine(eid, head, fmt.Sprintf("entry %d of round %d", i, round))
				// "unavailable" asks the client to retry (the protocol's contract): with a
				// node just stopped, JetStream may not answer within an append's passes.
				_, ae := writer.Append(ctx, o, id, head, []byte(l))
				for retry := 0; ae != nil && ae.Code == store.CodeUnavailable && retry < 5; retry++ {
					_, ae = writer.Append(ctx, o, id, head, []byte(l))
				}
				if ae != nil {
					t.Fatalf("append %d to %s: %v", len(want), id, ae)
				}
				head, want = eid, append(want, l)
			}
		}
		appendN(3)
		if r, got := e.openAll("alice", id); !r.OK || len(got) != len(want) {
			t.Fatalf("round %d: first open read %d of %d entries: %+v", round, len(got), len(want), r.Error)
		}

		follower.Stop()
		appendN(appended)
		follower.Start()
		waitAnswering(t, e)
		for open, until := 0, time.Now().Add(3*time.Second); time.Now().Before(until); open++ {
			r, got := e.openAll("alice", id)
			if !r.OK {
				t.Fatalf("round %d, open %d: %+v", round, open, r.Error)
			}
			if len(got) != len(want) || got[len(got)-1] != want[len(want)-1] {
				t.Fatalf("round %d, open %d: read %d of the %d acknowledged entries", round, open, len(got), len(want))
			}
		}
		if err := svc.Stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// newStoreOn is a Store on its own connection.
func newStoreOn(t *testing.T, nc *nats.Conn, names mirror.Names) *store.Store {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.New(ctxFor(t), js, names, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serveOn serves a new Store on nc until the test ends.
func serveOn(t *testing.T, nc *nats.Conn, names mirror.Names) *store.Service {
	t.Helper()
	svc, err := newStoreOn(t, nc, names).Serve(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	return svc
}

// waitAnswering waits until the store, whose connection is coming back, answers the
// client again: a request before finds no responders.
func waitAnswering(t *testing.T, e *env) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := e.client.Request("$SRV.PING."+store.ServiceName, nil, time.Second)
		if err == nil {
			return
		}
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) || time.Now().After(deadline) {
			t.Fatalf("the store does not answer again: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// TestAppendAfterRecreatedWithAsManyMessages: a replica's state is checked against the
// leader's count of the conversation's messages. Deleted and created again elsewhere with
// exactly as many, it looks current to the count; the first append on it is refused on
// its expected sequence, and the replica must then read it again, not retry on its old
// state until it gives up.
func TestAppendAfterRecreatedWithAsManyMessages(t *testing.T) {
	e := newEnv(t, 0, store.Options{})
	ctx := ctxFor(t)
	o, _ := mirror.NewOwner("t1", "alice")
	a := newStoreOn(t, natstest.Connect(t, e.srv.URL()), e.names)
	b := newStoreOn(t, natstest.Connect(t, e.srv.URL()), e.names)
	fill := func(s *store.Store, prefix string) string {
		t.Helper()
		if _, _, ce := s.Create(ctx, o, []byte(headerLine("conv1", "/srv/app"))); ce != nil {
			t.Fatalf("create: %v", ce)
		}
		head := ""
		for i := range 3 {
			id := fmt.Sprintf("%s%07d", prefix, i)
			if _, ae := s.Append(ctx, o, "conv1", head, []byte(entryLine(id, head, "x"))); ae != nil {
				t.Fatalf("append %s: %v", id, ae)
			}
			head = id
		}
		return head
	}
	oldHead := fill(a, "a")
	if de := b.Delete(ctx, o, "conv1"); de != nil {
		t.Fatalf("delete: %v", de)
	}
	newHead := fill(b, "b")
	_, ae := a.Append(ctx, o, "conv1", oldHead, []byte(entryLine("c0000000", oldHead, "y")))
	if ae == nil || ae.Code != store.CodeConflict {
		t.Fatalf("append on the old head: %v, want a conflict naming head %s", ae, newHead)
	}
}
