package session

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// ErrNotSession is wrapped by every error of [ParseHeader]: the line cannot be
// the first line of a Pi session file, so the file is not one pisync mirrors.
var ErrNotSession = errors.New("not a pi session header")

// Format is the on-disk format of a session file, read from its header.
type Format string

// The formats Pi has written. A header with a version above 3 gets its own
// "v<N>" so that callers can refuse what they do not know instead of guessing.
const (
	FormatV1 Format = "v1" // legacy: header without "version"; entries without id/parentId
	FormatV2 Format = "v2"
	FormatV3 Format = "v3"
)

// Header is line 1 of a session file.
type Header struct {
	ID            string // conversation id
	Version       int    // 0 when absent (v1)
	Timestamp     string
	Cwd           string
	ParentSession string
	Format        Format // v1 when version absent or 1, v2 for 2, v3 for 3, "v<N>" above
}

// ParseHeader parses line 1 of a session file. It accepts a trailing "\r"
// (and any JSON whitespace around the object). It fails, wrapping
// [ErrNotSession], when the line is not a JSON object, its type is not
// "session", its id is missing, empty or not a string, or its version is not
// an integer. Unknown fields, such as the harness's "metadata", are ignored,
// and so are timestamp, cwd and parentSession when they are not strings: Pi's
// CLI opens such files, so pisync must mirror them.
func ParseHeader(line []byte) (Header, error) {
	// A map rather than a struct: encoding/json matches struct fields
	// case-insensitively, and JSON.parse does not ("ID" is not "id").
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil || m == nil {
		return Header{}, fmt.Errorf("%w: not a JSON object", ErrNotSession)
	}
	if str(m["type"]) != "session" {
		return Header{}, fmt.Errorf("%w: type is not \"session\"", ErrNotSession)
	}
	h := Header{
		ID:            str(m["id"]),
		Timestamp:     str(m["timestamp"]),
		Cwd:           str(m["cwd"]),
		ParentSession: str(m["parentSession"]),
	}
	if h.ID == "" {
		return Header{}, fmt.Errorf("%w: id is missing, empty or not a string", ErrNotSession)
	}
	if v, ok := m["version"]; ok && string(v) != "null" {
		var f float64
		// JSON.parse reads 3.0 and 3e0 as 3, so they are version 3 to Pi too.
		if err := json.Unmarshal(v, &f); err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<30 {
			return Header{}, fmt.Errorf("%w: version %s is not an integer", ErrNotSession, v)
		}
		h.Version = int(f)
	}
	h.Format = formatOf(h.Version)
	return h, nil
}

// formatOf follows the CLI's migrateToCurrentVersion, which treats every
// version below 2 (and a missing one) as v1.
func formatOf(v int) Format {
	switch {
	case v <= 1:
		return FormatV1
	case v == 2:
		return FormatV2
	case v == 3:
		return FormatV3
	}
	return Format("v" + strconv.Itoa(v))
}

// str returns the value of a JSON string, or "" for anything else.
func str(raw json.RawMessage) string {
	if len(raw) == 0 || raw[0] != '"' {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}
