// Package session owns Pi's session file format: the header on line 1, the
// envelope of every entry line, the leaf rule and the directory layout.
//
// It imports nothing of pisync, so that every other package can depend on it
// and it can be checked against Pi's own source alone. What follows was
// confirmed there (badlogic/pi-mono, now earendil-works/pi):
//
// # Layout
//
// A session lives at <root>/--<cwd encoded>--/<timestamp encoded>_<id>.jsonl.
// The coding-agent CLI (packages/coding-agent/src/core/session-manager.ts,
// getDefaultSessionDir and newSession) and the harness
// (packages/agent/src/harness/session/jsonl-repo.ts, encodeCwd) encode the
// directory identically; see [DirName] and [FileName].
//
// # Header
//
// Line 1 is {"type":"session","version":3,"id":..,"timestamp":..,"cwd":..}
// with an optional "parentSession" (the path of the file it was forked from)
// and, in the harness, an optional "metadata" object. The CLI accepts any
// line-1 object with type "session" and a string id; the harness
// (jsonl-storage.ts, parseHeaderLine) also requires version 3 and non-empty
// timestamp and cwd. [ParseHeader] takes the lenient view, because pisync
// must mirror every file either of them wrote.
//
// # Versions
//
// The CLI's CURRENT_SESSION_VERSION is 3. When it opens an older file it
// migrates the entries in memory and rewrites the whole file in place
// (migrateToCurrentVersion, then _rewriteFile):
//
//   - v1 (header without "version"; entries without id/parentId) to v2: every
//     entry gets a fresh random 8-hex id and parentId = the previous entry's id
//     (null for the first), so the v1 list becomes a linear chain; a compaction
//     entry's firstKeptEntryIndex becomes firstKeptEntryId.
//   - v2 to v3: a message whose role is "hookMessage" gets role "custom".
//
// Because the v1 ids are random, a migrated file is a rewrite that shares no
// entry id with what was mirrored before it; callers detect that rewrite, this
// package only reports the [Format].
//
// Upstream has since started an experimental v4 file format whose header is
// {"kind":"header","version":4,..}; it is outside pisync's contract and
// [ParseHeader] reports it as [ErrNotSession].
//
// # Entries and the leaf
//
// Every further line is one JSON object with a string "type" and, from v2 on,
// "id", "parentId" (string or null) and "timestamp". The harness refuses the
// whole file when any non-blank line is not such an object (parseEntryLine),
// skips blank lines, and tolerates CRLF because "\r" is JSON whitespace.
// [ScanEntry] applies the same rules without decoding the rest of the line.
//
// The current leaf is computed by scanning entries in file order
// (leafIdAfterEntry in the harness, _buildIndex in the CLI): an ordinary entry
// makes the leaf its own id; a "leaf" entry makes it its targetId, which may be
// null. [Leaf] implements that rule.
package session
