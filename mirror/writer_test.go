package mirror_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
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

// TestBlobChunkRetriedAfterNoRespondersStoresItsOwnBytes (torture T21, seed 514479021970:
// a 3-node cluster, a node stopped during a 190 KB upload): while a stream has no leader
// a publish is answered "no responders", and nats.go's object store Put, which publishes
// its chunks asynchronously from one reused message and buffer, lets the client publish
// such a chunk again 250 ms later, holding what the buffer holds by then: the last
// chunk's bytes, stored after it. The put reported success with the right digest and
// chunk count, and every read of the object failed ("digests do not match"). Here the
// chunk subjects have no stream while the first chunk is published, as between two
// leaders (TestBlobPutAcrossLeaderChange is the cluster's own version).
func TestBlobChunkRetriedAfterNoRespondersStoresItsOwnBytes(t *testing.T) {
	tm := mirrortest.New(t)
	ctx := mirrortest.Ctx(t)
	line, sha := blobLine(0)
	stream, err := tm.JS.Stream(ctx, "OBJ_"+tm.Names.BlobsBucket())
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	chunks := "$O." + tm.Names.BlobsBucket() + ".C.>"
	without := cfg
	without.Subjects = nil
	for _, s := range cfg.Subjects {
		if s != chunks {
			without.Subjects = append(without.Subjects, s)
		}
	}
	if len(without.Subjects) == len(cfg.Subjects) {
		t.Fatalf("object stream subjects %v: no %s", cfg.Subjects, chunks)
	}
	if _, err := tm.JS.UpdateStream(ctx, without); err != nil {
		t.Fatal(err)
	}
	// The stream has its subjects again (a leader elected) once the second chunk is
	// read, or before the caller puts again.
	restored := false
	restore := func() error {
		if restored {
			return nil
		}
		restored = true
		_, err := tm.JS.UpdateStream(ctx, cfg)
		return err
	}
	r := &hookReader{r: bytes.NewReader(line), before: map[int]func() error{1: restore}}
	putBlobAsTheDaemon(t, tm.Writer, sha, line, r, restore)
	if got, err := readBlob(ctx, tm.Reader, sha); err != nil || !bytes.Equal(got, line) {
		t.Fatalf("read back %d bytes, %v; want the line's %d", len(got), err, len(line))
	}
}

// blobLine is a line of 193,715 bytes (two chunks of 128 KiB, as in T21's run), one per
// i, and its digest.
func blobLine(i int) ([]byte, string) {
	line := make([]byte, 193715)
	for j := range line {
		line[j] = byte('a' + (i+j)%23)
	}
	sum := sha256.Sum256(line)
	return line, hex.EncodeToString(sum[:])
}

// putBlobAsTheDaemon puts line from r and, when that fails, again from its bytes once
// before (if any) has run, as the daemon retries a failed put. An error is fine; a name
// left unreadable is not.
func putBlobAsTheDaemon(t *testing.T, w *mirror.Writer, sha string, line []byte, r io.Reader, before func() error) {
	t.Helper()
	// Each put has its own 15 s, as the daemon's requests have theirs: a reply lost
	// across a leader change must fail that put, not wait out the test's context (CI:
	// "chunk 0 …: context deadline exceeded" after 66 s, the second put left no time).
	ctx := mirrortest.Ctx(t)
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	_, err := w.PutBlob(pctx, sha, r)
	cancel()
	if err == nil {
		return
	}
	t.Logf("first put: %v", err)
	if before != nil {
		if err := before(); err != nil {
			t.Fatal(err)
		}
	}
	putBlobRetrying(t, w, sha, line)
}

// readBlob reads a blob whole.
func readBlob(ctx context.Context, r *mirror.Reader, sha string) ([]byte, error) {
	rc, err := r.Blob(ctx, sha)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// hookReader runs before[i] before its i-th Read (counting from 0).
type hookReader struct {
	r      io.Reader
	n      int
	before map[int]func() error
}

func (h *hookReader) Read(p []byte) (int, error) {
	if f := h.before[h.n]; f != nil {
		if err := f(); err != nil {
			return 0, err
		}
	}
	h.n++
	return h.r.Read(p)
}

// TestBlobReadOfCorruptObjectFails: a record with the blob's digest whose chunks, all
// stored, hold other bytes (an older daemon's put across a leader change, torture T21)
// reads as a corrupt object naming the blob, once its last chunk is read: not a wait for
// chunks a replica might still deliver, nor bytes passed on as the blob's.
func TestBlobReadOfCorruptObjectFails(t *testing.T) {
	tm := mirrortest.New(t)
	ctx := mirrortest.Ctx(t)
	line, sha := blobLine(0)
	other, _ := blobLine(1) // as long, other bytes
	obs, err := tm.JS.ObjectStore(ctx, tm.Names.BlobsBucket())
	if err != nil {
		t.Fatal(err)
	}
	name := tm.Owner.ObjectName(sha)
	info, err := obs.PutBytes(ctx, name, other)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(line)
	info.Digest = "SHA-256=" + base64.URLEncoding.EncodeToString(sum[:])
	rec := nats.NewMsg("$O." + tm.Names.BlobsBucket() + ".M." + base64.URLEncoding.EncodeToString([]byte(name)))
	rec.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	if rec.Data, err = json.Marshal(info); err != nil {
		t.Fatal(err)
	}
	if _, err := tm.JS.PublishMsg(ctx, rec); err != nil {
		t.Fatal(err)
	}
	got, err := readBlob(ctx, tm.Reader, sha)
	if !errors.Is(err, mirror.ErrBlobCorrupt) || !strings.Contains(err.Error(), sha) {
		t.Fatalf("read %d bytes, %v; want an error wrapping ErrBlobCorrupt naming the blob", len(got), err)
	}
}
