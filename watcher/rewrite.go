package watcher

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"io"
)

// Rewrite detection: a file is appended to, never rewritten, unless Pi migrates or
// repairs it. What was delivered must therefore still be there on every run; when it is
// not, the file is reopened as Truncated.

// fpBytes is the size of each sample of a fingerprint.
const fpBytes = 64

// fingerprint samples what was delivered last, to tell an append (the samples are
// unchanged) from a rewrite of the same size or larger (they differ): the first bytes
// of the last delivered line, where Pi puts the entry id, and the bytes just before the
// next line to deliver. The samples are kept as hashes, not copies: every file, idle or
// not, holds a fingerprint, and the two copies took a quarter of its watcher state. A
// changed sample goes unnoticed with odds of 2^-64, and the seed, random per process,
// keeps a rewrite from being shaped to collide.
type fingerprint struct {
	headOff int64 // offset of the last delivered line; -1 = unknown (resumed from a Start)
	head    uint64
	tail    uint64 // of the bytes ending at the next line to deliver, with the '\n' of the line before
}

var fpSeed = maphash.MakeSeed()

// readFP takes the fingerprint of t in r, reading the samples into scratch.
func readFP(r io.ReaderAt, t tail, scratch *[fpBytes]byte) (fp fingerprint, read int64, err error) {
	fp.headOff = t.prev
	if t.prev >= 0 && t.prev < t.off {
		b := scratch[:min(t.off-t.prev, fpBytes)]
		n, err := r.ReadAt(b, t.prev)
		if read += int64(n); err != nil {
			return fp, read, err
		}
		fp.head = maphash.Bytes(fpSeed, b)
	}
	b := scratch[:min(t.off, fpBytes)]
	n, err := r.ReadAt(b, t.off-int64(len(b)))
	fp.tail = maphash.Bytes(fpSeed, b[:n])
	return fp, read + int64(n), err
}

func (fp fingerprint) equal(o fingerprint) bool { return fp == o }

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

// sameContent reports whether what was delivered from s is still in the file: not
// shorter, the same header, and the same bytes just before the next line to deliver.
func (w *Watcher) sameContent(lr *lineReader, r io.ReaderAt, s *fileState, size int64) bool {
	ref := s.t.off
	if s.skip {
		ref = s.skipSize
	}
	if size < ref {
		return false
	}
	buf := lr.buf[:min(len(lr.buf), headerCheckBytes)]
	if s.header != nil {
		want := len(s.header) + 1
		n := min(want, len(buf))
		if size < int64(want) {
			return false
		}
		got, err := r.ReadAt(buf[:n], 0)
		w.addRead(int64(got))
		if err != nil && got < n {
			return false
		}
		if n == want {
			if !bytes.Equal(buf[:n-1], s.header) || buf[n-1] != '\n' {
				return false
			}
		} else if !bytes.Equal(buf[:n], s.header[:n]) {
			return false
		}
	}
	if !s.skip && s.t.off > 0 {
		fp, n, err := readFP(r, s.t, &lr.fpBuf)
		w.addRead(n)
		if err != nil || !fp.equal(s.fp) {
			return false
		}
	}
	return true
}
