package session

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// This file is a validating JSON skimmer: it checks RFC 8259 syntax of a
// value without building anything, so that a multi-megabyte tool output in an
// entry costs one pass and no allocation. It is iterative, so a hostile line
// of a million '[' cannot blow the goroutine stack.

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// SWAR constants: one byte repeated over a 64-bit word.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// specialMask flags the bytes of w that end the fast path of a string:
// '"', '\\' and control characters. Only the lowest flag is exact (a borrow
// can set spurious flags above a real one), which is all scanString uses.
//
// Each of the three tests flags only a byte whose high bit is clear, and q and s have
// the high bits of w, so one "&^ w" serves all three: ten operations a word, not 14.
func specialMask(w uint64) uint64 {
	q := w ^ (lsb * '"')
	s := w ^ (lsb * '\\')
	return ((q - lsb) | (s - lsb) | (w - lsb*0x20)) &^ w & msb
}

// scanString validates a string whose contents start at i (just after the
// opening quote), eight bytes a word. It returns the index of the closing quote
// and whether the contents hold an escape; on an error, the offset the error
// names.
func scanString(b []byte, i int) (end int, esc bool, err error) {
	for {
		// Skip ordinary bytes sixteen, then eight at a time: strings are most of a line.
		for i+16 <= len(b) {
			w := b[i : i+16]
			m0, m1 := specialMask(binary.LittleEndian.Uint64(w)), specialMask(binary.LittleEndian.Uint64(w[8:]))
			if m0|m1 != 0 {
				if m0 == 0 {
					i += 8
					m0 = m1
				}
				i += bits.TrailingZeros64(m0) >> 3
				// Straight to the byte's handling: leaving by break through the loops
				// below (which would not move) measured slower than the 8-byte loop alone.
				goto special
			}
			i += 16
		}
		for i+8 <= len(b) {
			if m := specialMask(binary.LittleEndian.Uint64(b[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(b) && b[i] >= 0x20 && b[i] != '"' && b[i] != '\\' {
			i++
		}
	special:
		if i >= len(b) {
			return i, esc, malformed(i, "unterminated string")
		}
		switch b[i] {
		case '"':
			return i, esc, nil
		case '\\':
			esc = true
			if i+1 >= len(b) {
				return i, esc, malformed(i, "unterminated escape")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || hex4(b[i+2:i+6]) < 0 {
					return i, esc, malformed(i, "invalid \\u escape")
				}
				i += 6
			default:
				return i, esc, malformed(i, "invalid escape")
			}
		default:
			return i, esc, malformed(i, "control character in string")
		}
	}
}

// hex4 decodes four hex digits, or returns -1.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// skipValue validates the JSON value starting at b[i] (not whitespace) and
// returns the index just after it. Containers are tracked with one bit per
// level (1 = object) rather than recursion.
func skipValue(b []byte, i int) (int, error) {
	var stackBuf [8]uint64 // 512 levels before the stack spills to the heap
	stack := stackBuf[:0]
	depth := 0
	inObj := false
	var err error
	for {
		// Here a value must start at b[i].
		if i >= len(b) {
			return i, malformed(i, "unexpected end of line, expected value")
		}
		switch c := b[i]; c {
		case '"':
			if i, _, err = scanString(b, i+1); err != nil {
				return i, err
			}
			i++
		case '{', '[':
			w := depth >> 6
			if w == len(stack) {
				stack = append(stack, 0)
			}
			if inObj {
				stack[w] |= 1 << (depth & 63)
			} else {
				stack[w] &^= 1 << (depth & 63)
			}
			depth++
			inObj = c == '{'
			i = skipWS(b, i+1)
			if i < len(b) && (b[i] == '}' && inObj || b[i] == ']' && !inObj) {
				i++
				depth--
				inObj = stack[depth>>6]>>(depth&63)&1 == 1
				break
			}
			if inObj {
				if i, err = scanKey(b, i); err != nil {
					return i, err
				}
			}
			continue
		case 't':
			if !hasLiteral(b, i, "true") {
				return i, malformed(i, "invalid literal")
			}
			i += 4
		case 'f':
			if !hasLiteral(b, i, "false") {
				return i, malformed(i, "invalid literal")
			}
			i += 5
		case 'n':
			if !hasLiteral(b, i, "null") {
				return i, malformed(i, "invalid literal")
			}
			i += 4
		default:
			if c != '-' && (c < '0' || c > '9') {
				return i, malformed(i, "invalid character, expected value")
			}
			if i, err = scanNumber(b, i); err != nil {
				return i, err
			}
		}
		// Here a value has just ended: close containers until one continues.
		for {
			if depth == 0 {
				return i, nil
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return i, malformed(i, "unexpected end of line in container")
			}
			c := b[i]
			if c == ',' {
				i = skipWS(b, i+1)
				if inObj {
					if i, err = scanKey(b, i); err != nil {
						return i, err
					}
				}
				break
			}
			if c == '}' && inObj || c == ']' && !inObj {
				i++
				depth--
				inObj = depth > 0 && stack[depth>>6]>>(depth&63)&1 == 1
				continue
			}
			if inObj {
				return i, malformed(i, "expected ',' or '}' in object")
			}
			return i, malformed(i, "expected ',' or ']' in array")
		}
	}
}

// scanKey validates `"key" :` starting at b[i] and returns where the value
// starts.
func scanKey(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return i, malformed(i, "expected string key")
	}
	end, _, err := scanString(b, i+1)
	if err != nil {
		return end, err
	}
	i = skipWS(b, end+1)
	if i >= len(b) || b[i] != ':' {
		return i, malformed(i, "expected ':' after key")
	}
	return skipWS(b, i+1), nil
}

func hasLiteral(b []byte, i int, lit string) bool {
	return len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit
}

// scanNumber validates -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at b[i].
func scanNumber(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		return i, malformed(start, "invalid number")
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return j, malformed(start, "invalid number: no digit after '.'")
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return j, malformed(start, "invalid number: no digit in exponent")
		}
		i = j
	}
	return i, nil
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// appendUnquote appends the decoded contents of a string that scanString has
// validated. It follows encoding/json exactly (invalid UTF-8 and unpaired
// surrogates become U+FFFD) so that the fuzz target can compare the two and
// every Go consumer of the mirror sees the same ids.
func appendUnquote(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\':
			switch s[i+1] {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r := hex4(s[i+2:])
				i += 6
				if utf16.IsSurrogate(r) {
					r2 := rune(-1)
					if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
						r2 = hex4(s[i+2:])
					}
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						i += 6
						r = d
					} else {
						r = utf8.RuneError
					}
				}
				dst = utf8.AppendRune(dst, r)
				continue
			default: // '"', '\\', '/'
				dst = append(dst, s[i+1])
			}
			i += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			dst = utf8.AppendRune(dst, r)
			i += size
		}
	}
	return dst
}
