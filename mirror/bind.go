package mirror

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Bound holds the mirror's objects bound once, for a service that reads and writes for
// many owners (the session store): NewReader and NewWriter each cost API calls to bind
// them, which a per-owner, per-request binding would repeat.
type Bound struct {
	JS     jetstream.JetStream
	Names  Names
	Stream jetstream.Stream
	Heads  jetstream.KeyValue
	Blobs  jetstream.ObjectStore
}

// Reader is the read API of one owner on the bound objects.
func (b Bound) Reader(o Owner) *Reader {
	return &Reader{js: b.JS, names: b.Names, owner: o, stream: b.Stream, heads: b.Heads, blobs: b.Blobs}
}

// Writer is the blob and head writer of one owner on the bound objects.
func (b Bound) Writer(o Owner) *Writer {
	// Every field NewWriter sets: PutBlob sizes its chunks from js's connection, and
	// maxRevs bounds the revisions remembered.
	return &Writer{js: b.JS, names: b.Names, owner: o, heads: b.Heads, blobs: b.Blobs, revs: map[string]uint64{}, maxRevs: DefaultMaxRevisions}
}

// Bind binds the stream, the heads bucket and the blobs bucket; they must have been
// provisioned.
func Bind(ctx context.Context, js jetstream.JetStream, n Names) (Bound, error) {
	s, err := js.Stream(ctx, n.Stream())
	if err != nil {
		return Bound{}, fmt.Errorf("bind stream %s: %w", n.Stream(), err)
	}
	kv, err := js.KeyValue(ctx, n.HeadsBucket())
	if err != nil {
		return Bound{}, fmt.Errorf("bind key-value bucket %s: %w", n.HeadsBucket(), err)
	}
	obj, err := js.ObjectStore(ctx, n.BlobsBucket())
	if err != nil {
		return Bound{}, fmt.Errorf("bind object store %s: %w", n.BlobsBucket(), err)
	}
	return Bound{JS: js, Names: n, Stream: s, Heads: kv, Blobs: obj}, nil
}
