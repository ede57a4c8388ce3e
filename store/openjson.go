package store

import (
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"
)

// An open reply carries up to about a megabyte of entry lines, each a JSON string. Encoding
// them with encoding/json cost a conversion to string, a Marshal to measure the entry and
// a second Marshal of the whole reply, then a validating pass over the result; the lines
// are written here once, straight into the reply, byte for byte as encoding/json writes
// them (TestAppendJSONString).

// appendJSONString appends s as a JSON string, as encoding/json writes a string (HTML
// characters and U+2028, U+2029 escaped). ok is false, and dst returned as it was, if s
// is not valid UTF-8: such a line is sent by reference.
func appendJSONString(dst, s []byte) ([]byte, bool) {
	const hex = "0123456789abcdef"
	start := len(dst)
	dst = slices.Grow(dst, len(s)+len(s)/8+2) // entry lines are JSON: a quote every few bytes
	dst = append(dst, '"')
	plain := 0 // s[plain:i] is copied as it is
	for i := 0; i < len(s); {
		// Most bytes are plain ASCII: skip them with one table look-up each.
		for i < len(s) && jsonClass[s[i]] == classPlain {
			i++
		}
		if i == len(s) {
			break
		}
		b := s[i]
		if jsonClass[b] == classEscape {
			dst = append(dst, s[plain:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default: // other control characters, and <, > and &
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			}
			i++
			plain = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			return dst[:start], false
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[plain:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			plain = i
			continue
		}
		i += size
	}
	dst = append(dst, s[plain:]...)
	return append(dst, '"'), true
}

// The classes of a byte for appendJSONString.
const (
	classPlain  = iota // ASCII that encoding/json writes as it is
	classEscape        // ASCII that it escapes
	classUTF8          // the start or continuation of a multi-byte sequence
)

// jsonClass is the class of each byte value.
var jsonClass = func() (t [256]uint8) {
	for b := 0; b < 256; b++ {
		switch {
		case b >= utf8.RuneSelf:
			t[b] = classUTF8
		case b < 0x20 || b == '"' || b == '\\' || b == '<' || b == '>' || b == '&':
			t[b] = classEscape
		}
	}
	return t
}()

// appendOpenEntry appends one entry of an open reply as encoding/json writes OpenEntry,
// with line as its line unless line is nil. ok is false, and dst returned as it was, if
// line is not valid UTF-8.
func appendOpenEntry(dst []byte, e OpenEntry, line []byte) (_ []byte, ok bool) {
	start := len(dst)
	dst = append(dst, `{"ordinal":`...)
	dst = strconv.AppendInt(dst, e.Ordinal, 10)
	if line != nil {
		dst = append(dst, `,"line":`...)
		if dst, ok = appendJSONString(dst, line); !ok {
			return dst[:start], false
		}
	}
	if e.Raw {
		dst = append(dst, `,"raw":true`...)
	}
	if e.Size != 0 {
		dst = append(dst, `,"size":`...)
		dst = strconv.AppendInt(dst, e.Size, 10)
	}
	if e.SHA256 != "" {
		dst = append(dst, `,"sha256":`...)
		dst, _ = appendJSONString(dst, []byte(e.SHA256))
	}
	return append(dst, '}'), true
}

// openReplyHead is the part of an open reply before its entries.
type openReplyHead struct {
	OK         bool    `json:"ok"`
	Meta       Meta    `json:"meta"`
	Head       *string `json:"head"`
	Generation int     `json:"generation"`
	LastSeq    uint64  `json:"lastSeq"`
}

func (r OpenReply) head() openReplyHead {
	return openReplyHead{r.OK, r.Meta, r.Head, r.Generation, r.LastSeq}
}

// replyJSON is the reply's body: the fields of OpenReply in its order, the entries as
// encoded by Open.
func (r OpenReply) replyJSON() ([]byte, error) {
	out := r.body
	if out == nil {
		head, err := json.Marshal(r.head())
		if err != nil {
			return nil, err
		}
		out = make([]byte, 0, len(head)+len(r.entries)+64)
		out = append(out, head[:len(head)-1]...) // without its closing brace
		out = append(out, `,"entries":[`...)
		out = append(out, r.entries...)
	}
	out = append(out, ']')
	if r.Next != nil {
		out = append(out, `,"next":{"after":`...)
		out = strconv.AppendInt(out, r.Next.After, 10)
		out = append(out, '}')
	}
	return append(out, '}'), nil
}

// MarshalJSON writes the reply as the service sends it.
func (r OpenReply) MarshalJSON() ([]byte, error) { return r.replyJSON() }
