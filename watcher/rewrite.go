package watcher

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
)

// Rewrite detection. Pi appends to a session file and rewrites it whole only when it
// migrates or repairs it: in place (open with truncation, then one write per entry) or,
// in newer versions, by atomic rename (a new FileID: Replaced). What was delivered must
// therefore still be there, byte for byte, every time the file is read; when it is not,
// the file is reopened as Truncated, which the sink turns into a new generation.
//
// On every run (one per event or rescan) the watcher compares, on the descriptor it
// reads with: the size with the delivered offset (and with the size of the last run),
// the header line (up to 4 KiB), and the digest of the whole last delivered line with
// its '\n', and the '\n' before it. Inside a run, the last delivered line is checked
// again after every read that completes a line, before that line is delivered, and a
// line assembled from several reads is read again in one pass. So the cost per event is
// one read of the header and two of the last delivered line (its first byte's
// predecessor, then the line: a few KiB for Pi's usual entries), plus, per 256 KiB read,
// those two reads again. A rewrite that keeps the header and the last delivered line but
// changes an earlier line is found by the settled check (settle.go).

// errRewritten means bytes already delivered (or read for the line being delivered)
// changed while the file was being read: the file is reopened as Truncated.
var errRewritten = errors.New("file rewritten while it was read")

// checkLast reads the line last delivered (with its '\n') again and compares its digest.
// It also checks that a '\n' comes just before it: a rewrite that moved the lines one
// byte on would otherwise pass for an empty line (its '\n' is now the previous line's),
// and the empty line would be delivered again at the next ordinal: one line more than
// the file holds.
func (lr *lineReader) checkLast(r io.ReaderAt, last lineSum) (int64, error) {
	if !last.ok {
		return 0, nil
	}
	var read int64
	if last.off > 0 {
		b := lr.vbuf[:1]
		got, err := r.ReadAt(b, last.off-1)
		read += int64(got)
		if got < 1 {
			if err == nil || errors.Is(err, io.EOF) {
				return read, fmt.Errorf("%w: file shorter than offset %d", errRewritten, last.off)
			}
			return read, err
		}
		if b[0] != '\n' {
			return read, fmt.Errorf("%w: line at offset %d no longer starts a line", errRewritten, last.off)
		}
	}
	sum, n, err := lr.reread(r, last.off, last.len, nil, false)
	read += n
	if err != nil {
		return read, err
	}
	if sum != last.sum {
		return read, fmt.Errorf("%w: line at offset %d changed", errRewritten, last.off)
	}
	return read, nil
}

// reread reads the line of length n at off again in one pass, with the '\n' that ends
// it, and returns its digest; with digest set, it also leaves the line's SHA-256 in
// lr.digest. It fails with errRewritten when the pass finds a '\n' inside the line, no
// '\n' after it, the file ending early, or bytes other than want (when want is not
// nil).
func (lr *lineReader) reread(r io.ReaderAt, off, n int64, want []byte, digest bool) (uint64, int64, error) {
	lr.h.Reset()
	if digest {
		if lr.sha == nil {
			lr.sha = sha256.New()
		}
		lr.sha.Reset()
	}
	var read int64
	for done := int64(0); done <= n; {
		k := min(int64(len(lr.vbuf)), n+1-done)
		b := lr.vbuf[:k]
		got, err := r.ReadAt(b, off+done)
		read += int64(got)
		if got < len(b) {
			if err == nil || errors.Is(err, io.EOF) {
				return 0, read, fmt.Errorf("%w: line at offset %d is cut short", errRewritten, off)
			}
			return 0, read, err
		}
		body := b
		if done+k > n {
			body = b[:len(b)-1] // the '\n'
			if b[len(b)-1] != '\n' {
				return 0, read, fmt.Errorf("%w: line at offset %d no longer ends where it did", errRewritten, off)
			}
		}
		if bytes.IndexByte(body, '\n') >= 0 {
			return 0, read, fmt.Errorf("%w: line at offset %d split", errRewritten, off)
		}
		if want != nil && !bytes.Equal(body, want[done:done+int64(len(body))]) {
			return 0, read, fmt.Errorf("%w: line at offset %d changed while it was read", errRewritten, off)
		}
		lr.h.Write(body)
		if digest {
			lr.sha.Write(body)
		}
		done += k
	}
	if digest {
		lr.sha.Sum(lr.digest[:0])
	}
	return lr.h.Sum64(), read, nil
}

// lineBefore finds and digests the line that ends just before off (off > 0 is just
// after a newline): the anchor of a tail resumed from a Start.
func (lr *lineReader) lineBefore(r io.ReaderAt, off int64) (lineSum, int64, error) {
	start, read := int64(0), int64(0)
	for end := off - 1; end > 0; {
		k := min(int64(len(lr.vbuf)), end)
		b := lr.vbuf[:k]
		got, err := r.ReadAt(b, end-k)
		read += int64(got)
		if got < len(b) {
			if err == nil || errors.Is(err, io.EOF) {
				err = fmt.Errorf("%w: file shorter than offset %d", errRewritten, off)
			}
			return lineSum{}, read, err
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			start = end - k + int64(i) + 1
			break
		}
		end -= k
	}
	sum, n, err := lr.reread(r, start, off-1-start, nil, false)
	return lineSum{ok: true, off: start, len: off - 1 - start, sum: sum}, read + n, err
}

// checkStart verifies that a Start fits the file: within it, just after a newline.
func checkStart(r io.ReaderAt, st Start, size int64) error {
	if st.Offset < 0 || st.Ordinal < 0 || st.Offset > size {
		return fmt.Errorf("start offset %d is outside the file (size %d)", st.Offset, size)
	}
	if st.Offset == 0 {
		return nil
	}
	var b [1]byte
	if _, err := r.ReadAt(b[:], st.Offset-1); err != nil {
		return err
	}
	if b[0] != '\n' {
		return fmt.Errorf("start offset %d is not at the beginning of a line", st.Offset)
	}
	return nil
}

// headerCheckBytes bounds how much of the header is compared on each run.
const headerCheckBytes = 4096

// headerSum is the digest of the header line a file was opened with, which every run
// compares with the file (sameContent). Every file, idle or not, holds one: a hash
// rather than a copy of the line, as for the last line delivered (lineSum).
type headerSum struct {
	want int64  // the header's length with its '\n'; 0 when not known (longer than MaxInlineBytes)
	sum  uint64 // maphash of its first headerCheckLen(want) bytes
}

// headerCheckLen is how much of a header of want bytes (its '\n' included) is compared.
func (lr *lineReader) headerCheckLen(want int64) int {
	return int(min(want, int64(min(len(lr.buf), headerCheckBytes))))
}

// sumHeader is the headerSum of hdr (without its '\n'; nil: not known).
func (lr *lineReader) sumHeader(hdr []byte) headerSum {
	if hdr == nil {
		return headerSum{}
	}
	want := int64(len(hdr)) + 1
	n := lr.headerCheckLen(want)
	lr.h.Reset()
	lr.h.Write(hdr[:min(n, len(hdr))])
	if n == int(want) {
		lr.h.WriteByte('\n')
	}
	return headerSum{want: want, sum: lr.h.Sum64()}
}

// sameContent reports whether what was delivered from s is still in the file: not
// shorter, the same header, and the same last delivered line where it was.
func (w *Watcher) sameContent(lr *lineReader, r io.ReaderAt, s *fileState, size int64) contentCheck {
	skip := s.phase == skipped
	ref := s.t.off
	if skip {
		ref = s.skipSize
	}
	if size < ref {
		return contentShorter
	}
	if want := s.header.want; want > 0 {
		if size < want {
			return contentShorter
		}
		n := lr.headerCheckLen(want)
		buf := lr.buf[:n]
		got, err := r.ReadAt(buf, 0)
		w.addRead(int64(got))
		if err != nil && got < n {
			return contentShorter
		}
		lr.h.Reset()
		lr.h.Write(buf)
		if lr.h.Sum64() != s.header.sum {
			return contentHeader
		}
	}
	if !skip {
		n, err := lr.checkLast(r, s.t.last)
		w.addRead(n)
		if err != nil {
			return contentLastLine
		}
	}
	return contentSame
}
