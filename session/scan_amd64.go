//go:build !purego

package session

import (
	"encoding/binary"
	"math/bits"

	"golang.org/x/sys/cpu"
)

// useSIMD selects scanStringSIMD; tests turn it off to run the SWAR path.
var useSIMD = cpu.X86.HasAVX2

// scanWindows scans the string contents b[i:], where no escape is under way,
// for its end a 64-byte window at a time (the last window being the last 64
// bytes of b, less those before i). In each, which bytes are escaped follows
// from the runs of backslashes alone, so the first unescaped '"' or control
// byte is found by bit operations, and it is enough to check that the bytes
// escaped before it are ones a simple escape allows. A window where one is
// not (a \u escape or an invalid one), or whose last byte escapes the next,
// is returned to be walked: k is its start, n its length and m its special
// bytes. Otherwise m is 0 and k the first unescaped '"' or control byte, or
// len(b). esc says whether b[i:k] holds a backslash. It needs AVX2 and
// len(b) >= 64.
//
//go:noescape
func scanWindows(b []byte, i int) (k int, m uint64, n int, esc bool)

// scanStringSIMD is scanString with scanWindows, walking the special bytes of a
// window in turn only where scanWindows cannot settle it.
func scanStringSIMD(b []byte, i int) (end int, esc bool, err error) {
	if len(b) < 64 {
		return scanStringSWAR(b, i)
	}
	// Most strings of a line are short keys and values: one SWAR step settles
	// those that end within 16 bytes without an escape, for less than a call.
	if i+16 <= len(b) {
		w := b[i : i+16]
		k := i
		m := specialMask(binary.LittleEndian.Uint64(w))
		if m == 0 {
			k += 8
			m = specialMask(binary.LittleEndian.Uint64(w[8:]))
		}
		if k += bits.TrailingZeros64(m) >> 3; m != 0 && b[k] == '"' {
			return k, false, nil
		}
	}
	for {
		k, m, n, e := scanWindows(b, i)
		esc = esc || e
		if m == 0 {
			if k >= len(b) {
				return k, esc, malformed(k, "unterminated string")
			}
			if b[k] == '"' {
				return k, esc, nil
			}
			return k, esc, malformed(k, "control character in string")
		}
		i = k
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
				if k+6 <= len(b) && b[k+1] == 'u' && hex4(b[k+2:k+6]) >= 0 {
					next = k + 6
					continue
				}
				// An invalid escape: the SWAR scan reports it.
				end, _, err = scanStringSWAR(b, k)
				return end, esc, err
			}
			if c == '"' {
				return k, esc, nil
			}
			return k, esc, malformed(k, "control character in string")
		}
		i = max(i+n, next)
	}
}

// simpleEscape holds the bytes that may follow a backslash, but for 'u'.
var simpleEscape = [256]bool{'"': true, '\\': true, '/': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}
