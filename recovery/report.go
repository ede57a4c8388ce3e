package recovery

import (
	"fmt"
	"strings"

	"github.com/pisync/pisync/mirror"
)

// Result is the outcome of recovering one conversation.
type Result string

// The results a conversation can end with. Only Written, Unchanged and DryRun count as
// success.
const (
	Written   Result = "written"   // the file was (re)written
	Unchanged Result = "unchanged" // the target already holds exactly the rebuilt bytes
	DryRun    Result = "dry-run"   // everything checked, nothing written (--dry-run)
	Refused   Result = "refused"   // a check failed: digest, head, existing file, path
	Failed    Result = "failed"    // the mirror could not be read, or writing failed
)

// OK reports whether r counts as success for the exit code.
func (r Result) OK() bool { return r == Written || r == Unchanged || r == DryRun }

// Report says what recovery did with one conversation (the per-conversation lines of
// `pisync recover` and its --json output).
type Report struct {
	Conversation string `json:"conversation"`          // header id
	Key          string `json:"key"`                   // conversation key in the mirror
	Generation   int    `json:"generation"`            // the generation rebuilt
	Generations  []int  `json:"generations,omitempty"` // every generation in the mirror
	// History lists the generations (when there are several): number, time, entries,
	// bytes, and which of them lost entries of the one before.
	History           []mirror.GenInfo `json:"history,omitempty"`
	Format            string           `json:"format,omitempty"`
	Output            string           `json:"output,omitempty"` // path written (or that would be)
	Result            Result           `json:"result,omitempty"`
	Reason            string           `json:"reason,omitempty"`
	Complete          bool             `json:"complete"`                   // every ordinal 0..last present
	Lines             int              `json:"lines"`                      // lines in the rebuilt file
	LastOrdinal       int64            `json:"last_ordinal"`               // of the last mirrored line rebuilt
	Entries           int              `json:"entries"`                    // mirrored entry lines written
	Raw               int              `json:"raw"`                        // raw lines in the mirror
	RawDropped        bool             `json:"raw_dropped,omitempty"`      // --drop-raw left them out
	Blobs             int              `json:"blobs"`                      // lines stored as blobs
	Bytes             int64            `json:"bytes"`                      // size of the rebuilt file
	HeaderSynthesized bool             `json:"header_synthesized"`         // no mirrored header
	Placeholders      []Placeholder    `json:"placeholders,omitempty"`     // entries synthesized for gaps
	Missing           []Range          `json:"missing_ordinals,omitempty"` // holes in the mirror
	Conflicts         []Conflict       `json:"conflicts,omitempty"`
	Notes             []string         `json:"notes,omitempty"`              // what recovery made up, and why
	Duplicates        int              `json:"duplicate_messages,omitempty"` // same ordinal stored twice, same bytes
	Leaf              string           `json:"leaf"`                         // computed by Pi's rule
	Head              string           `json:"head,omitempty"`               // mirrored head
	HeadCheck         string           `json:"head_check"`                   // ok, mismatch, or why skipped
	Forced            bool             `json:"forced,omitempty"`             // a refusal overridden by --force
}

// Placeholder is one entry synthesized for a missing parent or leaf target.
type Placeholder struct {
	ID         string `json:"id"`          // exactly the missing id
	ParentID   string `json:"parent_id"`   // "" = null
	Line       int    `json:"line"`        // 1-based line in the rebuilt file
	ReferredBy string `json:"referred_by"` // the first entry that names it
}

// Range is an inclusive range of ordinals (0 is the header, 1 the first entry).
type Range struct {
	First int64 `json:"first"`
	Last  int64 `json:"last"`
}

func (r Range) String() string {
	if r.First == r.Last {
		return fmt.Sprint(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

func rangesString(rs []Range) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ", ")
}

// ConflictKind classifies what the rebuild found odd. None of them stops it.
type ConflictKind string

// Conflict kinds.
const (
	// ConflictDuplicateID: two lines carry one entry id with different bytes.
	ConflictDuplicateID ConflictKind = "duplicate_id"
	// ConflictDuplicateLine: two lines carry one entry id with the same bytes.
	ConflictDuplicateLine ConflictKind = "duplicate_line"
	// ConflictOrdinal: one ordinal stored twice with different bytes; the first stored is used.
	ConflictOrdinal ConflictKind = "ordinal_conflict"
	// ConflictCycle: following parentId from an entry comes back to it.
	ConflictCycle ConflictKind = "cycle"
	// ConflictForward: an entry names a parent or target that appears only later in the file.
	ConflictForward ConflictKind = "forward_reference"
	// ConflictDangling: an entry names an id that is not in the file and no placeholder was
	// made for it (complete mirror: kept as it was; label targets).
	ConflictDangling ConflictKind = "dangling_reference"
	// ConflictMissingTail: the head says more lines were mirrored than the stream holds.
	ConflictMissingTail ConflictKind = "missing_tail"
)

// Conflict is one finding of the rebuild, with the line it is about.
type Conflict struct {
	Kind   ConflictKind `json:"kind"`
	ID     string       `json:"id,omitempty"`      // the entry id concerned
	Line   int64        `json:"ordinal,omitempty"` // ordinal of the line concerned
	Detail string       `json:"detail"`
}

// Summary totals a run of reports.
type Summary struct {
	Conversations int `json:"conversations"`
	Written       int `json:"written"`
	Unchanged     int `json:"unchanged"`
	DryRun        int `json:"dry_run"`
	Refused       int `json:"refused"`
	Failed        int `json:"failed"`
	Placeholders  int `json:"placeholders"`
	Synthesized   int `json:"headers_synthesized"`
	Conflicts     int `json:"conflicts"`
}

// Summarize totals reports.
func Summarize(reports []Report) Summary {
	var s Summary
	for _, r := range reports {
		s.Conversations++
		switch r.Result {
		case Written:
			s.Written++
		case Unchanged:
			s.Unchanged++
		case DryRun:
			s.DryRun++
		case Refused:
			s.Refused++
		default:
			s.Failed++
		}
		s.Placeholders += len(r.Placeholders)
		s.Conflicts += len(r.Conflicts)
		if r.HeaderSynthesized {
			s.Synthesized++
		}
	}
	return s
}

// OK reports whether every conversation succeeded.
func (s Summary) OK() bool { return s.Refused == 0 && s.Failed == 0 }
