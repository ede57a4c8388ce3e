package store

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// stringified checks that line is what JavaScript's JSON.stringify writes for one object
// (Pi writes every line so): UTF-8, from `{` to `}`, with no white space or control
// character outside its strings. The JSON itself is checked by the line's parser; what
// this refuses is what a parser lets through and a file cannot hold as one line: a raw
// newline between tokens makes a recovered file show a second, perhaps valid, entry the
// store never saw.
func stringified(line []byte) error {
	if len(line) == 0 || line[0] != '{' || line[len(line)-1] != '}' {
		return fmt.Errorf("not one JSON object as JSON.stringify writes it: it must start with { and end with }")
	}
	if !utf8.Valid(line) {
		return fmt.Errorf("not UTF-8")
	}
	in, esc := false, false
	for i, b := range line {
		switch {
		case esc:
			esc = false
		case in && b == '\\':
			esc = true
		case b == '"':
			in = !in
		case b <= ' ' && !in:
			return fmt.Errorf("white space or a control character (0x%02x) at byte %d, between JSON tokens: JSON.stringify writes none", b, i)
		}
	}
	return nil
}

// pathSafe checks a header field that becomes part of a file name in Pi's layout (the
// session id, the timestamp): a value that names another directory would make `recover`
// or a client's sessionsRoot write outside the root.
func pathSafe(field, v string) error {
	if strings.ContainsAny(v, `/\`) || strings.Contains(v, "..") ||
		strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
		return fmt.Errorf("%s %q: /, \\, .. and control characters are not allowed", field, v)
	}
	return nil
}
