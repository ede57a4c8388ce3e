package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/mirror"
)

// owner is a tenant user of the account files, connected with its private inbox prefix.
type owner struct {
	user   string
	nc     *nats.Conn
	js     jetstream.JetStream
	v      *violations
	owner  mirror.Owner
	conv   mirror.Conv
	blob   []byte
	seq    uint64 // stream sequence of the owner's line
	names  mirror.Names
	prefix string // inbox prefix
	url    string // the server it is connected to, and its CA
	caFile string
}

func newOwner(t *testing.T, url, caFile, user, tenant, name string) *owner {
	t.Helper()
	o := &owner{user: user, names: mirror.DefaultNames(), prefix: "_INBOX." + tenant + "." + name, url: url, caFile: caFile}
	o.nc, o.v = connect(t, url, caFile, user, nats.CustomInboxPrefix(o.prefix))
	var err error
	if o.js, err = jetstream.New(o.nc); err != nil {
		t.Fatal(err)
	}
	if o.owner, err = mirror.NewOwner(tenant, name); err != nil {
		t.Fatal(err)
	}
	if o.conv, err = mirror.NewConv(o.owner, "conv-of-"+name); err != nil {
		t.Fatal(err)
	}
	o.blob = bytes.Repeat([]byte("blob-of-"+name+"|"), (600<<10)/len("blob-of-"+name+"|"))
	return o
}

// useOwnData does with the owner's own data everything pisync does (publish a line, put
// a blob and a head, read them back through pisync's mirror package) and checks that the
// server refused nothing: the permissions are enough for the daemon and for recover,
// status and verify.
func (o *owner) useOwnData(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	line := fmt.Appendf(nil, `{"type":"session","version":3,"id":%q,"timestamp":"2025-01-01T00:00:00Z","cwd":"/w"}`, o.conv.Key)
	ack, err := o.js.PublishMsg(ctx, o.names.NewMsg(o.conv, mirror.Line{Kind: mirror.KindHeader,
		EntryID: mirror.HeaderEntryType, EntryType: mirror.HeaderEntryType, Generation: 1,
		SHA256: sha(line), Format: "v3", Host: "test", Source: "s.jsonl"}, line))
	if err != nil {
		t.Fatalf("%s: publish own line: %v", o.user, err)
	}
	o.seq = ack.Sequence
	w, err := mirror.NewWriter(ctx, o.js, o.names, o.owner)
	if err != nil {
		t.Fatalf("%s: %v", o.user, err)
	}
	if up, err := w.PutBlob(ctx, sha(o.blob), bytes.NewReader(o.blob)); err != nil || !up {
		t.Fatalf("%s: put own blob: uploaded %v, %v", o.user, up, err)
	}
	if up, err := w.PutBlob(ctx, sha(o.blob), bytes.NewReader(o.blob)); err != nil || up {
		t.Fatalf("%s: put own blob again: uploaded %v, %v", o.user, up, err)
	}
	head := mirror.Head{Conversation: o.conv.Key, Key: o.conv.Key, Tenant: o.owner.Tenant, Owner: o.owner.Name,
		Generation: 1, Entries: 1, LastSeq: ack.Sequence, Bytes: int64(len(line) + 1), UpdatedAt: time.Now().UTC()}
	if err := w.PutHead(ctx, o.conv, head); err != nil {
		t.Fatalf("%s: put own head: %v", o.user, err)
	}
	r, err := mirror.NewReader(ctx, o.js, o.names, o.owner)
	if err != nil {
		t.Fatalf("%s: %v", o.user, err)
	}
	if last, err := r.LastSeq(ctx, o.conv); err != nil || last != ack.Sequence {
		t.Fatalf("%s: last sequence %d, %v; want %d", o.user, last, err, ack.Sequence)
	}
	g, err := r.ReadGeneration(ctx, o.conv, 0)
	if err != nil || len(g.Msgs) != 1 || !bytes.Equal(g.Msgs[0].Data, line) {
		t.Fatalf("%s: read own conversation: %+v, %v", o.user, g, err)
	}
	if h, _, err := r.Head(ctx, o.conv); err != nil || h.LastSeq != ack.Sequence {
		t.Fatalf("%s: own head %+v, %v", o.user, h, err)
	}
	heads, err := r.Heads(ctx)
	if err != nil || len(heads) != 1 {
		t.Fatalf("%s: %d own heads, %v", o.user, len(heads), err)
	}
	rc, err := r.Blob(ctx, sha(o.blob))
	if err != nil {
		t.Fatalf("%s: own blob: %v", o.user, err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, o.blob) {
		t.Fatalf("%s: own blob read back: %d bytes, %v", o.user, len(got), err)
	}
	if v := o.v.settled(t, o.nc); len(v) > 0 {
		t.Fatalf("%s: the server refused part of pisync's own work: %q", o.user, v)
	}
}

// TestNATSPermissions starts a server from node-a.conf with each account layout and
// checks, as a tenant user, that pisync's own work is allowed and that reaching another
// tenant's data is refused by the server, through the API forms DESIGN §3.7 names.
func TestNATSPermissions(t *testing.T) {
	for _, l := range []layout{perTenant, shared} {
		t.Run(string(l), func(t *testing.T) { testPermissions(t, l) })
	}
}

// startLayout starts node-a.conf on loopback (one node) with the accounts layout l, has
// the admin user(s) provision pisync's objects, and connects acme/alice and globex/bob,
// each having done everything pisync does with its own data.
func startLayout(t *testing.T, l layout) (alice, bob *owner) {
	t.Helper()
	setPasswords(t)
	pki := newPKI(t)
	caFile := pki.caFile(t)
	root := t.TempDir()
	pki.issue(t, filepath.Join(root, "tls"), "node-a")
	renderNATS(t, filepath.Join(root, "conf"), filepath.Join(root, "tls"), filepath.Join(root, "jetstream"), l)
	opts := loadOptions(t, filepath.Join(root, "conf", "node-a.conf"))
	url := onLoopback(t, opts)
	opts.Cluster, opts.Routes = server.ClusterOpts{}, nil // one node is enough here
	startServer(t, opts)

	admins := []string{"pisync-admin"}
	if l == perTenant {
		admins = []string{"acme-admin", "globex-admin"}
	}
	for _, admin := range admins {
		nc, _ := connect(t, url, caFile, admin)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := mirror.Provision(ctx, js, mirror.DefaultNames(), mirror.Config{Replicas: 1}); err != nil {
			t.Fatalf("provision as %s: %v", admin, err)
		}
		cancel()
		nc.Close()
	}

	alice = newOwner(t, url, caFile, "acme-alice", "acme", "alice")
	bob = newOwner(t, url, caFile, "globex-bob", "globex", "bob")
	alice.useOwnData(t)
	bob.useOwnData(t)
	return alice, bob
}

func testPermissions(t *testing.T, l layout) {
	alice, bob := startLayout(t, l)

	names := alice.names
	stream := names.Stream()
	bobSubj := names.Subject(bob.conv)
	bobKey := bob.conv.HeadKey()
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 500*time.Millisecond)
	}
	request := func(subj, body string) error {
		_, err := alice.nc.Request(subj, []byte(body), 300*time.Millisecond)
		return err
	}
	exactly := func(s string) func(string) bool { return func(got string) bool { return got == s } }
	refused := func(what string, err error, op string, match func(string) bool) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: succeeded", what)
		}
		alice.v.expect(t, op, what, match)
	}

	// Publishing under another tenant.
	ctx, cancel := short()
	_, err := alice.js.PublishMsg(ctx, names.NewMsg(bob.conv, mirror.Line{Kind: mirror.KindEntry, EntryID: "deadbeef",
		Ordinal: 1, Generation: 1, SHA256: sha([]byte("{}")), Format: "v3"}, []byte("{}")))
	cancel()
	refused("publish under globex/bob", err, "Publish", exactly(bobSubj))

	// Consumers on another tenant's subjects: the subject-bearing form, the filter in the
	// body (no subject in the API subject), and every owner at once.
	ctx, cancel = short()
	_, err = alice.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{FilterSubject: bobSubj, AckPolicy: jetstream.AckNonePolicy})
	cancel()
	refused("consumer on globex/bob's subject", err, "Publish", func(s string) bool {
		return strings.HasPrefix(s, "$JS.API.CONSUMER.CREATE."+stream+".") && strings.HasSuffix(s, "."+bobSubj)
	})
	ctx, cancel = short()
	_, err = alice.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Name: "peek", FilterSubjects: []string{bobSubj}, AckPolicy: jetstream.AckNonePolicy})
	cancel()
	refused("consumer with the filter in the body", err, "Publish", exactly("$JS.API.CONSUMER.CREATE."+stream+".peek"))
	ctx, cancel = short()
	_, err = alice.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Name: "all", FilterSubject: names.StreamSubjects(), AckPolicy: jetstream.AckNonePolicy})
	cancel()
	refused("consumer on every subject", err, "Publish", exactly("$JS.API.CONSUMER.CREATE."+stream+".all."+names.StreamSubjects()))

	// Direct get of another tenant's subject, and the two forms that carry the subject in
	// the request body.
	refused("direct get of globex/bob's subject", request("$JS.API.DIRECT.GET."+stream+"."+bobSubj, ""),
		"Publish", exactly("$JS.API.DIRECT.GET."+stream+"."+bobSubj))
	body := fmt.Sprintf(`{"last_by_subj":%q}`, bobSubj)
	refused("batched direct get", request("$JS.API.DIRECT.GET."+stream, body), "Publish", exactly("$JS.API.DIRECT.GET."+stream))
	refused("STREAM.MSG.GET", request("$JS.API.STREAM.MSG.GET."+stream, body), "Publish", exactly("$JS.API.STREAM.MSG.GET."+stream))

	// Another tenant's head: read, overwrite, list.
	kv, err := alice.js.KeyValue(context.Background(), names.HeadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = short()
	_, err = kv.Get(ctx, bobKey)
	cancel()
	refused("read globex/bob's head", err, "Publish", exactly("$JS.API.DIRECT.GET.KV_"+names.HeadsBucket()+".$KV."+names.HeadsBucket()+"."+bobKey))
	ctx, cancel = short()
	_, err = kv.Put(ctx, bobKey, []byte(`{}`))
	cancel()
	refused("overwrite globex/bob's head", err, "Publish", exactly("$KV."+names.HeadsBucket()+"."+bobKey))
	refused("list every head", request("$JS.API.CONSUMER.CREATE.KV_"+names.HeadsBucket()+".keys.$KV."+names.HeadsBucket()+".>", "{}"),
		"Publish", exactly("$JS.API.CONSUMER.CREATE.KV_"+names.HeadsBucket()+".keys.$KV."+names.HeadsBucket()+".>"))

	// Listening in: another owner's inbox, or the live lines of the stream.
	for _, subj := range []string{bob.prefix + ".>", "_INBOX.>", names.StreamSubjects()} {
		sub, err := alice.nc.SubscribeSync(subj)
		if err == nil {
			err = alice.nc.Flush()
		}
		alice.v.expect(t, "Subscription", "subscribe to "+subj, exactly(subj))
		if sub != nil {
			_ = sub.Unsubscribe()
		}
	}

	// Stream administration.
	for _, api := range []string{"STREAM.UPDATE.", "STREAM.DELETE.", "STREAM.PURGE.", "CONSUMER.LIST.", "CONSUMER.NAMES."} {
		subj := "$JS.API." + api + stream
		refused(subj, request(subj, "{}"), "Publish", exactly(subj))
	}

	// Bob's data is as he left it.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := mirror.NewReader(ctx, bob.js, bob.names, bob.owner)
	if err != nil {
		t.Fatal(err)
	}
	if last, err := r.LastSeq(ctx, bob.conv); err != nil || last != bob.seq {
		t.Errorf("globex/bob's conversation: last sequence %d, %v; want %d", last, err, bob.seq)
	}

	t.Run("blob chunks", func(t *testing.T) { blobLimit(t, l, alice, bob) })
}

// blobLimit pins the documented limit of object-store permissions: chunk subjects carry a
// random id, so a user allowed to read its own chunks can open a consumer on every chunk
// of the account. In the shared layout that includes other tenants' blobs (which is why
// README.md recommends an account per tenant); in the per-tenant layout it does not.
func blobLimit(t *testing.T, l layout, alice, bob *owner) {
	// The same kind of consumer the object store's Get uses: ordered, pushed to the inbox.
	ljs, err := alice.nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	chunks := "$O." + alice.names.BlobsBucket() + ".C.*"
	sub, err := ljs.SubscribeSync(chunks, nats.OrderedConsumer(), nats.BindStream("OBJ_"+alice.names.BlobsBucket()))
	if err != nil {
		t.Fatalf("consumer on %s: %v", chunks, err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort: the server drops it anyway
	var sawOwn, sawOther bool
	for {
		m, err := sub.NextMsg(time.Second)
		if errors.Is(err, nats.ErrTimeout) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		sawOwn = sawOwn || bytes.Contains(m.Data, []byte("blob-of-alice|"))
		sawOther = sawOther || bytes.Contains(m.Data, []byte("blob-of-"+bob.owner.Name+"|"))
	}
	if !sawOwn {
		t.Fatalf("the consumer on %s did not deliver alice's own chunks", chunks)
	}
	switch {
	case l == perTenant && sawOther:
		t.Errorf("per-tenant layout: acme/alice read globex/bob's blob chunks")
	case l == shared && !sawOther:
		t.Errorf("shared layout: acme/alice could not read globex/bob's chunks; if the permissions now fence blobs, update README.md (Limits) and this test")
	}
}
