package watcher

import (
	"bytes"
	"errors"
	"io"
	"time"
)

// tail is the read position in one file: the next line to deliver and how far past it
// the bytes are already known to hold no newline (a torn tail). Remembering scanned lets
// a long line written in many pieces be scanned once instead of once per piece.
type tail struct {
	off     int64 // offset of the next line to deliver
	ord     int64 // its ordinal
	scanned int64 // [off, scanned) holds no '\n'; scanned >= off
	prev    int64 // offset of the last line delivered, -1 if unknown
}

// lineReader splits a file into complete lines with bounded memory: one read buffer,
// plus an accumulator (at most maxInline bytes) for a short line that straddles two
// reads. A line longer than maxInline is scanned for its end without being kept.
type lineReader struct {
	buf       []byte
	acc       []byte
	maxInline int64
	now       func() time.Time
	fpBuf     [fpBytes]byte // samples of a fingerprint
}

func newLineReader(bufSize int, maxInline int64) *lineReader {
	return &lineReader{buf: make([]byte, bufSize), maxInline: maxInline, now: time.Now}
}

// errShortRead means the file ended before the size given to advance (it shrank while
// being read); what was read is delivered and the caller looks again.
var errShortRead = errors.New("file shorter than its size")

// advance reads r from t up to size, calls emit for every complete line in order, and
// moves t past each line emit accepts. It returns the bytes read and the first error
// of r or emit; after an error of emit, t points at the refused line.
func (lr *lineReader) advance(r io.ReaderAt, t *tail, size int64, emit func(Line) error) (int64, error) {
	if t.scanned < t.off {
		t.scanned = t.off
	}
	pos := t.off // next byte to read
	big := false // the current line is longer than maxInline: its bytes are not kept
	lr.acc = lr.acc[:0]
	if t.scanned-t.off > lr.maxInline {
		// Only the end of this line is needed: resume the scan where the last one stopped.
		pos, big = t.scanned, true
	}
	var read int64
	for pos < size {
		n := int64(len(lr.buf))
		if size-pos < n {
			n = size - pos
		}
		got, err := r.ReadAt(lr.buf[:n], pos)
		read += int64(got)
		seen := lr.now()
		if got < int(n) && err == nil {
			err = io.ErrUnexpectedEOF
		}
		chunk := lr.buf[:got]
		for len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				if !big {
					if int64(len(lr.acc)+len(chunk)) > lr.maxInline {
						big, lr.acc = true, lr.acc[:0]
					} else {
						lr.acc = append(lr.acc, chunk...)
					}
				}
				pos += int64(len(chunk))
				break
			}
			end := pos + int64(i) // offset of the '\n'
			l := Line{Ordinal: t.ord, Offset: t.off, Len: end - t.off, Seen: seen}
			if !big && l.Len <= lr.maxInline {
				if len(lr.acc) == 0 {
					l.Data = chunk[:i:i]
				} else {
					lr.acc = append(lr.acc, chunk[:i]...)
					l.Data = lr.acc
				}
			}
			if err := emit(l); err != nil {
				t.scanned = t.off
				return read, err
			}
			t.off, t.ord, t.scanned, t.prev = end+1, t.ord+1, end+1, l.Offset
			pos = end + 1
			chunk = chunk[i+1:]
			lr.acc, big = lr.acc[:0], false
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				t.scanned = max(t.scanned, pos)
				return read, errShortRead
			}
			return read, err
		}
	}
	t.scanned = max(t.scanned, pos)
	return read, nil
}

// headerChunk is the read size used to find the first line.
const headerChunk = 4096

// firstLine returns a copy of the first line of r (nil when it is longer than
// maxInline), and whether it is complete within size.
func (lr *lineReader) firstLine(r io.ReaderAt, size int64) (hdr []byte, complete bool, read int64, err error) {
	// The header is short: read it in small pieces rather than a whole buffer's worth.
	if full := lr.buf; len(full) > headerChunk {
		lr.buf = full[:headerChunk]
		defer func() { lr.buf = full }()
	}
	var t tail
	stop := errors.New("stop")
	read, err = lr.advance(r, &t, size, func(l Line) error {
		if l.Data != nil {
			hdr = bytes.Clone(l.Data)
		}
		complete = true
		return stop
	})
	if err == stop || errors.Is(err, errShortRead) {
		err = nil
	}
	return hdr, complete, read, err
}
