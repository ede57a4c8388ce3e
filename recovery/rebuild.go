package recovery

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// ErrDigest is wrapped when a line's bytes do not hash to the digest the mirror recorded
// for them: the conversation is refused, since its copy cannot be trusted.
var ErrDigest = errors.New("digest mismatch")

// Line is one mirrored line as the rebuild sees it.
type Line struct {
	Ordinal   int64
	Kind      mirror.Kind
	SHA256    string
	Data      []byte // the line's bytes; nil for a blob not fetched
	BlobSize  int64  // blobs: the line's length
	Env       session.Envelope
	HasEnv    bool // Env describes an entry (scanned from the line, or from its headers)
	unscanned bool // Env is from the headers: no timestamp; the line's bytes can tell it
	Format    string
	Source    string
	Seq       uint64
	Time      time.Time
	header    bool   // the session header (mirrored as kind header, or as a blob of its type)
	fork      string // the header's HdrFork: a fork of the session store (checkFork)
}

// isHeader reports whether l is the session header line.
func (l Line) isHeader() bool { return l.header || l.Kind == mirror.KindHeader }

// headerIndex is the index in lines (in ordinal order) of the header line: at ordinal 0
// in Pi's files, after the records a fork writes first, -1 in a file without one. It is
// looked for where the daemon looks for it, among the first session.LeadLines lines.
func headerIndex(lines []Line) int {
	for i, l := range lines {
		if l.Ordinal >= session.LeadLines {
			break
		}
		if l.isHeader() {
			return i
		}
	}
	return -1
}

// LineFromMsg turns a message read from the mirror into a Line. The envelope of an
// entry comes from its headers (type, id, parent), which the publisher scanned from the
// same bytes the digest covers; only a leaf's or label's target is scanned from the line.
// A blob's envelope comes from its headers too (a leaf's target is fetched by the
// reader); a blob without a type header was too large for the publisher to scan, and
// the daemon's head did not apply it either. Timestamps are read from the lines only
// when the rebuild needs them (see withTimestamps): scanning every line would cost
// recovery a tenth of its time.
func LineFromMsg(m mirror.Msg) Line {
	l := Line{Ordinal: m.Ordinal, Kind: m.Kind, SHA256: m.SHA256, Data: m.Data, BlobSize: m.BlobSize,
		Format: m.Format, Source: m.Source, Seq: m.Seq, Time: m.Time, header: m.Kind == mirror.KindHeader || m.EntryType == mirror.HeaderEntryType,
		fork: m.Fork}
	if l.header || l.Kind == mirror.KindRaw {
		return l
	}
	headerID := m.EntryID
	if headerID == mirror.OrdinalID(m.Ordinal) {
		headerID = "" // v1 entries and unscanned lines carry the ordinal, not an id
	}
	if l.Data != nil {
		if m.Kind == mirror.KindEntry && m.EntryType != "" && m.EntryType != "leaf" && m.EntryType != "label" && headerID != "" {
			l.Env, l.HasEnv, l.unscanned = session.Envelope{Type: m.EntryType, ID: headerID, ParentID: m.ParentID}, true, true
			return l
		}
		if env, err := session.ScanEntry(l.Data); err == nil {
			l.Env, l.HasEnv = env, true
			return l
		}
	}
	if m.EntryType != "" {
		l.Env, l.HasEnv = session.Envelope{Type: m.EntryType, ID: headerID, ParentID: m.ParentID}, true
	}
	return l
}

// withTimestamps returns lines with the envelopes that came from their headers scanned
// from the lines, for their timestamps: what a synthesized header or a placeholder is
// dated by. It changes a copy, when there is anything to change.
func withTimestamps(lines []Line) []Line {
	out := lines
	for i := range lines {
		if !lines[i].unscanned {
			continue
		}
		if &out[0] == &lines[0] {
			out = append([]Line(nil), lines...)
		}
		l := &out[i]
		if env, err := session.ScanEntry(l.Data); err == nil {
			l.Env = env
		}
		l.unscanned = false
	}
	return out
}

// Input is what Rebuild works from: one generation's lines and the conversation's head.
type Input struct {
	Key         string       // conversation key in the mirror
	Generation  int          // the generation the lines belong to
	Generations []int        // every generation present
	Lines       []Line       // any order; a repeated ordinal keeps the first stored
	Head        *mirror.Head // nil when the heads bucket has none
	DropRaw     bool         // leave raw lines out
	// PointInTime says the lines are the generation as it was at some time (recover
	// --at): the head, which describes it now, is not checked.
	PointInTime bool
}

// OutLine is one line of the rebuilt file.
type OutLine struct {
	Data    []byte // nil: the blob named by SHA256, streamed at write time
	SHA256  string
	Size    int64 // bytes, without the newline
	Ordinal int64 // -1 for lines recovery made (header, placeholders)
}

// Plan is the rebuilt file, ready to be written, and its report.
type Plan struct {
	Header       session.Header // as written (mirrored or synthesized)
	Root, Source string         // where the file lived: watched root, path relative to it
	Lines        []OutLine
	HeadMismatch bool // the computed leaf is not the mirrored head
	Report       Report
}

// Size is the size of the rebuilt file.
func (p *Plan) Size() int64 {
	var n int64
	for _, l := range p.Lines {
		n += l.Size + 1
	}
	return n
}

// Rebuild turns one generation's mirrored lines into the file they came from. It is
// pure: blobs stay references, and nothing is read or written. It fails only when a
// line's bytes do not match their digest (wrapping ErrDigest) or there is no line at
// all; everything else odd is reported in Plan.Report and never stops it.
func Rebuild(in Input) (*Plan, error) {
	rep := Report{Key: in.Key, Conversation: in.Key, Generation: in.Generation, Generations: in.Generations}
	lines := ordered(in.Lines, &rep)
	if len(lines) == 0 {
		return nil, fmt.Errorf("conversation %s generation %d: no lines", in.Key, in.Generation)
	}
	for _, l := range lines {
		if l.Data == nil {
			continue // blobs are checked while they are streamed
		}
		if sum := session.Digest(l.Data); sum != l.SHA256 {
			return nil, fmt.Errorf("%w: line %d (ordinal %d) hashes to %s, the mirror recorded %s",
				ErrDigest, l.Ordinal+1, l.Ordinal, sum, l.SHA256)
		}
	}
	// The format is the generation's own (a v1 file migrated by Pi is v3 only from the
	// next generation on); the place is the conversation's latest.
	p := &Plan{Source: lines[0].Source}
	format := lines[0].Format
	if in.Head != nil {
		p.Root, p.Source = in.Head.Root, in.Head.Source
		if format == "" {
			format = in.Head.Format
		}
		if in.Head.Conversation != "" {
			rep.Conversation = in.Head.Conversation
		}
	}
	rep.Format = format
	head := headFor(in)
	rep.Missing = holes(lines, head)
	if last := lines[len(lines)-1].Ordinal; head != nil && last < head.LastOrdinal {
		rep.Conflicts = append(rep.Conflicts, Conflict{Kind: ConflictMissingTail, Line: head.LastOrdinal,
			Detail: fmt.Sprintf("the head records ordinals up to %d; the stream holds up to %d", head.LastOrdinal, last)})
	}
	rep.Complete = len(rep.Missing) == 0
	rep.LastOrdinal = lines[len(lines)-1].Ordinal
	if !rep.Complete || lines[0].Ordinal != 0 {
		lines = withTimestamps(lines)
	}

	// The mirrored header where it stands (line 1, or after records a fork writes before
	// it), the lines before it kept as they are; or one made up from what the mirror
	// knows, written before every mirrored line: a file Pi left without its header keeps
	// each of its lines, and Pi opens it.
	body := lines
	switch at := headerIndex(lines); {
	case at >= 0:
		if h, err := session.ParseHeader(lines[at].Data); err == nil {
			p.Header, rep.Conversation = h, h.ID
		} else {
			p.Header, _, _ = synthHeader(in, withTimestamps(lines), format, p.Source) // for the output path only
		}
		if at == 0 {
			p.Lines = append(p.Lines, outOf(lines[0]))
			body = lines[1:]
		}
	default:
		h, b, cwdFrom := synthHeader(in, lines, format, p.Source)
		p.Header, rep.Conversation, rep.HeaderSynthesized = h, h.ID, true
		p.Lines = append(p.Lines, synthLine(b))
		if lines[0].Ordinal == 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the file had no header line: synthesized a %s header from the conversation id, the time in its name (or its earliest entry), %s; every line of the file follows it as it was", h.Format, cwdFrom))
		} else {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the mirror has no header: synthesized a %s header from the conversation id and the earliest entry timestamp, %s", h.Format, cwdFrom))
		}
	}

	if in.Head != nil && in.Head.Conversation != "" {
		// The conversation the file was mirrored as: a fresh header of another id written
		// over the session's file is a generation of it (publisher.overwrittenID).
		rep.Conversation = in.Head.Conversation
	}
	b := builder{in: in, rep: &rep, plan: p, body: body, fill: !rep.Complete, head: head}
	b.run()
	rep.Conflicts = append(rep.Conflicts, cycles(body, rep.Placeholders)...)
	rep.Lines = len(p.Lines)
	rep.Bytes = p.Size()
	rep.Leaf = b.leaf.ID()
	switch {
	case in.PointInTime:
		rep.HeadCheck = "skipped: a point in time (--at); the head describes the conversation now"
	case in.Head == nil:
		rep.HeadCheck = "skipped: the heads bucket has no head for this conversation"
	case head == nil:
		rep.HeadCheck = fmt.Sprintf("skipped: the head is of generation %d", in.Head.Generation)
	case b.leafAtHead == head.Head:
		rep.Head, rep.HeadCheck = head.Head, "ok"
		if last := lines[len(lines)-1].Ordinal; last > head.LastOrdinal {
			rep.HeadCheck = fmt.Sprintf("ok at ordinal %d; the mirror holds %d lines written after the head", head.LastOrdinal, last-head.LastOrdinal)
		}
	default:
		rep.Head = head.Head
		rep.HeadCheck = fmt.Sprintf("mismatch: the rebuilt file's leaf at ordinal %d is %q, the mirrored head is %q", head.LastOrdinal, b.leafAtHead, head.Head)
		p.HeadMismatch = true
	}
	p.Report = rep
	return p, nil
}

// ordered sorts lines by ordinal and drops repeated ordinals, keeping the first stored;
// a repeat with other bytes is a conflict, one with the same bytes only counted. Lines
// mirrored by one daemon arrive in order: then they are returned as they are, without a
// copy (the rebuild copies before it changes one).
func ordered(in []Line, rep *Report) []Line {
	inOrder := true
	for i := 1; i < len(in) && inOrder; i++ {
		inOrder = in[i-1].Ordinal < in[i].Ordinal
	}
	if inOrder {
		return in[:len(in):len(in)]
	}
	lines := append([]Line(nil), in...)
	sort.SliceStable(lines, func(i, j int) bool {
		if lines[i].Ordinal != lines[j].Ordinal {
			return lines[i].Ordinal < lines[j].Ordinal
		}
		return lines[i].Seq < lines[j].Seq
	})
	out := lines[:0]
	for _, l := range lines {
		if n := len(out); n > 0 && out[n-1].Ordinal == l.Ordinal {
			if out[n-1].SHA256 == l.SHA256 {
				rep.Duplicates++
			} else {
				rep.Conflicts = append(rep.Conflicts, Conflict{Kind: ConflictOrdinal, Line: l.Ordinal,
					Detail: fmt.Sprintf("ordinal %d is stored twice with different bytes (sequences %d and %d); the first is used", l.Ordinal, out[n-1].Seq, l.Seq)})
			}
			continue
		}
		out = append(out, l)
	}
	return out
}

// holes lists the ordinals missing between 0 and the last line, and after it up to the
// head's last ordinal.
func holes(lines []Line, head *mirror.Head) []Range {
	var rs []Range
	next := int64(0)
	for _, l := range lines {
		if l.Ordinal > next {
			rs = append(rs, Range{next, l.Ordinal - 1})
		}
		next = l.Ordinal + 1
	}
	if head != nil && head.LastOrdinal >= next {
		rs = append(rs, Range{next, head.LastOrdinal})
	}
	return rs
}

func outOf(l Line) OutLine {
	size := int64(len(l.Data))
	if l.Data == nil {
		size = l.BlobSize
	}
	return OutLine{Data: l.Data, SHA256: l.SHA256, Size: size, Ordinal: l.Ordinal}
}
