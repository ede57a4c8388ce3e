package recovery

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"

	"github.com/pisync/pisync/session"
)

// prefixKeep is how much of each line localLines keeps to describe it: enough to read
// the envelope of all but the largest lines.
const prefixKeep = 64 << 10

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

// localLine is one complete line of a local file, digested without holding it whole.
type localLine struct {
	ordinal int64
	sha     string
	size    int64  // bytes without the newline
	prefix  []byte // the line itself when size <= prefixKeep, else nil; valid during the call
}

// entryID is the line's entry id when it can be read from the kept prefix.
func (l localLine) entryID() string {
	if l.prefix == nil {
		return ""
	}
	env, err := session.ScanEntry(l.prefix)
	if err != nil {
		return ""
	}
	return env.ID
}

// localLines calls fn for each complete line of r in order and returns the length of a
// torn tail (bytes after the last newline). Memory stays bounded whatever the line
// length: long lines are hashed chunk by chunk.
func localLines(r io.Reader, fn func(localLine) error) (torn int64, err error) {
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
			if size <= prefixKeep {
				if keep != nil {
					prefix = append(keep, body...)
				} else {
					prefix = body
				}
			}
			if err := fn(localLine{ordinal: ord, sha: hex.EncodeToString(h.Sum(nil)), size: size, prefix: prefix}); err != nil {
				return 0, err
			}
			h.Reset()
			ord, size, keep = ord+1, 0, keep[:0]
			if cap(keep) > prefixKeep {
				keep = nil
			}
		case errors.Is(rerr, bufio.ErrBufferFull), errors.Is(rerr, io.EOF):
			h.Write(chunk)
			if size+int64(len(chunk)) <= prefixKeep {
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
