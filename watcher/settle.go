package watcher

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
)

// The settled check. The checks of every run (rewrite.go) compare the header and the last
// delivered line; a rewrite that keeps both but changes a line before them (the same
// length, the same line boundaries) passes them. So a file that changed is read once
// more, whole up to the delivered offset, when it has been quiet for
// Options.SettleDelay, and its lines' digests, folded in order, are compared with the
// fold of the lines delivered. Cost: one read of the delivered bytes per quiet period
// after a change (an idle file costs nothing; a file appended to without pause is
// checked when the appends pause); memory: 9 bytes per file.

// fold adds one line's digest to the digest of the lines before it.
func fold(prefix uint64, l lineSum) uint64 {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:], prefix)
	binary.LittleEndian.PutUint64(b[8:], l.sum)
	binary.LittleEndian.PutUint64(b[16:], uint64(l.len))
	return maphash.Bytes(sumSeed, b[:])
}

// prefixOf folds the digests of the lines of r before end (just after a '\n') and counts
// them.
func (lr *lineReader) prefixOf(r io.ReaderAt, end int64) (prefix uint64, lines, read int64, err error) {
	lr.h.Reset()
	start := int64(0) // of the current line
	for pos := int64(0); pos < end; {
		b := lr.buf[:min(int64(len(lr.buf)), end-pos)]
		got, err := r.ReadAt(b, pos)
		read += int64(got)
		if got < len(b) {
			if err == nil || errors.Is(err, io.EOF) {
				err = fmt.Errorf("%w: file shorter than offset %d", errRewritten, end)
			}
			return 0, 0, read, err
		}
		at := pos // offset of b[0]
		pos += int64(len(b))
		for {
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				lr.h.Write(b)
				break
			}
			lr.h.Write(b[:i])
			nl := at + int64(i)
			prefix = fold(prefix, lineSum{len: nl - start, sum: lr.h.Sum64()})
			lines++
			lr.h.Reset()
			start, at, b = nl+1, nl+1, b[i+1:]
		}
	}
	if start != end {
		return 0, 0, read, fmt.Errorf("%w: no line ends at offset %d", errRewritten, end)
	}
	return prefix, lines, read, nil
}

// prefixCheck is the outcome of samePrefix.
type prefixCheck int

const (
	prefixUnchecked prefixCheck = iota
	prefixSame
	prefixDiffers // a delivered line changed: a rewrite
	prefixUnknown // a tail resumed from a Start: nothing to compare with
)

// samePrefix reports whether every line delivered from s is still in the file, byte for
// byte. A tail resumed from a Start has no fold of the lines before it: the caller
// reopens it as Rechecked, and the sink compares the whole file with what it mirrored
// (once per file that changes after a start, not a read of every file at start).
func (w *Watcher) samePrefix(lr *lineReader, r io.ReaderAt, s *fileState) prefixCheck {
	if !s.t.prefixOK {
		return prefixUnknown
	}
	prefix, lines, n, err := lr.prefixOf(r, s.t.off)
	w.addRead(n)
	if err != nil || prefix != s.t.prefix || lines != s.t.ord {
		return prefixDiffers
	}
	return prefixSame
}
