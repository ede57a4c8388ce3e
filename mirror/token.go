package mirror

import (
	"errors"
	"fmt"
	"strings"
)

// MaxTokenLen bounds an encoded subject token. NATS has no hard subject limit, but a
// control line must fit in the server's max_control_line (4 KiB by default) and a KV key
// in a stream subject; ids from Pi are UUIDs or 8+ hex characters, far below this.
const MaxTokenLen = 255

// ErrBadToken is returned for a token that is empty or too long once encoded.
var ErrBadToken = errors.New("invalid subject token")

// EncodeToken encodes s for use as one subject token, KV key token or object-name part.
// Bytes in [A-Za-z0-9-] stay as they are; every other byte, '_' included, becomes '_'
// followed by two upper-case hex digits. The result is therefore always in
// [A-Za-z0-9_-], never contains '.', '*', '>' or whitespace, and decodes back exactly
// (DecodeToken), for any byte string, UTF-8 or not.
func EncodeToken(s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("%w: empty", ErrBadToken)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if plainTokenByte(s[i]) {
			n++
		} else {
			n += 3
		}
	}
	if n > MaxTokenLen {
		return "", fmt.Errorf("%w: %d bytes encoded, the limit is %d", ErrBadToken, n, MaxTokenLen)
	}
	if n == len(s) {
		return s, nil
	}
	var b strings.Builder
	b.Grow(n)
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plainTokenByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('_')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0x0f])
	}
	return b.String(), nil
}

// DecodeToken reverses EncodeToken. It refuses anything EncodeToken cannot produce, so
// that every token has exactly one spelling.
func DecodeToken(tok string) (string, error) {
	if tok == "" {
		return "", fmt.Errorf("%w: empty", ErrBadToken)
	}
	if strings.IndexByte(tok, '_') < 0 {
		for i := 0; i < len(tok); i++ {
			if !plainTokenByte(tok[i]) {
				return "", fmt.Errorf("%w: byte %q at %d", ErrBadToken, tok[i], i)
			}
		}
		return tok, nil
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case plainTokenByte(c):
			out = append(out, c)
		case c == '_' && i+2 < len(tok):
			hi, ok1 := upperHexValue(tok[i+1])
			lo, ok2 := upperHexValue(tok[i+2])
			v := hi<<4 | lo
			if !ok1 || !ok2 || plainTokenByte(v) {
				return "", fmt.Errorf("%w: bad escape at %d", ErrBadToken, i)
			}
			out = append(out, v)
			i += 2
		default:
			return "", fmt.Errorf("%w: byte %q at %d", ErrBadToken, c, i)
		}
	}
	return string(out), nil
}

func plainTokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

func upperHexValue(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
