package recovery

import (
	"fmt"
	"strings"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// builder walks the entries of one generation in file order and writes the rebuilt
// file's lines, filling parent gaps when the mirror has holes (see the package doc).
type builder struct {
	in   Input
	rep  *Report
	plan *Plan
	body []Line // every line after the header, in ordinal order
	fill bool   // the mirror lacks ordinals: synthesize placeholders
	head *mirror.Head

	first      map[string]int // entry id → index in body of its first line
	made       map[string]bool
	leaf       session.Leaf // over the rebuilt file, placeholders included: what Pi computes
	anchor     session.Leaf // over the mirrored lines only: where a placeholder hangs
	leafAtHead string       // leaf after the last line at or before the head's last ordinal
	lastStamp  string
	malformed  int // raw lines written that are not blank
}

func (b *builder) run() {
	b.first = make(map[string]int, len(b.body))
	b.made = map[string]bool{}
	b.lastStamp = b.plan.Header.Timestamp
	b.index()
	positional := b.fill && b.plan.Header.Format == session.FormatV1
	prev := int64(0) // the header's ordinal
	for i, l := range b.body {
		if positional {
			for o := prev + 1; o < l.Ordinal; o++ {
				b.positionPlaceholder(o)
			}
			prev = l.Ordinal
		}
		switch {
		case l.isHeader():
			b.emit(l) // a header after the records a fork writes before it
		case l.Kind == mirror.KindRaw:
			b.rep.Raw++
			if b.in.DropRaw {
				b.rep.RawDropped = true
			} else {
				b.emit(l)
				if malformed(l) {
					b.malformed++
				}
				if env, ok := repeatedEntry(l); ok {
					b.leaf.Apply(env)
					b.anchor.Apply(env)
				}
			}
		default:
			if l.HasEnv {
				b.references(i, l)
			}
			b.emit(l)
			b.rep.Entries++
			if l.HasEnv {
				b.leaf.Apply(l.Env)
				b.anchor.Apply(l.Env)
				if l.Env.Timestamp != "" {
					b.lastStamp = l.Env.Timestamp
				}
			}
		}
		if b.head != nil && l.Ordinal <= b.head.LastOrdinal {
			b.leafAtHead = b.leaf.ID()
		}
	}
	switch {
	case b.rep.RawDropped:
		b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("%d raw line(s) left out (--drop-raw)", b.rep.Raw))
	case b.malformed > 0:
		b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("%d raw line(s) written back where they were, %d of them malformed: Pi's harness refuses such a file (--drop-raw leaves them out)", b.rep.Raw, b.malformed))
	case b.rep.Raw > 0:
		b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("%d raw line(s) written back where they were (blank, or entries repeating an earlier entry's id)", b.rep.Raw))
	}
}

// malformed reports whether a raw line is one Pi's harness refuses: not blank, and not
// an entry (the publisher mirrors an entry repeating an earlier id as raw, so that the
// server keeps it).
func malformed(l Line) bool {
	if l.Data == nil || session.IsBlank(l.Data) {
		return l.Data == nil
	}
	_, err := session.ScanEntry(l.Data)
	return err != nil
}

// repeatedEntry returns the envelope of a raw line that is an entry with a valid id: the
// publisher mirrors so an entry repeating an earlier id of its generation. Pi moves its
// leaf to it as to any entry, and so does the rebuild.
func repeatedEntry(l Line) (session.Envelope, bool) {
	if l.Data == nil {
		return session.Envelope{}, false
	}
	env, err := session.ScanEntry(l.Data)
	if err != nil || env.ID == "" || !mirror.ValidEntryID(env.ID) {
		return session.Envelope{}, false
	}
	return env, true
}

func (b *builder) emit(l Line) {
	b.plan.Lines = append(b.plan.Lines, outOf(l))
	if l.Kind == mirror.KindBlob {
		b.rep.Blobs++
	}
}

// index records where each entry id first appears and reports repeated ids.
func (b *builder) index() {
	for i, l := range b.body {
		if !l.HasEnv || l.Env.ID == "" {
			continue
		}
		j, dup := b.first[l.Env.ID]
		if !dup {
			b.first[l.Env.ID] = i
			continue
		}
		kind, how := ConflictDuplicateID, "with different bytes"
		if b.body[j].SHA256 == l.SHA256 {
			kind, how = ConflictDuplicateLine, "with the same bytes"
		}
		b.rep.Conflicts = append(b.rep.Conflicts, Conflict{Kind: kind, ID: l.Env.ID, Line: l.Ordinal,
			Detail: fmt.Sprintf("entry %s appears at ordinals %d and %d %s; both are kept in file order", l.Env.ID, b.body[j].Ordinal, l.Ordinal, how)})
	}
}

// references checks the ids line i names: its parent, and a leaf's or label's target.
// An id absent from the mirror gets a placeholder just before its first referrer when
// the mirror has holes; otherwise it is reported and the line kept as it was.
func (b *builder) references(i int, l Line) {
	type ref struct {
		id, field string
		fillable  bool
	}
	refs := make([]ref, 0, 2)
	if l.Env.ParentID != "" {
		refs = append(refs, ref{l.Env.ParentID, "parentId", true})
	}
	if l.Env.TargetID != "" && (l.Env.Type == "leaf" || l.Env.Type == "label") {
		// A label on a missing entry is harmless to Pi; a leaf on one makes it refuse the file.
		refs = append(refs, ref{l.Env.TargetID, "targetId", l.Env.Type == "leaf"})
	}
	for _, r := range refs {
		j, present := b.first[r.id]
		switch {
		case present && j > i:
			b.rep.Conflicts = append(b.rep.Conflicts, Conflict{Kind: ConflictForward, ID: l.Env.ID, Line: l.Ordinal,
				Detail: fmt.Sprintf("%s %s names %s, which appears only later (ordinal %d)", describe(l), r.field, r.id, b.body[j].Ordinal)})
		case present || b.made[r.id]:
		case b.fill && r.fillable:
			b.placeholder(r.id, l)
		default:
			why := "the mirror holds every line of this generation, so the file had it this way (a fork behind a compaction does)"
			if !r.fillable {
				why = "label targets get no placeholder"
			}
			b.rep.Conflicts = append(b.rep.Conflicts, Conflict{Kind: ConflictDangling, ID: l.Env.ID, Line: l.Ordinal,
				Detail: fmt.Sprintf("%s %s names %s, which is not in the file; kept as is: %s", describe(l), r.field, r.id, why)})
		}
	}
}

// placeholder writes the entry standing for missing id, just before its first referrer
// l, hung on the leaf of the mirrored lines so far: the nearest preceding present entry,
// or, after a leaf record, the entry it moved to (where Pi appended what came next).
func (b *builder) placeholder(id string, l Line) {
	stamp := l.Env.Timestamp
	if stamp == "" {
		stamp = b.lastStamp
	}
	if stamp == "" {
		stamp = fallbackTimestamp
	}
	parent := b.anchor.ID()
	referrer := l.Env.ID
	if referrer == "" {
		referrer = mirror.OrdinalID(l.Ordinal)
	}
	line := placeholderLine(id, parent, stamp, placeholderData{
		MissingID:  id,
		ReferredBy: referrer,
		Generation: b.in.Generation,
		Reason: fmt.Sprintf("entry %s is not in the pisync mirror, which lacks the lines at ordinals %s of generation %d; pisync recover put this placeholder in its place so that the entries naming it keep their parent",
			id, rangesString(b.rep.Missing), b.in.Generation),
	})
	b.plan.Lines = append(b.plan.Lines, synthLine(line))
	b.made[id] = true
	b.leaf.Apply(session.Envelope{Type: "custom", ID: id, ParentID: parent})
	b.rep.Placeholders = append(b.rep.Placeholders, Placeholder{ID: id, ParentID: parent, Line: len(b.plan.Lines), ReferredBy: referrer})
}

// positionPlaceholder keeps the place of the missing line at ordinal o of a v1 file.
func (b *builder) positionPlaceholder(o int64) {
	stamp := b.lastStamp
	if stamp == "" {
		stamp = fallbackTimestamp
	}
	id := mirror.OrdinalID(o)
	line := v1PlaceholderLine(stamp, placeholderData{
		MissingID:  id,
		Generation: b.in.Generation,
		Reason: fmt.Sprintf("line %d of this version-1 file is not in the pisync mirror (generation %d); pisync recover put this placeholder in its place so that entries named by position keep theirs",
			o+1, b.in.Generation),
	})
	b.plan.Lines = append(b.plan.Lines, synthLine(line))
	b.rep.Placeholders = append(b.rep.Placeholders, Placeholder{ID: id, Line: len(b.plan.Lines)})
}

func describe(l Line) string {
	if l.Env.ID != "" {
		return fmt.Sprintf("entry %s (ordinal %d)", l.Env.ID, l.Ordinal)
	}
	return fmt.Sprintf("line at ordinal %d", l.Ordinal)
}

// cycles reports every cycle of parentId links among the rebuilt file's entries. It
// walks each chain once (iteratively: a hostile file cannot exhaust the stack).
func cycles(body []Line, placeholders []Placeholder) []Conflict {
	parent := make(map[string]string, len(body)+len(placeholders))
	order := make([]string, 0, len(body)+len(placeholders))
	link := func(id, p string) {
		if _, dup := parent[id]; !dup {
			parent[id] = p
			order = append(order, id)
		}
	}
	for _, ph := range placeholders {
		link(ph.ID, ph.ParentID)
	}
	for _, l := range body {
		if l.HasEnv && l.Env.ID != "" {
			link(l.Env.ID, l.Env.ParentID)
		}
	}
	// mark of an id: 0 unseen, done, or 1 + its position on the path being walked.
	const done = -1
	mark := make(map[string]int, len(parent))
	var found []Conflict
	var path []string // reused: a cycle is reported as a string
	for _, start := range order {
		path = path[:0]
		for cur := start; ; {
			m := mark[cur]
			if m == done {
				break
			}
			if m > 0 {
				cyc := path[m-1:]
				found = append(found, Conflict{Kind: ConflictCycle, ID: cur,
					Detail: fmt.Sprintf("parentId links form a cycle: %s → %s", strings.Join(cyc, " → "), cur)})
				break
			}
			p, ok := parent[cur]
			if !ok {
				break // a dangling id: no further link
			}
			mark[cur] = len(path) + 1
			path = append(path, cur)
			if p == "" {
				break
			}
			cur = p
		}
		for _, id := range path {
			mark[id] = done
		}
	}
	return found
}
