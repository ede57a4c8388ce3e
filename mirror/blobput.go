package mirror

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// putObject stores the bytes of r as the object name, laid out the way nats.go's object
// store lays objects out, so that its Get reads them: the chunks on the subject
// $O.<bucket>.C.<nuid>, then the record on $O.<bucket>.M.<name>, which rolls up the name's
// earlier records.
//
// It does not use the object store's own Put (nats.go v1.55.0), which publishes the
// chunks asynchronously from one message and one buffer it reuses for every chunk. A
// chunk the server answers "no responders" (the stream between two leaders: a node
// stopped) is published again by the client 250 ms later, carrying what the buffer holds
// by then, a later chunk's bytes, and stored after the chunks that followed it: Put
// reports success with the right size, chunk count and digest, and every read of the
// object fails, "digests do not match". A chunk that fails outright leaves the record
// stored with its chunks purged.
//
// Here every chunk is acknowledged before the next one is read, so the chunks are stored
// in order and each holds its own bytes, and the record is published only once all of
// them are stored and their digest is want: a record never names chunks that are missing,
// misordered or other bytes, and bytes that are not want never get a record (the
// returned error wraps ErrBlobChanged). The chunks of a put abandoned before its record
// are purged (best effort: no record names them). prev is the name's record the caller
// found, or nil; once the new record is stored, prev's chunks are purged (best effort:
// no current record names them, as the new record was stored after prev was read).
func (w *Writer) putObject(ctx context.Context, name, want string, prev *jetstream.ObjectInfo, r io.Reader) (*jetstream.ObjectInfo, error) {
	bucket := w.names.BlobsBucket()
	stream := objectStream(bucket)
	size := w.chunkSize()
	info := &jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: size}},
		Bucket:     bucket,
		NUID:       nuid.Next(),
	}
	chunks := chunkSubject(bucket, info.NUID)
	published := false
	abandon := func(err error) (*jetstream.ObjectInfo, error) {
		if published {
			w.purgeChunks(ctx, chunks)
		}
		return nil, err
	}
	h := sha256.New()
	buf := make([]byte, size) // reused: a chunk's publish has returned before the next read
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			h.Write(buf[:n])
			published = true
			if _, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: chunks, Data: buf[:n]}, jetstream.WithExpectStream(stream)); err != nil {
				return abandon(fmt.Errorf("chunk %d of %s: %w", info.Chunks, name, err))
			}
			info.Chunks++
			info.Size += uint64(n)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return abandon(fmt.Errorf("read %s: %w", name, rerr))
		}
	}
	info.Digest = jetstream.GetObjectDigestValue(h)
	if info.Digest != want {
		return abandon(ErrBlobChanged)
	}
	rec := nats.NewMsg(metaSubject(bucket, name))
	rec.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	var err error
	if rec.Data, err = json.Marshal(info); err != nil {
		return abandon(fmt.Errorf("record of %s: %w", name, err))
	}
	if _, err := w.js.PublishMsg(ctx, rec, jetstream.WithExpectStream(stream)); err != nil {
		// The record may be stored all the same, and it is whole: its chunks stay.
		return nil, fmt.Errorf("record of %s: %w", name, err)
	}
	if prev != nil && !prev.Deleted && prev.NUID != "" && prev.NUID != info.NUID {
		w.purgeChunks(ctx, chunkSubject(bucket, prev.NUID))
	}
	return info, nil
}

// purgeChunks removes the chunks on subject, which no current record names. A failure
// leaves them as unreferenced space, as nats.go's own Put does.
func (w *Writer) purgeChunks(ctx context.Context, subject string) {
	if ctx.Err() != nil {
		return
	}
	s, err := w.js.Stream(ctx, objectStream(w.names.BlobsBucket()))
	if err != nil {
		return
	}
	_ = s.Purge(ctx, jetstream.WithPurgeSubject(subject))
}

// objectStream is the stream of object store bucket; chunkSubject and metaSubject are
// the subjects of an object's chunks and of its record (nats.go jetstream/object.go).
func objectStream(bucket string) string { return "OBJ_" + bucket }

func chunkSubject(bucket, id string) string { return "$O." + bucket + ".C." + id }

func metaSubject(bucket, name string) string {
	return "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name))
}
