package mirror

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrBlobCorrupt is wrapped when the object stored under a blob's name does not hold the
// blob's bytes, as the object stream's leader holds it: its record has another digest, or
// names chunks the leader does not hold, or its chunks, all of them read, hash to another
// digest. It is the stored object's fault, not a replica's that is behind.
var ErrBlobCorrupt = errors.New("digest mismatch: the stored object does not hold the blob's bytes")

// Blob opens the payload of a blob line by its digest. The read ends on what the object
// stream's leader holds (leader.go), whichever replica serves it: nats.go's object store
// Get reads the record by a direct get and the chunks through an ordered consumer, and
// either may be served by a replica that has just come back, behind its leader: the read
// found no record, an older one whose chunks were purged, or ended at the replica's last
// chunk ("digests do not match"), and recover failed until the replica caught up.
//
// The record is still read by a direct get (the one record read permissions allow,
// deploy/nats/README.md), but used only when the leader counts all the chunks it names:
// a record replaced since had its chunks purged. Otherwise, or when the replica answering
// has none, the leader's count of the record's subject tells whether there is a record at
// all, and the record is read again while a replica catches up, for catchUpWait. A record
// the leader holds every chunk of is the name's own: another digest than the blob's is
// ErrBlobCorrupt. Then its chunks are read until the reader has every one of them,
// however long the replica serving the consumer takes to deliver them, and their size and
// digest are checked at the end: a mismatch is the stored object's fault (ErrBlobCorrupt).
// A read costs one request more than Get: the leader's count of the record's chunks.
func (r *Reader) Blob(ctx context.Context, sha256hex string) (io.ReadCloser, error) {
	want, err := objectDigest(sha256hex)
	if err != nil {
		return nil, err
	}
	info, err := r.blobRecord(ctx, r.owner.ObjectName(sha256hex), want)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", sha256hex, err)
	}
	br := &blobReader{ctx: ctx, sha: sha256hex, info: info, digest: sha256.New()}
	if info.Chunks == 0 {
		return br, nil
	}
	// A push consumer, as the object store's Get uses: the permissions a user has on the
	// object stream (deploy/nats) allow its creation and flow control, not pull requests.
	js, err := r.js.Conn().JetStream(nats.APIPrefix(apiPrefix(r.js.Options())))
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", sha256hex, err)
	}
	bucket := r.names.BlobsBucket()
	br.sub, err = js.SubscribeSync(chunkSubject(bucket, info.NUID), nats.OrderedConsumer(),
		nats.BindStream(objectStream(bucket)), nats.InactiveThreshold(scanConsumerIdle))
	if err != nil {
		return nil, fmt.Errorf("blob %s: read its chunks: %w", sha256hex, err)
	}
	return br, nil
}

// blobRecord returns the record of object name with digest want whose chunks the stream's
// leader holds, reading it again while the replica answering is behind (see Blob).
func (r *Reader) blobRecord(ctx context.Context, name, want string) (*jetstream.ObjectInfo, error) {
	bucket := r.names.BlobsBucket()
	var deadline time.Time // set once the leader said it holds a record
	pause := leaderRetryMin
	for {
		info, err := r.blobs.GetInfo(ctx, name, jetstream.GetObjectInfoShowDeleted())
		var unfit error // why the record read is not a readable record of the blob
		switch {
		case errors.Is(err, jetstream.ErrObjectNotFound):
			unfit = ErrNotFound
		case err != nil:
			return nil, err
		case info.Deleted:
			unfit = fmt.Errorf("its record is deleted: %w", ErrNotFound)
		default:
			held, err := leaderChunks(ctx, r.js, bucket, info)
			if err != nil {
				return nil, err
			}
			switch {
			case held != uint64(info.Chunks):
				// The record of a put the leader replaced since (its chunks purged),
				// or the leader's own, broken.
				unfit = fmt.Errorf("%w: its record names %d chunks, the stream's leader holds %d", ErrBlobCorrupt, info.Chunks, held)
			case info.Digest != want:
				// The leader holds every chunk it names: not a record replaced and
				// purged, but the name's own, with other bytes.
				return nil, fmt.Errorf("%w: its record has digest %s", ErrBlobCorrupt, info.Digest)
			default:
				return info, nil
			}
		}
		if deadline.IsZero() {
			// Whether the leader holds a record of the name at all: none, and there is
			// nothing to wait for.
			subject := metaSubject(bucket, name)
			counts, _, err := leaderCounts(ctx, r.js, objectStream(bucket), subject)
			if err != nil {
				return nil, fmt.Errorf("count its records: %w", err)
			}
			if counts[subject] == 0 {
				return nil, ErrNotFound
			}
			deadline = time.Now().Add(catchUpWait)
		}
		if time.Now().After(deadline) {
			return nil, unfit
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (%w)", unfit, ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, leaderRetryMax)
	}
}

// leaderChunks is how many chunks of the object info describes the stream's leader holds.
func leaderChunks(ctx context.Context, js jetstream.JetStream, bucket string, info *jetstream.ObjectInfo) (uint64, error) {
	subject := chunkSubject(bucket, info.NUID)
	counts, _, err := leaderCounts(ctx, js, objectStream(bucket), subject)
	if err != nil {
		return 0, fmt.Errorf("count the chunks of %s: %w", info.Name, err)
	}
	return counts[subject], nil
}

// blobReader reads the chunks of one record, exactly as many as it names (the leader
// holds them all), and checks their size and digest once it has read the last.
type blobReader struct {
	ctx    context.Context
	sha    string
	info   *jetstream.ObjectInfo
	sub    *nats.Subscription
	read   uint32 // chunks read
	size   uint64 // bytes read
	digest hash.Hash
	buf    []byte // what is left of the current chunk
	err    error  // sticky: io.EOF once the read is done and checked
}

func (b *blobReader) Read(p []byte) (int, error) {
	for len(b.buf) == 0 && b.err == nil {
		b.err = b.nextChunk()
	}
	if len(b.buf) > 0 {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		return n, nil
	}
	return 0, b.err
}

// nextChunk reads the next chunk into buf, or, past the last, checks what was read.
func (b *blobReader) nextChunk() error {
	if b.read == b.info.Chunks {
		sum := jetstream.GetObjectDigestValue(b.digest)
		if b.size != b.info.Size || sum != b.info.Digest {
			return fmt.Errorf("blob %s: %w: its %d chunks are %d bytes with digest %s, its record says %d bytes",
				b.sha, ErrBlobCorrupt, b.info.Chunks, b.size, sum, b.info.Size)
		}
		return io.EOF
	}
	m, err := b.sub.NextMsgWithContext(b.ctx)
	if err != nil {
		return fmt.Errorf("blob %s: chunk %d of the %d the stream's leader holds: %w", b.sha, b.read+1, b.info.Chunks, err)
	}
	b.read++
	b.size += uint64(len(m.Data))
	b.digest.Write(m.Data)
	b.buf = m.Data
	return nil
}

// Close deletes the chunks' consumer (the inactivity threshold does, should the request
// be lost).
func (b *blobReader) Close() error {
	if b.sub != nil {
		_ = b.sub.Unsubscribe()
	}
	return nil
}
