package session

import (
	"strings"
	"time"
)

// How a session file begins. Pi writes its header first, but the files met in the
// field also begin otherwise: oh-my-pi writes a "title" record before the header (Pi
// #8880), and Pi recreates a file deleted under a running session, or appends to one
// whose header it refused, without a header at all (Pi #8939, #932). Every one of them
// is a session whose data must be mirrored; only a .jsonl that is none of these is not.

// LeadKind is what the first lines of a file make of it.
type LeadKind int

// The kinds of Lead.
const (
	// LeadHeader: a session header at Lead.HeaderAt, the records before it (if any) are
	// kept as they are.
	LeadHeader LeadKind = iota
	// LeadHeaderless: entries without a header; the conversation id (and the creation
	// time) come from Pi's file name.
	LeadHeaderless
	// LeadWait: only records that precede a header so far; the next lines decide.
	LeadWait
	// LeadNotSession: not a session in any form (Lead.Reason says why).
	LeadNotSession
)

func (k LeadKind) String() string {
	switch k {
	case LeadHeader:
		return "header"
	case LeadHeaderless:
		return "headerless"
	case LeadWait:
		return "wait"
	case LeadNotSession:
		return "not-session"
	}
	return "LeadKind(?)"
}

// The reasons a .jsonl is not a session: low-cardinality metric labels.
const (
	ReasonNotJSON    = "not_json"    // its first line is not a JSON object
	ReasonNotEntries = "not_entries" // JSON records, but none is a Pi session header or entry
	ReasonNoID       = "no_id"       // Pi entries without a header, in a file whose name carries no session id
	ReasonBadID      = "bad_id"      // the conversation id cannot be mirrored
)

// LeadLines and LeadBytes bound how far a header is looked for: a reader never holds
// more of a file's beginning than this.
const (
	LeadLines = 8
	LeadBytes = 64 << 10
)

// Lead is what the first lines of a session file say about it.
type Lead struct {
	Kind LeadKind
	// Header is the parsed header (LeadHeader), or for LeadHeaderless one made from
	// the file name: its id, the timestamp of the name, format v3.
	Header Header
	// HeaderAt is the ordinal of the header line; -1 without one.
	HeaderAt int
	Reason   string // LeadNotSession
}

// preHeaderTypes are the records a fork writes before the header.
var preHeaderTypes = map[string]bool{"title": true}

// Identify decides what a file named name is from its first complete lines (at most
// LeadLines, without their newlines; a line too long to hold is nil, and counts as an
// entry: Pi's long lines are images and tool outputs, never a header). more says the
// file holds complete lines past them: without it, a file of records that precede a
// header is waited on. It is pure; its table of cases is in lead_test.go.
func Identify(name string, lines [][]byte, more bool) Lead {
	if len(lines) == 0 {
		return Lead{Kind: LeadWait, HeaderAt: -1}
	}
	if len(lines) > LeadLines {
		lines, more = lines[:LeadLines], true
	}
	onlyPre, entries, ids, anon := true, false, false, false
	for i, l := range lines {
		if h, err := ParseHeader(l); err == nil {
			return Lead{Kind: LeadHeader, Header: h, HeaderAt: i}
		}
		if l == nil {
			onlyPre, entries = false, true
			continue
		}
		if IsBlank(l) {
			continue
		}
		env, err := ScanEntry(l)
		switch {
		case err != nil:
			onlyPre = false
			if i == 0 && !strings.HasPrefix(strings.TrimLeft(string(l[:min(len(l), 16)]), " \t"), "{") {
				if !entriesFollow(lines[1:]) {
					return Lead{Kind: LeadNotSession, HeaderAt: -1, Reason: ReasonNotJSON}
				}
			}
		case preHeaderTypes[env.Type] && env.ID == "":
		default:
			onlyPre = false
			entries = entries || IsEntryType(env.Type) || env.ID != ""
			ids = ids || env.ID != ""
			anon = anon || env.ID == ""
		}
	}
	if onlyPre && (!more && len(lines) < LeadLines) {
		return Lead{Kind: LeadWait, HeaderAt: -1}
	}
	if !entries {
		return Lead{Kind: LeadNotSession, HeaderAt: -1, Reason: ReasonNotEntries}
	}
	id, ts, ok := ParseFileName(name)
	if !ok {
		return Lead{Kind: LeadNotSession, HeaderAt: -1, Reason: ReasonNoID}
	}
	h := Header{ID: id, Version: 3, Timestamp: ts, Format: FormatV3}
	if anon && !ids {
		h.Version, h.Format = 0, FormatV1 // entries without ids: a v3 header would break their tree
	}
	return Lead{Kind: LeadHeaderless, HeaderAt: -1, Header: h}
}

// entriesFollow reports whether a line of lines is a Pi entry: a file whose first line
// is a crashed writer's fragment is still a session.
func entriesFollow(lines [][]byte) bool {
	for _, l := range lines {
		if env, err := ScanEntry(l); err == nil && (IsEntryType(env.Type) || env.ID != "") {
			return true
		}
	}
	return false
}

// ParseFileName reads Pi's session file name, <timestamp>_<id>.jsonl (FileName): the
// id, and the creation time as an ISO timestamp ("" when the part before the id is not
// Pi's encoding of one). ok is false when the name carries no id.
func ParseFileName(name string) (id, timestamp string, ok bool) {
	base, found := strings.CutSuffix(name, FileExt)
	if !found {
		return "", "", false
	}
	stamp, id, found := strings.Cut(base, "_")
	if !found || id == "" || strings.ContainsAny(id, "/\\_") || strings.Contains(id, "..") {
		return "", "", false
	}
	for _, c := range id {
		if c < 0x20 || c == 0x7f {
			return "", "", false
		}
	}
	return id, timestampOfName(stamp), true
}

// timestampOfName undoes FileName's encoding of an ISO timestamp (':' and '.' became
// '-'): 2026-12-05T14-00-00-000Z is 2026-12-05T14:00:00.000Z.
func timestampOfName(s string) string {
	date, clock, ok := strings.Cut(s, "T")
	if !ok || len(clock) < len("00-00-00Z") {
		return ""
	}
	parts := strings.Split(strings.TrimSuffix(clock, "Z"), "-")
	var iso string
	switch len(parts) {
	case 3:
		iso = date + "T" + parts[0] + ":" + parts[1] + ":" + parts[2] + "Z"
	case 4:
		iso = date + "T" + parts[0] + ":" + parts[1] + ":" + parts[2] + "." + parts[3] + "Z"
	default:
		return ""
	}
	if _, err := time.Parse(time.RFC3339Nano, iso); err != nil {
		return ""
	}
	return iso
}
