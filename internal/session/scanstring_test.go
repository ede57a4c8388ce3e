package session

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// sameScan fails t unless scanString and scanStringRef agree on a string
// whose contents start at b[i]: the same end, escape flag and error (which
// names its offset).
func sameScan(t *testing.T, b []byte, i int) {
	t.Helper()
	end, esc, err := scanString(b, i)
	wantEnd, wantEsc, wantErr := scanStringRef(b, i)
	if end != wantEnd || esc != wantEsc || errString(err) != errString(wantErr) {
		t.Fatalf("scanString(%q, %d) = %d, %v, %v; a byte at a time: %d, %v, %v",
			b, i, end, esc, err, wantEnd, wantEsc, wantErr)
	}
}

// scanStringRef is scanString one byte at a time, as the JSON grammar reads: the
// reference the word-at-a-time scan is held to.
func scanStringRef(b []byte, i int) (end int, esc bool, err error) {
	for ; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i, esc, nil
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				return i, esc, malformed(i, "unterminated escape")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if i+6 > len(b) || strings.Trim(string(b[i+2:i+6]), "0123456789abcdefABCDEF") != "" {
					return i, esc, malformed(i, "invalid \\u escape")
				}
				i += 5
			default:
				return i, esc, malformed(i, "invalid escape")
			}
		case c < 0x20:
			return i, esc, malformed(i, "control character in string")
		}
	}
	return i, esc, malformed(i, "unterminated string")
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestScanStringPaths compares scanString with the reference on random strings
// dense in the bytes they treat specially, from every start, around its 8- and
// 16-byte words and the ends of lines.
func TestScanStringPaths(t *testing.T) {
	const alphabet = "\"\\\\\\u0aF9/bfnrtxé\x01\x1f\x7f\xff "
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, 0, 300)
	for range 4000 {
		b = b[:rng.IntN(cap(b))]
		for k := range b {
			if rng.IntN(4) == 0 {
				b[k] = alphabet[rng.IntN(len(alphabet))]
			} else {
				b[k] = 'a' + byte(rng.IntN(26))
			}
		}
		for i := 0; i <= len(b); i++ {
			sameScan(t, b, i)
		}
	}
}

// FuzzScanString compares scanString with the reference on any bytes, from
// every start.
func FuzzScanString(f *testing.F) {
	f.Add([]byte(`0123456789012345678901234567890123456789012345678901234567890\"\\\/\b\f\n\r\t\u00e9x"`))
	f.Add([]byte(`0123456789012345678901234567890123456789012345678901234567890123\\\"`))
	f.Add([]byte(`01234567890123456789012345678901234567890123456789012345678901\u12`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for i := 0; i <= len(b); i++ {
			sameScan(t, b, i)
		}
	})
}

// TestScanStringBackslashRuns compares scanString with the reference on runs of
// backslashes of every length ending at every byte of the first words, and on
// what follows the run: which bytes a run escapes depends on its parity.
func TestScanStringBackslashRuns(t *testing.T) {
	for _, after := range []string{`"`, `n`, `u0041"`, `u00"`, `x"`, "\x01", `\"`, ``} {
		for run := 1; run <= 9; run++ {
			for end := run; end <= 140; end++ {
				b := []byte(strings.Repeat("a", end-run) + strings.Repeat(`\`, run) + after)
				sameScan(t, b, 0)
				sameScan(t, append(b, strings.Repeat("b", 70)+`"`...), 0)
			}
		}
	}
}
