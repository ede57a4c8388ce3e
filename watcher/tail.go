package watcher

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"hash"
	"hash/maphash"
	"io"
	"time"

	pisession "github.com/pisync/pisync/internal/session"
)

// tail is the read position in one file: the next line to deliver, how far past it the
// bytes are already known to hold no newline (a torn tail), and the last line delivered.
// Remembering scanned lets a long line written in many pieces be scanned once instead of
// once per piece.
type tail struct {
	off     int64   // offset of the next line to deliver
	ord     int64   // its ordinal
	scanned int64   // [off, scanned) holds no '\n'; scanned >= off
	last    lineSum // the last line delivered (the rewrite anchor, see rewrite.go)
	// prefix folds the digests of every line delivered from ordinal 0 on (see fold);
	// prefixOK says it covers [0, off): false for a tail resumed from a Start, until
	// the settled check (settle.go) reads the file once.
	prefix   uint64
	prefixOK bool
}

// lineSum is the digest of one delivered line. Every file, idle or not, holds one: a
// hash rather than a copy of the bytes. A changed line goes unnoticed with odds of
// 2^-64, and the seed, random per process, keeps a rewrite from being shaped to collide.
type lineSum struct {
	ok       bool  // a line was delivered (or found before a Start offset)
	off, len int64 // its offset and length without the '\n'
	sum      uint64
}

var sumSeed = maphash.MakeSeed()

// lineReader splits a file into complete lines with bounded memory: one read buffer,
// plus an accumulator (at most maxInline bytes) for a short line that straddles two
// reads, and a small buffer for the re-reads that check a line. A line longer than
// maxInline is scanned for its end without being kept; its SHA-256 is taken from the
// pass that reads it whole (Line.SHA256).
type lineReader struct {
	buf       []byte
	acc       []byte
	vbuf      []byte // re-reads (checks of delivered lines), so that buf keeps its chunk
	maxInline int64
	now       func() time.Time
	h         maphash.Hash
	sha       hash.Hash         // SHA-256 of a line not kept, made on its first such line
	digest    [sha256.Size]byte // the last one, which Line.SHA256 points at during emit
}

// maxCheckBuf bounds the buffer of the re-reads.
const maxCheckBuf = 64 << 10

func newLineReader(bufSize int, maxInline int64) *lineReader {
	lr := &lineReader{buf: make([]byte, bufSize), vbuf: make([]byte, min(bufSize, maxCheckBuf)), maxInline: maxInline, now: time.Now}
	lr.h.SetSeed(sumSeed)
	return lr
}

// errShortRead means the file ended before the size given to advance (it shrank while
// being read); what was read is delivered and the caller looks again.
var errShortRead = errors.New("file shorter than its size")

// advance reads r from t up to size, calls emit for every complete line in order, and
// moves t past each line emit accepts. It returns the bytes read and the first error
// of r or emit; after an error of emit, t points at the refused line.
//
// No line is delivered from bytes of two contents of the file. Before the first line
// that ends in a read is delivered, the last line delivered is checked again on r after
// that read (checkLast), so the read did not follow a rewrite; a line whose bytes came
// from more than one read is read again in one pass and delivered only if that pass
// agrees. Either check failing returns errRewritten. A line delivered without its bytes
// (longer than maxInline) carries the SHA-256 of the bytes so checked: of that one pass,
// or of the one read that held it whole.
func (lr *lineReader) advance(r io.ReaderAt, t *tail, size int64, emit func(Line) error) (int64, error) {
	if t.scanned < t.off {
		t.scanned = t.off
	}
	pos := t.off   // next byte to read
	big := false   // the current line is longer than maxInline: its bytes are not kept
	spans := false // the current line's bytes come from more than one read
	lr.acc = lr.acc[:0]
	if t.scanned-t.off > lr.maxInline {
		// Only the end of this line is needed: resume the scan where the last one stopped.
		pos, big, spans = t.scanned, true, true
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
		checked := false // t.last was checked after this read
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
				spans = true
				pos += int64(len(chunk))
				break
			}
			end := pos + int64(i) // offset of the '\n'
			if !checked {
				n, cerr := lr.checkLast(r, t.last)
				read += n
				if cerr != nil {
					t.scanned = t.off
					return read, cerr
				}
				checked = true
			}
			l := Line{Ordinal: t.ord, Offset: t.off, Len: end - t.off, Seen: seen, Src: r}
			if !big && l.Len <= lr.maxInline {
				if len(lr.acc) == 0 {
					l.Data = chunk[:i:i]
				} else {
					lr.acc = append(lr.acc, chunk[:i]...)
					l.Data = lr.acc
				}
			}
			var sum uint64
			if spans {
				s, n, cerr := lr.reread(r, l.Offset, l.Len, l.Data, l.Data == nil)
				read += n
				if cerr != nil {
					t.scanned = t.off
					return read, cerr
				}
				sum = s
			} else {
				// The whole line is in this chunk, also when it is longer than maxInline
				// (a read buffer larger than the inline limit) and Data is nil.
				sum = maphash.Bytes(sumSeed, chunk[:i])
				if l.Data == nil {
					lr.digest = sha256.Sum256(chunk[:i])
				}
			}
			if l.Data == nil {
				// The digest of the bytes just checked, which the sink's re-read must
				// find: a rewrite between the two reads would otherwise be mirrored
				// under this line.
				l.SHA256 = &lr.digest
			}
			if err := emit(l); err != nil {
				t.scanned = t.off
				return read, err
			}
			t.off, t.ord, t.scanned = end+1, t.ord+1, end+1
			t.last = lineSum{ok: true, off: l.Offset, len: l.Len, sum: sum}
			t.prefix = fold(t.prefix, t.last)
			pos = end + 1
			chunk = chunk[i+1:]
			lr.acc, big, spans = lr.acc[:0], false, false
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

// leadLines returns the lead of r within size (pisession.LeadBuffer: the rule the
// daemon and status share). The first line's being complete is len(lines) > 0.
func (lr *lineReader) leadLines(r io.ReaderAt, size int64) (lines [][]byte, more bool, read int64, err error) {
	// The first lines are short: read them in small pieces rather than a whole buffer's worth.
	if full := lr.buf; len(full) > headerChunk {
		lr.buf = full[:headerChunk]
		defer func() { lr.buf = full }()
	}
	var t tail
	var lead pisession.LeadBuffer
	stop := errors.New("stop")
	read, err = lr.advance(r, &t, size, func(l Line) error {
		if !lead.Add(l.Data, l.Len) {
			return stop
		}
		return nil
	})
	if err == stop || errors.Is(err, errShortRead) {
		err = nil
	}
	return lead.Lines, lead.More, read, err
}
