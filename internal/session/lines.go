package session

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// A line is the bytes before a '\n', without it; bytes after the last '\n' are a torn
// tail (a line still being written, or left by a crash), never a line. Its digest is the
// SHA-256 of those bytes, in hex as Pisync-Sha256 carries it.

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
	return readLines(r, readBufSize(r), true, fn)
}

// readLines is ReadLines with a read buffer of bufSize bytes; without digest, the lines'
// SHA256 is "" (nothing is hashed).
func readLines(r io.Reader, bufSize int, digest bool, fn func(DigestedLine) error) (torn int64, err error) {
	br := bufio.NewReaderSize(r, bufSize)
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
			if digest {
				h.Write(body)
			}
			size += int64(len(body))
			var prefix []byte
			if size <= LinePrefixKeep {
				if keep != nil {
					prefix = append(keep, body...)
				} else {
					prefix = body
				}
			}
			dl := DigestedLine{Ordinal: ord, Size: size, Prefix: prefix}
			if digest {
				var sum [sha256.Size]byte
				h.Sum(sum[:0])
				dl.SHA256 = HexDigest(sum)
				h.Reset()
			}
			if err := fn(dl); err != nil {
				return 0, err
			}
			ord, size, keep = ord+1, 0, keep[:0]
			if cap(keep) > LinePrefixKeep {
				keep = nil
			}
		case errors.Is(rerr, bufio.ErrBufferFull), errors.Is(rerr, io.EOF):
			if digest {
				h.Write(chunk)
			}
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

// Digest is the hex SHA-256 of line (without its newline).
func Digest(line []byte) string { return HexDigest(sha256.Sum256(line)) }

// HexDigest is sum in hex, in one allocation (hex.EncodeToString makes two): the
// publisher takes it for every line.
func HexDigest(sum [sha256.Size]byte) string {
	var digits [2 * sha256.Size]byte
	hex.Encode(digits[:], sum[:])
	return string(digits[:])
}

// SplitLines splits b into its complete lines, without their newlines; a torn tail is
// not a line. The lines share b's memory.
func SplitLines(b []byte) [][]byte {
	var lines [][]byte
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return lines
		}
		lines = append(lines, b[:i])
		b = b[i+1:]
	}
}

// TornTail returns how many bytes of a file of size bytes follow its last newline,
// reading r backwards in chunks: what a tail of the file still lacks to be a line.
func TornTail(r io.ReaderAt, size int64) (int64, error) {
	buf := make([]byte, min(size, 64<<10))
	for end := size; end > 0; {
		start := max(end-int64(len(buf)), 0)
		chunk := buf[:end-start]
		if _, err := r.ReadAt(chunk, start); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if i := bytes.LastIndexByte(chunk, '\n'); i >= 0 {
			return size - (start + int64(i) + 1), nil
		}
		end = start
	}
	return size, nil
}

// DigestSection reads the n bytes at off of r once, hashing them in bounded memory, and
// returns their SHA-256 with their first LinePrefixKeep bytes (all of them when fewer),
// read in the same pass: an envelope scanned from the prefix is that of the bytes the
// digest covers. A section that ends early fails with an error wrapping
// io.ErrUnexpectedEOF: the file changed under it.
func DigestSection(r io.ReaderAt, off, n int64) (prefix []byte, sum [sha256.Size]byte, err error) {
	prefix = make([]byte, min(n, LinePrefixKeep))
	got, err := r.ReadAt(prefix, off)
	if got == len(prefix) {
		err = nil // io.EOF with every byte asked for: the section ends the file
	}
	h := sha256.New()
	h.Write(prefix[:got])
	if err == nil {
		var more int64
		more, err = io.Copy(h, io.NewSectionReader(r, off+int64(got), n-int64(got)))
		got += int(more)
	}
	switch {
	case err != nil && !errors.Is(err, io.EOF):
		return nil, sum, fmt.Errorf("read the section at offset %d: %w", off, err)
	case int64(got) < n:
		return nil, sum, fmt.Errorf("section at offset %d cut short (%d of %d bytes): %w", off, got, n, io.ErrUnexpectedEOF)
	}
	h.Sum(sum[:0])
	return prefix, sum, nil
}
