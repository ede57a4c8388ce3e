//go:build !purego

package session

import (
	"math/bits"

	"golang.org/x/sys/cpu"
)

// useSIMD selects scanStringSIMD; tests turn it off to run the SWAR path.
var useSIMD = cpu.X86.HasAVX2

// windowMasks looks at b 64 bytes at a time, while 64 remain, for the first
// window holding a '"', a '\\' or a byte below 0x20. It returns the window's
// offset in b and, bit k for b[off+k], which of its bytes are '"', '\\', below
// 0x20, and none of the bytes that may follow a backslash but 'u' (bad). When
// fewer than 64 bytes remain without one, it returns their offset and zero
// masks. It needs AVX2.
//
//go:noescape
func windowMasks(b []byte) (off int, quote, bslash, ctl, bad uint64)

// scanStringSIMD is scanString a 64-byte window at a time, each classified
// once by windowMasks rather than searched again after every escape.
//
// A window starts where no escape is under way, so which of its bytes are
// escaped follows from the runs of backslashes alone: the closing quote is the
// first unescaped '"', and only the bytes escaped before it need checking. A
// window whose escapes are all simple (not \u, not invalid, not running past
// it) is settled by bit operations; any other is walked special byte by
// special byte, exactly as scanStringSWAR does.
func scanStringSIMD(b []byte, i int) (end int, esc bool, err error) {
	if len(b) < 64 {
		return scanStringSWAR(b, i)
	}
	for {
		var quote, bslash, ctl, bad uint64
		n := 64 // bytes of b the window covers from i
		switch {
		case len(b)-i >= 64:
			var off int
			off, quote, bslash, ctl, bad = windowMasks(b[i:])
			i += off
			if quote|bslash|ctl == 0 {
				continue // fewer than 64 bytes are left
			}
		case i >= len(b):
			return i, esc, malformed(i, "unterminated string")
		default:
			// The last 64 bytes of b, shifted so that bit 0 is b[i].
			s := len(b) - 64
			_, quote, bslash, ctl, bad = windowMasks(b[s:])
			sh := uint(i - s)
			quote, bslash, ctl, bad = quote>>sh, bslash>>sh, ctl>>sh, bad>>sh
			n = len(b) - i
		}

		escaped, past := escapedBytes(bslash)
		past |= escaped >> uint(n) & 1 // the last byte of a short window escapes b[len(b)]
		stop := quote&^escaped | ctl
		upTo := stop ^ (stop - 1) // the bits up to and including the first of stop; all without one
		if escaped&bad&upTo == 0 && (stop != 0 || past == 0) {
			esc = esc || bslash&upTo != 0
			if stop == 0 {
				i += n
				continue
			}
			k := i + bits.TrailingZeros64(stop)
			if b[k] == '"' {
				return k, esc, nil
			}
			return k, esc, malformed(k, "control character in string")
		}

		// The walk of a window: its special bytes in turn.
		m := quote | bslash | ctl
		next := i // where the last escape of the window ends
		for m != 0 {
			j := bits.TrailingZeros64(m)
			k := i + j
			c := b[k]
			if c == '\\' {
				esc = true
				m &= m - 1
				if k+1 < len(b) && simpleEscape[b[k+1]] {
					m &^= 2 << uint(j&63) // 0 when the escaped byte is past the window
					next = k + 2
					continue
				}
				if next, err = skipEscape(b, k); err != nil {
					return k, esc, err
				}
				continue
			}
			if c == '"' {
				return k, esc, nil
			}
			return k, esc, malformed(k, "control character in string")
		}
		i = max(i+n, next)
	}
}

// escapedBytes returns the bits of the bytes that a backslash escapes, given
// the backslashes of a window in which no escape is under way at bit 0, and
// whether the byte after the window is escaped: in a run of backslashes, every
// second one escapes the next byte. This is simdjson's odd-run trick: adding
// the starts of the runs that begin on odd bits carries through those runs,
// which flips their parity relative to the even bits.
func escapedBytes(bslash uint64) (escaped, past uint64) {
	const even = 0x5555555555555555
	follows := bslash << 1
	oddStarts := bslash &^ even &^ follows
	evenRuns, carry := bits.Add64(oddStarts, bslash, 0)
	return (even ^ evenRuns<<1) & follows, carry
}

// simpleEscape holds the bytes that may follow a backslash, but for 'u'.
var simpleEscape = [256]bool{'"': true, '\\': true, '/': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}
