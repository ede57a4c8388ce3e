package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/store"
)

// storeUsers are the users pisync serve connects as, by layout.
var storeUsers = map[layout][]string{perTenant: {"acme-store", "globex-store"}, shared: {"pisync-store"}}

// TestNATSStorePermissions runs the session store as its users of the account files and
// checks that an owner's user can use its own store subjects, that the store's users
// can do the store's work, and that the server refuses an owner's request for another
// owner, and an owner listening on the service's subjects.
func TestNATSStorePermissions(t *testing.T) {
	for _, l := range []layout{perTenant, shared} {
		t.Run(string(l), func(t *testing.T) { testStorePermissions(t, l) })
	}
}

func testStorePermissions(t *testing.T, l layout) {
	alice, bob := startLayout(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var served []*violations
	var servedNC []*nats.Conn
	for _, user := range storeUsers[l] {
		nc, v := connect(t, alice.url, alice.caFile, user, nats.CustomInboxPrefix(store.InboxPrefix))
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		st, err := store.New(ctx, js, alice.names, store.Options{})
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		svc, err := st.Serve(nc)
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		t.Cleanup(func() { _ = svc.Stop() })
		served, servedNC = append(served, v), append(servedNC, nc)
	}
	for _, o := range []*owner{alice, bob} {
		id := "store-conv-of-" + o.owner.Name
		header := fmt.Sprintf(`{"type":"session","version":3,"id":%q,"timestamp":"2026-12-01T18:00:00.000Z","cwd":"/srv"}`, id)
		entry := `{"type":"message","id":"a1b2c3d4","parentId":null,"timestamp":"2026-12-01T18:00:01.000Z","message":{"role":"user","content":"hi"}}`
		big := fmt.Sprintf(`{"type":"custom","id":"b2c3d4e5","parentId":"a1b2c3d4","timestamp":"2026-12-01T18:00:02.000Z","customType":"x","data":%q}`, string(o.blob))
		for _, step := range []struct {
			op   string
			body any
		}{
			{"create", map[string]any{"line": header}},
			{"append", map[string]any{"id": id, "expectedHead": nil, "line": entry}},
			{"append", map[string]any{"id": id, "expectedHead": "a1b2c3d4", "line": big}}, // a blob
			{"open", map[string]any{"id": id}},
			{"list", map[string]any{}},
			{"fork", map[string]any{"source": id, "line": fmt.Sprintf(`{"type":"session","version":3,"id":"%s-fork","timestamp":"2026-12-01T18:00:00.000Z","cwd":"/srv"}`, id)}},
			{"delete", map[string]any{"id": id + "-fork"}},
		} {
			b, _ := json.Marshal(step.body)
			m, err := o.nc.Request(o.names.StoreSubject(o.owner, step.op), b, 10*time.Second)
			if err != nil {
				t.Fatalf("%s %s: %v", o.user, step.op, err)
			}
			var r struct {
				OK bool `json:"ok"`
			}
			if json.Unmarshal(m.Data, &r) != nil || !r.OK {
				t.Fatalf("%s %s: %s", o.user, step.op, m.Data)
			}
		}
	}
	for i, v := range served {
		if got := v.settled(t, servedNC[i]); len(got) > 0 {
			t.Fatalf("%s: the server refused part of the store's work: %q", storeUsers[l][i], got)
		}
	}
	if got := alice.v.settled(t, alice.nc); len(got) > 0 {
		t.Fatalf("acme-alice: the server refused part of her use of the store: %q", got)
	}

	// Another owner's store subjects, in another tenant and in her own.
	for _, subj := range []string{alice.names.StoreSubject(bob.owner, "open"), "pisync.store.acme.carol.open"} {
		_, err := alice.nc.Request(subj, []byte(`{"id":"store-conv-of-bob"}`), 300*time.Millisecond)
		if err == nil {
			t.Errorf("request on %s answered", subj)
		}
		alice.v.expect(t, "Publish", "request on "+subj, func(s string) bool { return s == subj })
	}
	// Posing as the store, to read other owners' requests.
	for _, subj := range []string{"pisync.store.acme.*.*", "pisync.store.>"} {
		sub, err := alice.nc.SubscribeSync(subj)
		if err == nil {
			err = alice.nc.Flush()
		}
		alice.v.expect(t, "Subscription", "subscribe to "+subj, func(s string) bool { return s == subj })
		if sub != nil {
			_ = sub.Unsubscribe()
		}
	}
}
