package session

import "strings"

// DirName encodes cwd into the name of its session directory exactly as Pi
// does: one leading '/' or '\' is dropped, every '/', '\' and ':' becomes '-',
// and the result is wrapped in "--". Pi's code is
//
//	`--${cwd.replace(/^[/\\]/, "").replace(/[/\\:]/g, "-")}--`
//
// in getDefaultSessionDir (packages/coding-agent/src/core/session-manager.ts)
// and encodeCwd (packages/agent/src/harness/session/jsonl-repo.ts). Working on
// bytes matches Pi's UTF-16 regexes because the three characters are ASCII and
// never occur inside a multi-byte UTF-8 sequence.
func DirName(cwd string) string {
	if cwd != "" && (cwd[0] == '/' || cwd[0] == '\\') {
		cwd = cwd[1:]
	}
	var b strings.Builder
	b.Grow(len(cwd) + 4)
	b.WriteString("--")
	for i := 0; i < len(cwd); i++ {
		switch c := cwd[i]; c {
		case '/', '\\', ':':
			b.WriteByte('-')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteString("--")
	return b.String()
}

// FileExt ends the name of every session file, Pi's and pisync's alike.
const FileExt = ".jsonl"

// IsFileName reports whether name (a file's name, or its path) is a session file's: the
// files the daemon watches, status lists and recovery writes. A file named otherwise is
// none of them, which recovery's temporary files rely on until their rename. What the
// file holds decides the rest (Identify).
func IsFileName(name string) bool { return strings.HasSuffix(name, FileExt) }

// IsFileNameOf reports whether name is Pi's name for a file of conversation id
// (FileName), whatever the timestamp before the id.
func IsFileNameOf(name, id string) bool { return strings.HasSuffix(name, "_"+id+FileExt) }

// FileName is the name Pi gives a session file: the ISO timestamp of its
// creation with every ':' and '.' replaced by '-', then "_" + id + ".jsonl"
// (timestamp.replace(/[:.]/g, "-") in the same two files as [DirName]).
func FileName(timestamp, id string) string {
	var b strings.Builder
	b.Grow(len(timestamp) + len(id) + len("_"+FileExt))
	for i := 0; i < len(timestamp); i++ {
		switch c := timestamp[i]; c {
		case ':', '.':
			b.WriteByte('-')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('_')
	b.WriteString(id)
	b.WriteString(FileExt)
	return b.String()
}

// CwdFromDirName is a best-effort inverse of [DirName], for when no header is
// at hand (a header's cwd is authoritative). The encoding is lossy: a '-' may
// have been '/', '\', ':' or '-'; this returns the Unix reading, every '-' a
// '/', behind a leading '/'. ok is false when name is not of the form --…--
// or holds a '/', '\' or ':', which DirName never leaves: such a directory is
// not Pi's. For every name DirName can return, DirName(cwd) == name.
func CwdFromDirName(name string) (cwd string, ok bool) {
	if len(name) < 4 || !strings.HasPrefix(name, "--") || !strings.HasSuffix(name, "--") ||
		strings.ContainsAny(name, `/\:`) {
		return "", false
	}
	return "/" + strings.ReplaceAll(name[2:len(name)-2], "-", "/"), true
}
