package mirror

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Writer holds the write side of the mirror that is not the entries stream itself: blobs
// and heads. Entries are published by the publisher, which owns the in-flight window.
type Writer struct {
	js    jetstream.JetStream
	names Names
	owner Owner
	heads jetstream.KeyValue
	blobs jetstream.ObjectStore

	mu      sync.Mutex
	revs    map[string]uint64 // head key → last revision we wrote or read
	maxRevs int
}

// DefaultMaxRevisions bounds the revisions a Writer remembers (about 100 bytes each).
// They save a round trip per head update; a forgotten one costs two more (the create
// fails, the head is read, then updated), so only heads idle long enough to be pushed
// out pay it, while a daemon that has seen a million conversations holds at most this
// many.
const DefaultMaxRevisions = 16384

// NewWriter binds the heads and blobs buckets; they must have been provisioned.
func NewWriter(ctx context.Context, js jetstream.JetStream, n Names, o Owner) (*Writer, error) {
	kv, err := js.KeyValue(ctx, n.HeadsBucket())
	if err != nil {
		return nil, fmt.Errorf("bind key-value bucket %s: %w", n.HeadsBucket(), err)
	}
	obj, err := js.ObjectStore(ctx, n.BlobsBucket())
	if err != nil {
		return nil, fmt.Errorf("bind object store %s: %w", n.BlobsBucket(), err)
	}
	return &Writer{js: js, names: n, owner: o, heads: kv, blobs: obj, revs: map[string]uint64{}, maxRevs: DefaultMaxRevisions}, nil
}

// PutBlob stores the payload with digest sha256hex unless an object of that name holding
// exactly those bytes exists already: object puts are not idempotent, so a retried put
// must not write it twice. An object of that name is trusted only when the digest the
// object store recorded for it is sha256hex (a SHA-256 match fixes the size too) and
// the store holds exactly its chunks; otherwise (a failed upload left other bytes, or a
// record without its chunks) it is replaced. The put itself (putObject) publishes the
// object's record only after all its chunks are stored, in order, with digest
// sha256hex: bytes read from r that do not match (a file that changed while it was
// read) get no record and an error wrapping ErrBlobChanged, so a name never holds the
// wrong bytes. PutBlob reports whether it uploaded.
func (w *Writer) PutBlob(ctx context.Context, sha256hex string, r io.Reader) (bool, error) {
	name := w.owner.ObjectName(sha256hex)
	want, err := objectDigest(sha256hex)
	if err != nil {
		return false, err
	}
	info, err := w.blobs.GetInfo(ctx, name)
	switch {
	case err == nil && !info.Deleted && info.Digest == want:
		whole, err := w.chunksStored(ctx, info)
		if err != nil {
			return false, fmt.Errorf("blob %s: %w", sha256hex, err)
		}
		if whole {
			return false, nil
		}
		// Put again: its record replaces this one, then its chunks are purged.
	case errors.Is(err, jetstream.ErrObjectNotFound):
		info = nil
	case err != nil:
		return false, fmt.Errorf("blob %s: %w", sha256hex, err)
	}
	if _, err := w.putObject(ctx, name, want, info, r); err != nil {
		return false, fmt.Errorf("put blob %s: %w", sha256hex, err)
	}
	return true, nil
}

// chunksStored tells whether the object store holds exactly the chunks of the object info
// describes, as the stream's leader counts them. An object put by nats.go's own Put may
// have a record whose chunks are gone: when a chunk fails, it purges the chunks but not
// the record it may have stored already (a node of the cluster down during the upload is
// enough), and every read of the object fails ("digests do not match"). A count says
// nothing of the chunks' bytes: putObject is what keeps those right.
func (w *Writer) chunksStored(ctx context.Context, info *jetstream.ObjectInfo) (bool, error) {
	if info.Chunks == 0 {
		return true, nil
	}
	held, err := leaderChunks(ctx, w.js, w.names.BlobsBucket(), info)
	if err != nil {
		return false, err
	}
	return held == uint64(info.Chunks), nil
}

// ErrBlobChanged is returned by PutBlob when the bytes it read do not have the digest
// they were put under: the line changed while it was read.
var ErrBlobChanged = errors.New("uploaded bytes do not match their digest")

// objectDigest is how the object store records a SHA-256 digest.
func objectDigest(sha256hex string) (string, error) {
	b, err := hex.DecodeString(sha256hex)
	if err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("blob name %q: not a SHA-256 digest", sha256hex)
	}
	return "SHA-256=" + base64.URLEncoding.EncodeToString(b), nil
}

// defaultChunkSize is the object store's own chunk size.
const defaultChunkSize = 128 << 10

// chunkSize is the object store chunk size for the server we are connected to: the
// default, or less when the server's max_payload is smaller, or every chunk is refused.
func (w *Writer) chunkSize() uint32 {
	n := int64(defaultChunkSize)
	if nc := w.js.Conn(); nc != nil && nc.MaxPayload() > 0 {
		n = min(n, nc.MaxPayload()-4<<10)
	}
	return uint32(max(n, 1<<10))
}

// StoreWritesError is returned by PutHead when the stored head says the session store
// writes the conversation: the daemon's head is not written over it (DESIGN §8).
type StoreWritesError struct {
	Head Head // the store's head
}

func (e *StoreWritesError) Error() string {
	return fmt.Sprintf("the session store writes conversation %s (generation %d)", e.Head.ConvKey(), e.Head.Generation)
}

// PutHead writes h as the head of c with compare-and-set on the revision. When another
// writer got there first, the stored head wins if it is further along (higher generation,
// or same generation and higher stream sequence); otherwise h is written over it. A head
// the session store writes is never replaced by one it does not: PutHead then returns a
// *StoreWritesError, and the daemon records its copy with PutLocal.
func (w *Writer) PutHead(ctx context.Context, c Conv, h Head) error {
	key := c.HeadKey()
	val := EncodeHead(h)
	for attempt := 0; attempt < 5; attempt++ {
		w.mu.Lock()
		rev, known := w.revs[key]
		w.mu.Unlock()
		var err error
		var newRev uint64
		if known {
			newRev, err = w.heads.Update(ctx, key, val, rev)
		} else {
			newRev, err = w.heads.Create(ctx, key, val)
		}
		if err == nil {
			if h.StoreWrites() {
				w.forget(key) // the next head of ours must find it the store's again
			} else {
				w.remember(key, newRev)
			}
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return fmt.Errorf("put head %s: %w", c.Key, err)
		}
		e, gerr := w.heads.Get(ctx, key)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) {
			w.mu.Lock()
			delete(w.revs, key)
			w.mu.Unlock()
			continue
		}
		if gerr != nil {
			return fmt.Errorf("put head %s: %w", c.Key, gerr)
		}
		cur, derr := DecodeHead(e.Value())
		if derr == nil && cur.StoreWrites() && !h.StoreWrites() {
			w.forget(key) // so that no later update of ours goes through unchecked
			return &StoreWritesError{Head: cur}
		}
		w.remember(key, e.Revision())
		if derr == nil && aheadOf(cur, h) {
			return nil
		}
	}
	return fmt.Errorf("put head %s: revision kept changing", c.Key)
}

// PutLocal records lc as the Local part of the head of c, which the session store
// writes, by compare-and-set: every other field stays the store's. It returns
// ErrNotFound when there is no head, and a plain error when the head is no longer the
// store's (the daemon then writes its own with PutHead).
func (w *Writer) PutLocal(ctx context.Context, c Conv, lc LocalCopy) error {
	key := c.HeadKey()
	for attempt := 0; attempt < 5; attempt++ {
		e, err := w.heads.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("head of %s: %w", c.Key, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("head of %s: %w", c.Key, err)
		}
		cur, err := DecodeHead(e.Value())
		if err != nil {
			return fmt.Errorf("head of %s: %w: %v", c.Key, ErrBadHead, err)
		}
		if !cur.StoreWrites() {
			return fmt.Errorf("head of %s: not written by the session store", c.Key)
		}
		if l := cur.Local; l != nil && (l.Generation > lc.Generation || l.Generation == lc.Generation && l.LastSeq >= lc.LastSeq) {
			return nil // as far along already
		}
		cur.Local = &lc
		_, err = w.heads.Update(ctx, key, EncodeHead(cur), e.Revision())
		if err == nil {
			return nil
		}
		if !isWrongSequence(err) {
			return fmt.Errorf("put head %s: %w", c.Key, err)
		}
	}
	return fmt.Errorf("put head %s: revision kept changing", c.Key)
}

// forget drops the revision remembered for key.
func (w *Writer) forget(key string) {
	w.mu.Lock()
	delete(w.revs, key)
	w.mu.Unlock()
}

// remember records the revision of key, forgetting another key when the map is full
// (any one: map order is random, so no head is pushed out more often than others).
func (w *Writer) remember(key string, rev uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.revs[key]; !ok && len(w.revs) >= w.maxRevs {
		for k := range w.revs {
			delete(w.revs, k)
			break
		}
	}
	w.revs[key] = rev
}

func aheadOf(a, b Head) bool {
	if a.Generation != b.Generation {
		return a.Generation > b.Generation
	}
	return a.LastSeq > b.LastSeq
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}
