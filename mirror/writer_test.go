package mirror_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

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

// TestPoisonedBlobNameReplaced pins issue 13 item 4: an upload whose bytes did not match
// their digest (the file changed while it was read) left its object behind, and a later
// put of the right bytes reported "already there", so the object kept the wrong bytes.
// An existing object is now trusted only when its recorded digest matches its name
// (SHA-256: the size with it); otherwise it is replaced, and an upload that does not
// match its digest is refused and removed.
func TestPoisonedBlobNameReplaced(t *testing.T) {
	tm := mirrortest.New(t)
	ctx := mirrortest.Ctx(t)
	good := bytes.Repeat([]byte("good line "), 20000)
	bad := append(bytes.Repeat([]byte("bad line  "), 20000), 'x')
	sum := sha256.Sum256(good)
	sha := hex.EncodeToString(sum[:])
	read := func() []byte {
		t.Helper()
		rc, err := tm.Reader.Blob(ctx, sha)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	// Bytes that are not the digest's are refused and leave nothing behind.
	if up, err := tm.Writer.PutBlob(ctx, sha, bytes.NewReader(bad)); err == nil {
		t.Fatalf("put of bytes that do not match the digest: uploaded %v, no error", up)
	}
	if _, err := tm.Reader.Blob(ctx, sha); !errors.Is(err, mirror.ErrNotFound) {
		t.Fatalf("after a refused put the object is there (%v)", err)
	}

	// An object left under the name with other bytes (an older daemon's failed upload)
	// is replaced by the next put.
	obs, err := tm.JS.ObjectStore(ctx, tm.Names.BlobsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, tm.Owner.ObjectName(sha), bad); err != nil {
		t.Fatal(err)
	}
	up, err := tm.Writer.PutBlob(ctx, sha, bytes.NewReader(good))
	if err != nil || !up {
		t.Fatalf("put over a poisoned name: uploaded %v, %v; want it replaced", up, err)
	}
	if !bytes.Equal(read(), good) {
		t.Fatal("the object still holds the wrong bytes")
	}

	// A good object is reused, not uploaded again.
	up, err = tm.Writer.PutBlob(ctx, sha, bytes.NewReader(good))
	if err != nil || up {
		t.Fatalf("put of a stored object: uploaded %v, %v; want it reused", up, err)
	}
}

// TestBlobRecordWithoutChunksReplaced (torture hour run, seed 317022446736, 3-node
// cluster with a node down during a 1.1 MB upload): nats.go publishes an object's record
// together with its chunks and, when a chunk fails, purges the chunks but not the record
// it may have stored. The daemon's retry found a record with the right digest, trusted
// it, and every read of the object failed ("digests do not match"). A record whose chunks
// are not all stored is now replaced.
func TestBlobRecordWithoutChunksReplaced(t *testing.T) {
	tm := mirrortest.New(t)
	ctx := mirrortest.Ctx(t)
	line := bytes.Repeat([]byte("a line of an image "), 20000) // 380 KB: 3 chunks
	sum := sha256.Sum256(line)
	sha := hex.EncodeToString(sum[:])
	if _, err := tm.Writer.PutBlob(ctx, sha, bytes.NewReader(line)); err != nil {
		t.Fatal(err)
	}
	// What the failed put leaves: the record, its chunks purged.
	obs, err := tm.JS.ObjectStore(ctx, tm.Names.BlobsBucket())
	if err != nil {
		t.Fatal(err)
	}
	info, err := obs.GetInfo(ctx, tm.Owner.ObjectName(sha))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := tm.JS.Stream(ctx, "OBJ_"+tm.Names.BlobsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject("$O."+tm.Names.BlobsBucket()+".C."+info.NUID)); err != nil {
		t.Fatal(err)
	}
	up, err := tm.Writer.PutBlob(ctx, sha, bytes.NewReader(line))
	if err != nil || !up {
		t.Fatalf("put over a record without its chunks: uploaded %v, %v; want it replaced", up, err)
	}
	rc, err := tm.Reader.Blob(ctx, sha)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(got, line) {
		t.Fatalf("read back %d bytes, %v; want the line's %d", len(got), err, len(line))
	}
}
