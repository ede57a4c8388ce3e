package session

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrMalformed is wrapped by every error of [ScanEntry]: the line is not one
// complete JSON object with a string "type", most often because a reader saw a
// torn tail or a crashed writer left a fragment.
var ErrMalformed = errors.New("malformed entry line")

// Envelope is what pisync reads of an entry line, without decoding or
// re-serializing the rest: the line itself is mirrored byte for byte.
type Envelope struct {
	Type      string
	ID        string // "" when absent (v1 entries)
	ParentID  string // "" when absent or null
	TargetID  string // leaf and label entries; "" when null or absent
	Timestamp string // "" when absent or not a string
}

// malformedError carries the reason and byte offset so that a log line can
// point at the exact spot of a torn or corrupted line.
type malformedError struct {
	off    int
	reason string
}

func (e *malformedError) Error() string {
	return ErrMalformed.Error() + ": " + e.reason + " at offset " + strconv.Itoa(e.off)
}

func (e *malformedError) Unwrap() error { return ErrMalformed }

func malformed(off int, reason string) error {
	return &malformedError{off: off, reason: reason}
}

// IsBlank reports whether line holds only spaces, tabs, "\r" (and a "\n" a
// caller may have left on): Pi's harness reader skips such lines, so pisync
// must neither publish them nor treat them as malformed.
func IsBlank(line []byte) bool {
	for _, c := range line {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return false
		}
	}
	return true
}

// The top-level keys ScanEntry extracts, indexing fields.
const (
	keyType = iota
	keyID
	keyParentID
	keyTargetID
	keyTimestamp
	numKeys
	keyOther = -1
)

// Kinds of a top-level value, enough to apply Pi's type checks.
const (
	kindAbsent = iota
	kindString
	kindNull
	kindOther
)

// field is where the last occurrence of a top-level key's value lies: with
// duplicate keys the last one wins, as in JSON.parse.
type field struct {
	start, end int // string contents, without quotes
	kind       uint8
	esc        bool // contents hold a backslash escape
}

// ScanEntry validates that line is ONE syntactically valid JSON object (RFC
// 8259, including every nested value; surrounding JSON whitespace such as a
// trailing "\r" is allowed) whose top-level "type" is a string, and extracts
// the top-level keys of [Envelope]. A non-string "id", or a "parentId" or
// "targetId" that is neither a string nor null, is an error. Keys of the same
// names inside nested values are ignored, and of duplicate keys the last wins,
// as in JSON.parse. Strings are unescaped like encoding/json does (invalid
// UTF-8 and lone surrogates become U+FFFD). Nesting depth is not limited
// (encoding/json stops at 10000) so as not to refuse a line Pi accepted.
//
// Errors wrap [ErrMalformed] and say why and at which byte offset. The
// returned strings never alias line, so callers may reuse their buffer.
//
// Every line of every session goes through it, so it is a single pass that
// allocates once for all the extracted strings together (not at all for a
// known type alone); only escaped strings longer than a small scratch buffer
// cost more.
func ScanEntry(line []byte) (Envelope, error) {
	var f [numKeys]field
	if err := scanObject(line, &f); err != nil {
		return Envelope{}, err
	}
	if err := checkFields(&f); err != nil {
		return Envelope{}, err
	}
	return envelope(line, &f), nil
}

// scanObject checks that line is exactly one JSON object and records where
// its interesting top-level values are.
func scanObject(b []byte, f *[numKeys]field) error {
	i := skipWS(b, 0)
	if i >= len(b) {
		return malformed(i, "empty line")
	}
	if b[i] != '{' {
		return malformed(i, "not a JSON object")
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			if i >= len(b) {
				return malformed(i, "unexpected end of line in object")
			}
			if b[i] != '"' {
				return malformed(i, "expected string key")
			}
			var err error
			if i, err = scanMember(b, i, f); err != nil {
				return err
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return malformed(i, "unexpected end of line in object")
			}
			if b[i] == ',' {
				i = skipWS(b, i+1)
				continue
			}
			if b[i] != '}' {
				return malformed(i, "expected ',' or '}' in object")
			}
			i++
			break
		}
	}
	if i = skipWS(b, i); i != len(b) {
		return malformed(i, "data after the end of the object")
	}
	return nil
}

// scanMember scans one "key": value member of an object starting at b[i] (the key's
// opening quote), records the value if its key is one the envelope keeps, and returns
// the offset after the value.
func scanMember(b []byte, i int, f *[numKeys]field) (int, error) {
	ks := i + 1
	ke, kesc, err := scanString(b, ks)
	if err != nil {
		return i, err
	}
	key := classifyKey(b[ks:ke], kesc)
	i = skipWS(b, ke+1)
	if i >= len(b) || b[i] != ':' {
		return i, malformed(i, "expected ':' after key")
	}
	i = skipWS(b, i+1)
	if i >= len(b) {
		return i, malformed(i, "unexpected end of line, expected value")
	}
	if b[i] == '"' {
		vs := i + 1
		ve, vesc, err := scanString(b, vs)
		if err != nil {
			return i, err
		}
		if key != keyOther {
			f[key] = field{start: vs, end: ve, kind: kindString, esc: vesc}
		}
		return ve + 1, nil
	}
	vs := i
	if i, err = skipValue(b, i); err != nil {
		return i, err
	}
	if key != keyOther {
		kind := uint8(kindOther)
		if b[vs] == 'n' { // skipValue accepted it, so it is null
			kind = kindNull
		}
		f[key] = field{start: vs, end: i, kind: kind}
	}
	return i, nil
}

// checkFields checks the kinds of the envelope's values: a string type, and id,
// parentId and targetId strings where present (the latter two may be null).
func checkFields(f *[numKeys]field) error {
	switch f[keyType].kind {
	case kindString:
	case kindAbsent:
		return malformed(0, "missing type")
	default:
		return malformed(f[keyType].start, "type is not a string")
	}
	if k := f[keyID].kind; k != kindAbsent && k != kindString {
		return malformed(f[keyID].start, "id is not a string")
	}
	if k := f[keyParentID].kind; k == kindOther {
		return malformed(f[keyParentID].start, "parentId is neither a string nor null")
	}
	if k := f[keyTargetID].kind; k == kindOther {
		return malformed(f[keyTargetID].start, "targetId is neither a string nor null")
	}
	return nil
}

// classifyKey maps a raw top-level key to the field it fills. An escaped key
// such as "\u0069d" still means "id" to JSON.parse, so it is decoded first.
func classifyKey(raw []byte, esc bool) int {
	if esc {
		// A key that decodes to at most 9 bytes has at most 9 escapes of 6
		// bytes; anything longer cannot be one of ours.
		if len(raw) > 54 {
			return keyOther
		}
		var buf [64]byte
		raw = appendUnquote(buf[:0], raw)
	}
	switch string(raw) {
	case "type":
		return keyType
	case "id":
		return keyID
	case "parentId":
		return keyParentID
	case "targetId":
		return keyTargetID
	case "timestamp":
		return keyTimestamp
	}
	return keyOther
}

// EntryTypes are the entry types Pi writes today (DESIGN §1). Pi adds types over time:
// a line of any other type is carried through untouched all the same.
var EntryTypes = []string{"message", "thinking_level_change", "model_change", "active_tools_change",
	"compaction", "branch_summary", "custom", "custom_message", "label", "session_info", "leaf"}

// IsEntryType reports whether t is one of EntryTypes.
func IsEntryType(t string) bool {
	_, ok := entryTypes[t]
	return ok && t != "session"
}

// entryTypes maps each of EntryTypes, and the header's type, to itself, so that the
// common case copies nothing for the type (a map index by string(bytes) does not
// allocate).
var entryTypes = func() map[string]string {
	m := make(map[string]string, len(EntryTypes)+1)
	for _, t := range append([]string{"session"}, EntryTypes...) {
		m[t] = t
	}
	return m
}()

// knownType returns raw as one of the constant strings of entryTypes.
func knownType(raw []byte) (string, bool) {
	t, ok := entryTypes[string(raw)]
	return t, ok
}

// envelope copies the extracted strings out of line into one allocation.
func envelope(b []byte, f *[numKeys]field) Envelope {
	var e Envelope
	t := &f[keyType]
	typeKnown := false
	if !t.esc {
		e.Type, typeKnown = knownType(b[t.start:t.end])
	}
	n := 0
	for k := range f {
		if f[k].kind == kindString && (k != keyType || !typeKnown) {
			n += f[k].end - f[k].start
		}
	}
	if n == 0 {
		return e
	}
	var sb strings.Builder
	sb.Grow(n)
	var off [numKeys][2]int
	for k := range f {
		if f[k].kind != kindString || (k == keyType && typeKnown) {
			continue
		}
		off[k][0] = sb.Len()
		raw := b[f[k].start:f[k].end]
		if f[k].esc || !utf8.Valid(raw) {
			var buf [256]byte
			sb.Write(appendUnquote(buf[:0], raw))
		} else {
			sb.Write(raw)
		}
		off[k][1] = sb.Len()
	}
	s := sb.String()
	get := func(k int) string {
		if f[k].kind != kindString {
			return ""
		}
		return s[off[k][0]:off[k][1]]
	}
	if !typeKnown {
		e.Type = get(keyType)
	}
	e.ID = get(keyID)
	e.ParentID = get(keyParentID)
	e.TargetID = get(keyTargetID)
	e.Timestamp = get(keyTimestamp)
	return e
}
