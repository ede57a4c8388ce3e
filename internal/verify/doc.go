// Package verify compares local session files with their mirror copies (DESIGN §4, §5):
// Survey pairs the files under the roots with the heads of the caller's conversations,
// Status says how far each one is mirrored, Verify compares a file with its mirror copy
// line by line by digest, and Background does the same continuously for the daemon,
// reading again only what changed.
//
// It reads the mirror and never writes, neither to it nor to a session file; the only
// file it writes is Background's record of its verdicts, in the daemon's state directory.
package verify
