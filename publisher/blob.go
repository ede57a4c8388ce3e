package publisher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// putBlob stores a line above the blob threshold in the object store before its
// reference is published, so that a reference never points at a missing object. A line
// held in memory is uploaded from there; a larger one is streamed from the descriptor
// that read it. The writer checks what it stored against the digest: a line that changed
// between the two reads is refused (nothing left under its name) and the file reopened.
func (p *Publisher) putBlob(ctx context.Context, f watcher.File, l watcher.Line, sha string, data []byte) error {
	var r io.Reader
	if data != nil {
		r = bytes.NewReader(data)
	} else {
		// The descriptor that read the line, never the path (which may name another file).
		r = io.NewSectionReader(l.Src, l.Offset, l.Len)
	}
	uploaded, err := p.writer.PutBlob(ctx, sha, r)
	if errors.Is(err, mirror.ErrBlobChanged) {
		return fmt.Errorf("%s line %d: changed while it was uploaded: %w", f.Path, l.Ordinal+1, watcher.ErrReopen)
	}
	if err != nil {
		return fmt.Errorf("%s line %d: %w", f.Path, l.Ordinal+1, err)
	}
	if uploaded {
		p.m.blobs.Inc()
		p.m.blobBytes.Add(float64(l.Len))
	} else {
		p.m.blobsReused.Inc()
	}
	return nil
}
