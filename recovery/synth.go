package recovery

import (
	"bytes"
	"encoding/json"
	"path"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// PlaceholderType is the customType of a placeholder entry: it names pisync, and Pi
// projects a custom entry of an unknown customType into nothing, so a placeholder never
// reaches the model's context.
const PlaceholderType = "pisync.placeholder"

// fallbackTimestamp is used when no line carries a timestamp at all: Pi's harness
// refuses an entry or header without one.
const fallbackTimestamp = "1970-01-01T00:00:00.000Z"

// synthHeader is the header written when the mirror has none: the conversation id, the
// earliest entry timestamp, and the cwd from the heads metadata or, failing that,
// decoded from the source directory name. Its version follows the mirrored format
// (none for v1, 2 for v2, else 3): a v3 header over v1 entries without ids would make
// Pi read a broken tree instead of migrating the file. It also returns why the cwd is
// what it is, for the report.
func synthHeader(in Input, lines []Line, format, source string) (session.Header, []byte, string) {
	h := session.Header{ID: in.Key, Timestamp: earliestTimestamp(lines)}
	if _, ts, ok := session.ParseFileName(path.Base(source)); ok && ts != "" && len(lines) > 0 && lines[0].Ordinal == 0 {
		h.Timestamp = ts // a file without its header line: Pi named it after the time it was created
	}
	if in.Head != nil && in.Head.Conversation != "" {
		h.ID = in.Head.Conversation // the key differs from the id after a clash
	}
	cwdFrom := "cwd from the heads metadata"
	switch cwd, ok := session.CwdFromDirName(path.Base(path.Dir(source))); {
	case in.Head != nil && in.Head.Cwd != "":
		h.Cwd = in.Head.Cwd
	case source != "" && ok:
		h.Cwd, cwdFrom = cwd, "cwd decoded from the source directory name"
	default:
		// The harness refuses a header with an empty cwd; "/" keeps the file loadable.
		h.Cwd, cwdFrom = "/", "cwd unknown, set to /"
	}
	switch session.Format(format) {
	case session.FormatV1:
		h.Format = session.FormatV1
	case session.FormatV2:
		h.Version, h.Format = 2, session.FormatV2
	default:
		h.Version, h.Format = 3, session.FormatV3
	}
	return h, encodeHeader(h), cwdFrom
}

// encodeHeader writes a header with Pi's key order (type, version, id, timestamp, cwd).
func encodeHeader(h session.Header) []byte {
	type v1 struct {
		Type      string `json:"type"`
		ID        string `json:"id"`
		Timestamp string `json:"timestamp"`
		Cwd       string `json:"cwd"`
	}
	type vN struct {
		Type      string `json:"type"`
		Version   int    `json:"version"`
		ID        string `json:"id"`
		Timestamp string `json:"timestamp"`
		Cwd       string `json:"cwd"`
	}
	if h.Format == session.FormatV1 {
		return marshalLine(v1{"session", h.ID, h.Timestamp, h.Cwd})
	}
	return marshalLine(vN{"session", h.Version, h.ID, h.Timestamp, h.Cwd})
}

// placeholderData is the data of a placeholder entry: what was missing and why.
type placeholderData struct {
	MissingID  string `json:"missingId"`
	ReferredBy string `json:"referredBy"`
	Reason     string `json:"reason"`
	Generation int    `json:"generation"`
}

// placeholderLine is a Pi custom entry standing for a missing entry, with exactly its id.
func placeholderLine(id, parent, timestamp string, data placeholderData) []byte {
	var p *string
	if parent != "" {
		p = &parent
	}
	return marshalLine(struct {
		Type       string          `json:"type"`
		ID         string          `json:"id"`
		ParentID   *string         `json:"parentId"`
		Timestamp  string          `json:"timestamp"`
		CustomType string          `json:"customType"`
		Data       placeholderData `json:"data"`
	}{"custom", id, p, timestamp, PlaceholderType, data})
}

// v1PlaceholderLine stands for a missing line of a version-1 file. Such files name
// entries by position (a compaction's firstKeptEntryIndex counts lines), so a lost line
// must keep its place; it has no id, like every v1 entry, and Pi's migration chains it
// like any other.
func v1PlaceholderLine(timestamp string, data placeholderData) []byte {
	return marshalLine(struct {
		Type       string          `json:"type"`
		Timestamp  string          `json:"timestamp"`
		CustomType string          `json:"customType"`
		Data       placeholderData `json:"data"`
	}{"custom", timestamp, PlaceholderType, data})
}

// marshalLine encodes v as one line without HTML escaping (Pi writes JSON.stringify,
// which does not escape <, > or &).
func marshalLine(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // plain structs of strings and ints cannot fail
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// earliestTimestamp is the earliest entry timestamp among lines (the original string),
// else the earliest time a line was stored in the mirror, else the fallback.
func earliestTimestamp(lines []Line) string {
	var best time.Time
	bestStr := ""
	for _, l := range lines {
		if !l.HasEnv || l.Env.Timestamp == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, l.Env.Timestamp)
		if err != nil {
			continue
		}
		if bestStr == "" || t.Before(best) {
			best, bestStr = t, l.Env.Timestamp
		}
	}
	if bestStr != "" {
		return bestStr
	}
	for _, l := range lines {
		if !l.Time.IsZero() && (best.IsZero() || l.Time.Before(best)) {
			best = l.Time
		}
	}
	if !best.IsZero() {
		return best.UTC().Format("2006-01-02T15:04:05.000Z")
	}
	return fallbackTimestamp
}

// synthLine is an output line made by recovery (header or placeholder).
func synthLine(b []byte) OutLine {
	return OutLine{Data: b, SHA256: session.Digest(b), Size: int64(len(b)), Ordinal: -1}
}

// headFor returns the head when it describes the generation being rebuilt.
func headFor(in Input) *mirror.Head {
	if in.Head != nil && in.Head.Generation == in.Generation {
		return in.Head
	}
	return nil
}
