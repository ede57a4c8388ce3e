package deploy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/mirror"
)

// TestIsolationRawAccess completes TestNATSPermissions with what a client library offers
// beyond the raw requests tried there, as acme/alice against globex/bob, in each layout:
// a stream get by sequence; listing, watching, reading the history of, deleting and
// purging bob's heads; listing the object store and reading or deleting bob's object;
// and what the stream's metadata shows. The server refuses each, or (layout b) bob's
// data is simply not in alice's account; the limits README.md documents for layout (a)
// are pinned, so that a change to them shows.
func TestIsolationRawAccess(t *testing.T) {
	for _, l := range []layout{perTenant, shared} {
		t.Run(string(l), func(t *testing.T) { testRawAccess(t, l) })
	}
}

func testRawAccess(t *testing.T, l layout) {
	alice, bob := startLayout(t, l)
	names := alice.names
	stream := names.Stream()
	bobKey := bob.conv.HeadKey()
	bobObject := bob.owner.ObjectName(sha(bob.blob))
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 500*time.Millisecond)
	}
	prefixed := func(prefix, suffix string) func(string) bool {
		return func(s string) bool { return strings.HasPrefix(s, prefix) && strings.HasSuffix(s, suffix) }
	}
	refused := func(what string, err error, match func(string) bool) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: succeeded", what)
		}
		alice.v.expect(t, "Publish", what, match)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A message by sequence: the sequence travels in the request body.
	s, err := alice.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	c, done := short()
	_, err = s.GetMsg(c, bob.seq)
	done()
	refused("stream get of globex/bob's sequence", err, func(s string) bool {
		return s == "$JS.API.DIRECT.GET."+stream || s == "$JS.API.STREAM.MSG.GET."+stream
	})

	// Stream metadata: STREAM.INFO with a subject filter lists subjects and counts.
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	_, bobListed := info.State.Subjects[names.Subject(bob.conv)]
	switch {
	case l == perTenant && bobListed:
		t.Errorf("per-tenant layout: acme/alice's stream info lists globex/bob's subject")
	case l == shared && !bobListed:
		t.Errorf("shared layout: stream info no longer lists other owners' subjects; update README.md (Limits) and this test")
	}

	// Heads: bob's keys listed, watched, their history read, deleted, purged.
	kv, err := alice.js.KeyValue(ctx, names.HeadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	heads := "$JS.API.CONSUMER.CREATE.KV_" + names.HeadsBucket() + "."
	c, done = short()
	_, err = kv.ListKeysFiltered(c, bob.owner.KeyPrefix()+"*")
	done()
	refused("list globex/bob's heads", err, prefixed(heads, ".$KV."+names.HeadsBucket()+"."+bob.owner.KeyPrefix()+"*"))
	c, done = short()
	_, err = kv.Keys(c)
	done()
	refused("list every head", err, prefixed(heads, ".$KV."+names.HeadsBucket()+".>"))
	c, done = short()
	_, err = kv.History(c, bobKey)
	done()
	refused("history of globex/bob's head", err, prefixed(heads, ".$KV."+names.HeadsBucket()+"."+bobKey))
	c, done = short()
	w, err := kv.Watch(c, bob.owner.KeyPrefix()+">")
	if err == nil {
		// The watcher is created before the server answers; its updates never come.
		select {
		case e, ok := <-w.Updates():
			if ok && e != nil {
				err = nil
				t.Errorf("watching globex/bob's heads delivered %q", e.Key())
			} else {
				err = errors.New("no update")
			}
		case <-c.Done():
			err = c.Err()
		}
		_ = w.Stop()
	}
	done()
	refused("watch globex/bob's heads", err, prefixed(heads, ".$KV."+names.HeadsBucket()+"."+bob.owner.KeyPrefix()+">"))
	for what, op := range map[string]func(context.Context, string, ...jetstream.KVDeleteOpt) error{
		"delete globex/bob's head": kv.Delete, "purge globex/bob's head": kv.Purge,
	} {
		c, done = short()
		err = op(c, bobKey)
		done()
		refused(what, err, func(s string) bool { return s == "$KV."+names.HeadsBucket()+"."+bobKey })
	}

	// Objects: listing the store and watching it need a consumer on every metadata subject.
	obj, err := alice.js.ObjectStore(ctx, names.BlobsBucket())
	if err != nil {
		t.Fatal(err)
	}
	c, done = short()
	_, err = obj.List(c)
	done()
	refused("list the object store", err, prefixed("$JS.API.CONSUMER.CREATE.OBJ_"+names.BlobsBucket()+".", ".$O."+names.BlobsBucket()+".M.>"))

	// bob's object by name: in layout (b) it is not in alice's account at all; in (a)
	// metadata subjects cannot be fenced (README.md, Limits): alice reads it, and can
	// even mark it deleted, which bob's recovery then reports as a missing blob. Both
	// answers come back (not found, or the object): the whole deadline, not short's,
	// which a loaded machine overran (a timeout is no answer in either layout).
	res, err := obj.Get(ctx, bobObject)
	var got []byte
	if err == nil {
		got, err = io.ReadAll(res)
		res.Close()
	}
	switch {
	case l == perTenant && !errors.Is(err, jetstream.ErrObjectNotFound):
		t.Errorf("per-tenant layout: globex/bob's object from acme/alice's store: %d bytes, %v; want not found", len(got), err)
	case l == shared && (err != nil || !bytes.Equal(got, bob.blob)):
		t.Errorf("shared layout: acme/alice no longer reads globex/bob's object (%v); if blobs are fenced now, update README.md (Limits) and this test", err)
	}
	c, done = short()
	err = obj.Delete(c, bobObject)
	done()
	br, rerr := mirror.NewReader(ctx, bob.js, bob.names, bob.owner)
	if rerr != nil {
		t.Fatal(rerr)
	}
	rc, rerr := br.Blob(ctx, sha(bob.blob))
	if rc != nil {
		rc.Close()
	}
	switch {
	case l == perTenant && (!errors.Is(err, jetstream.ErrObjectNotFound) || rerr != nil):
		t.Errorf("per-tenant layout: deleting globex/bob's object as acme/alice: %v; bob reads it: %v", err, rerr)
	case l == shared && !errors.Is(rerr, mirror.ErrNotFound):
		t.Errorf("shared layout: acme/alice could not mark globex/bob's object deleted (%v, bob reads it: %v); if metadata is fenced now, update README.md (Limits) and this test", err, rerr)
	}

	// Nothing above changed bob's head.
	if h, _, err := br.Head(ctx, bob.conv); err != nil || h.LastSeq != bob.seq {
		t.Errorf("globex/bob's head after alice's attempts: %+v, %v", h, err)
	}
}
