package publisher

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/watcher"
)

// readAgain reads a line handed over without its bytes (longer than the watcher's
// inline limit) from the descriptor the watcher read it with: whole (data) when it fits
// in memory, else hashed in bounded chunks, keeping its first bytes (prefix) for its
// envelope. The bytes must have the digest the watcher took as it read them, else the
// file changed in between and is reopened (ErrReopen): a rewrite in place that moved the
// line, or changed its middle without changing its length, leaves a full-length section
// of other bytes, which would be mirrored as a line no file held under that ordinal.
func readAgain(l watcher.Line, into *[]byte) (data, prefix []byte, sum [sha256.Size]byte, err error) {
	if l.SHA256 == nil {
		return nil, nil, sum, fmt.Errorf("line at offset %d handed over with neither its bytes nor their digest", l.Offset)
	}
	if l.Len <= session.MaxBufferedLine {
		if into != nil {
			data, err = readSectionInto(into, l.Src, l.Offset, l.Len)
		} else {
			data, err = readSection(l.Src, l.Offset, l.Len)
		}
		if err == nil {
			sum = sha256.Sum256(data)
		}
	} else {
		prefix, sum, err = digestSection(l.Src, l.Offset, l.Len)
	}
	if err != nil {
		return nil, nil, sum, err
	}
	if sum != *l.SHA256 {
		return nil, nil, sum, fmt.Errorf("line at offset %d changed since the watcher read it: %w", l.Offset, watcher.ErrReopen)
	}
	return data, prefix, sum, nil
}

// digestSection hashes length bytes at offset of src (the descriptor the watcher read
// the line with) in bounded memory, with their first bytes for the envelope
// (session.DigestSection). A short section means the file changed under the line: the
// watcher reopens it (ErrReopen).
func digestSection(src io.ReaderAt, offset, length int64) (prefix []byte, sum [sha256.Size]byte, err error) {
	prefix, sum, err = session.DigestSection(src, offset, length)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = fmt.Errorf("line %w: %w", err, watcher.ErrReopen)
	}
	return prefix, sum, err
}

// readSection reads n bytes at offset of src (the descriptor the watcher read the line
// with). A short read means the file changed under the line: the watcher reopens it
// (ErrReopen); the bytes are never padded.
func readSection(src io.ReaderAt, offset, n int64) ([]byte, error) {
	var buf []byte
	return readSectionInto(&buf, src, offset, n)
}

// readSectionInto is readSection into *buf, grown if it is too small.
func readSectionInto(buf *[]byte, src io.ReaderAt, offset, n int64) ([]byte, error) {
	if int64(cap(*buf)) < n {
		*buf = make([]byte, n)
	}
	b := (*buf)[:n]
	got, err := src.ReadAt(b, offset)
	if int64(got) < n {
		if err == nil || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("line at offset %d cut short (%d of %d bytes): %w", offset, got, n, watcher.ErrReopen)
		}
		return nil, err
	}
	return b, nil
}

// blobReads keeps the buffers lines going the blob way are read back into (readAgain).
var blobReads = sync.Pool{New: func() any { return new([]byte) }}
