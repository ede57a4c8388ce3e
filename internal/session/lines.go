package session

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
)

// LinePrefixKeep is how much of each line ReadLines keeps to describe it: enough to read
// the envelope of all but the largest lines. It is also how much of a line too large to
// read whole the publisher scans for its envelope (ScanEnvelopePrefix), and so how much
// recovery reads of such a line to find the envelope the publisher found.
const LinePrefixKeep = 64 << 10

// MaxBufferedLine is the longest line pisync reads whole into memory: the publisher
// to scan and upload it, recovery to learn a blob header's or leaf's fields. Longer
// lines are streamed in bounded pieces.
const MaxBufferedLine = 16 << 20

// maxReadBuf is the read buffer of a large file: lines longer are hashed in pieces.
const maxReadBuf = 256 << 10

// readBufSize fits the read buffer to a file's size: background verification reads
// thousands of small files, and a buffer of maxReadBuf each is garbage the daemon's
// heap grows by.
func readBufSize(r io.Reader) int {
	if f, ok := r.(interface{ Stat() (fs.FileInfo, error) }); ok {
		if info, err := f.Stat(); err == nil && info.Mode().IsRegular() {
			return int(min(max(info.Size()+1, 4096), maxReadBuf))
		}
	}
	return maxReadBuf
}

// DigestedLine is one complete line of a file, digested without holding it whole.
type DigestedLine struct {
	Ordinal int64
	SHA256  string // hex digest of the line without its newline
	Size    int64  // bytes without the newline
	Prefix  []byte // the line itself when Size <= LinePrefixKeep, else nil; valid during the call
}

// EntryID is the line's entry id when it can be read from the kept prefix.
func (l DigestedLine) EntryID() string {
	if l.Prefix == nil {
		return ""
	}
	env, err := ScanEntry(l.Prefix)
	if err != nil {
		return ""
	}
	return env.ID
}

// ReadLines calls fn for each complete line of r in order and returns the length of a
// torn tail (bytes after the last newline). Memory stays bounded whatever the line
// length: long lines are hashed chunk by chunk.
func ReadLines(r io.Reader, fn func(DigestedLine) error) (torn int64, err error) {
	br := bufio.NewReaderSize(r, readBufSize(r))
	h := sha256.New()
	var (
		ord  int64
		size int64
		keep []byte
	)
	for {
		chunk, rerr := br.ReadSlice('\n')
		switch {
		case rerr == nil:
			body := chunk[:len(chunk)-1] // the digest covers the line without its newline
			h.Write(body)
			size += int64(len(body))
			var prefix []byte
			if size <= LinePrefixKeep {
				if keep != nil {
					prefix = append(keep, body...)
				} else {
					prefix = body
				}
			}
			if err := fn(DigestedLine{Ordinal: ord, SHA256: hex.EncodeToString(h.Sum(nil)), Size: size, Prefix: prefix}); err != nil {
				return 0, err
			}
			h.Reset()
			ord, size, keep = ord+1, 0, keep[:0]
			if cap(keep) > LinePrefixKeep {
				keep = nil
			}
		case errors.Is(rerr, bufio.ErrBufferFull), errors.Is(rerr, io.EOF):
			h.Write(chunk)
			if size+int64(len(chunk)) <= LinePrefixKeep {
				keep = append(keep, chunk...)
			}
			size += int64(len(chunk))
			if errors.Is(rerr, io.EOF) {
				return size, nil
			}
		default:
			return 0, rerr
		}
	}
}
