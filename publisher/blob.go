package publisher

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"

	"github.com/pisync/pisync/watcher"
)

// putBlob stores a line above the blob threshold in the object store before its
// reference is published, so that a reference never points at a missing object. A line
// held in memory is uploaded from there; a larger one is streamed from the file and its
// digest checked again, since the file could change between the two reads.
func (p *Publisher) putBlob(ctx context.Context, f watcher.File, l watcher.Line, sha string, data []byte) error {
	var r io.Reader
	var check *digestReader
	if data != nil {
		r = bytes.NewReader(data)
	} else {
		// The descriptor that read the line, never the path (which may name another file).
		check = &digestReader{r: io.NewSectionReader(l.Src, l.Offset, l.Len), h: sha256.New()}
		r = check
	}
	uploaded, err := p.writer.PutBlob(ctx, sha, r)
	if err != nil {
		return fmt.Errorf("%s line %d: %w", f.Path, l.Ordinal+1, err)
	}
	if check != nil && uploaded && (check.n != l.Len || hex.EncodeToString(check.h.Sum(nil)) != sha) {
		return fmt.Errorf("%s line %d: changed while it was uploaded: %w", f.Path, l.Ordinal+1, watcher.ErrReopen)
	}
	if uploaded {
		p.m.blobs.Inc()
		p.m.blobBytes.Add(float64(l.Len))
	} else {
		p.m.blobsReused.Inc()
	}
	return nil
}

type digestReader struct {
	r io.Reader
	h hash.Hash
	n int64 // bytes read
}

func (d *digestReader) Read(b []byte) (int, error) {
	n, err := d.r.Read(b)
	d.h.Write(b[:n])
	d.n += int64(n)
	return n, err
}
