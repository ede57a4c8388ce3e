// Package recovery rebuilds Pi session files from the pisync mirror (DESIGN §4).
// Comparing local files with the mirror (status, verify) is package verify's.
//
// The work is split so that the rules can be tested without NATS: [Rebuild] is pure
// (ordered lines and the head in, the file's lines and a report out, blobs left as
// references), while the [Recoverer] reads the mirror, checks the target and writes the
// file atomically, streaming blobs through their digests.
//
// # Order and digests
//
// Lines are written in Pisync-Ordinal order whatever order they were stored in. A
// repeated ordinal keeps the first message stored (a repeat with other bytes is
// reported). Every line is checked against its Pisync-Sha256 (blobs while they are
// streamed, together with their recorded size); one mismatch refuses the conversation.
//
// # Completeness and gap filling
//
// A generation is complete when the mirror holds its header and every ordinal from 0 to
// the last one, with none missing before the head's last ordinal either. A complete
// generation is written exactly as it was, byte for byte: no placeholder is made even
// when an entry names a parent that is not in the file, because Pi itself writes such
// files (a fork made behind a compaction keeps the parentId of an entry it did not copy).
// Such references are only reported (dangling_reference).
//
// When ordinals are missing (holes, a lost tail, or the header), lines were lost, and an
// entry whose parentId, or a leaf record whose targetId, names an id absent from the
// mirror gets a placeholder:
//   - a Pi "custom" entry with exactly that id, customType [PlaceholderType] and data
//     saying what was missing and why (custom entries never reach the model's context);
//   - written just before the first line that names the id; every later line naming it
//     shares it, so several children of one missing parent share one placeholder;
//   - parented on the leaf of the mirrored lines before it, by Pi's rule: the nearest
//     preceding present entry, or, right after a leaf record, the entry that record moved
//     to (where Pi appended whatever came next), or null at the start of the file.
//
// Only referenced ids get placeholders: a chain of missing ancestors collapses into one
// placeholder per id that a present line names. A label's target gets none (Pi ignores a
// label on a missing entry). A reference to an id that appears only later in the file,
// two lines with one id, and cycles of parentId links are reported, never fatal.
//
// # Header
//
// The mirrored header is used when present. Otherwise one is synthesized from the
// conversation id, the earliest entry timestamp and the cwd (heads metadata, else decoded
// from the source directory name), with the version of the mirrored format (none for
// v1, so that Pi migrates the entries instead of misreading them), and the report says
// so.
//
// # Head check
//
// The daemon records as head the leaf after the last mirrored line, by Pi's rule over the
// mirrored lines. Recovery computes the leaf over the rebuilt file, placeholders included,
// at the same ordinal (the head's last ordinal: the mirror may hold lines written after
// the head was). A placeholder never moves it: it is always followed by the line that
// names it, which sets the leaf again. A mismatch refuses the conversation unless forced.
//
// # Writing
//
// A file is written through a temporary file in its directory (mode 0600), fsync, rename
// and fsync of the directory; new directories get mode 0700. Without an output
// directory, a file goes back to the root and path the heads record, but only below one
// of the configured roots (Options.Roots, --root): a recorded place elsewhere refuses the
// conversation, whoever wrote the head. Paths are confined to the root with os.Root: a
// recorded source path or id that would leave it refuses the conversation. An existing
// file is never replaced unless forced, is left alone when it already holds exactly the
// rebuilt bytes, and is never replaced, forced or not, when it holds a line whose digest
// the mirror does not have in any generation (or a torn tail).
//
// That check is made again at the rename. A target that did not exist is created with a
// hard link, which fails if a file appeared meanwhile. A target that existed is held
// open from its inspection on; at the rename it must be the same file, with the same
// size, modification time and last 4 KiB. A rename is not conditional, so the replaced
// file keeps a second name until the commit is settled: when it changed after the check
// (a writer appended between the check and the rename, or through a descriptor opened
// before it), it is renamed back, and the rebuilt file, if written to meanwhile, is kept
// beside it. Either way the conversation is not reported written.
package recovery
