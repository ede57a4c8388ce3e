package mirror

import (
	"hash/maphash"
	"sort"
	"strconv"
	"time"
)

// GenInfo is one generation of a conversation as the mirror holds it: what `pisync
// history` lists and what recovery checks before it restores the newest generation.
type GenInfo struct {
	Number  int       `json:"generation"`
	First   time.Time `json:"first_stored"` // the mirror's clock: when its first line was stored
	Last    time.Time `json:"last_stored"`
	Lines   int64     `json:"lines"`   // lines held, header and raw lines included
	Entries int64     `json:"entries"` // Pi entries: lines that are neither the header nor raw
	Bytes   int64     `json:"bytes"`   // the file's bytes, newlines included
	Header  bool      `json:"header"`  // holds a session header line
	// Shrunk is set when the generation lacks entries of the one before it: the file was
	// overwritten by a fresh header, cut back, or rewritten without some of its lines.
	Shrunk *Shrink `json:"shrunk,omitempty"`
}

// Shrink says what a shrunk generation lost.
type Shrink struct {
	From    int         `json:"from_generation"` // the newest generation before it that is not shrunk, whose entries it lacks
	Missing int64       `json:"missing_entries"`
	Reason  ShrinkCause `json:"reason"`
}

// ShrinkCause names how a generation lost its predecessor's entries.
type ShrinkCause string

// The causes, from the most to the least specific.
const (
	ShrinkHeaderOnly ShrinkCause = "header-only" // no entry left: a fresh header (or nothing) written over the file
	ShrinkTruncated  ShrinkCause = "truncated"   // the first lines of the predecessor, and no more
	ShrinkDropped    ShrinkCause = "dropped"     // other lines, some of the predecessor's entries among them missing
)

// History gathers the generations of one conversation from its messages (in any order;
// a headers-only read is enough). Memory: 32 bytes per line, the sets that compare a
// generation with the one before it made only by Generations.
type History struct {
	gens map[int]*genAcc
	// Skip, if set, leaves a generation out of the shrink comparisons (on either side):
	// the session store's generation is written by the store, and a local copy appended
	// to after the cut-over follows it without its entries (DESIGN §8).
	Skip func(gen int) bool
}

type genAcc struct {
	info  GenInfo
	lines []histLine
}

// histLine is what the comparisons need of one line.
type histLine struct {
	ordinal int64
	id      uint64 // hash of its entry id; 0: the header, a raw line, or no id of its own
	sum     uint64 // hash of its digest
	size    int64
	kind    lineClass
}

type lineClass uint8

const (
	classHeader lineClass = iota
	classRaw
	classAnon  // an entry without an id of its own (v1, a repeated id)
	classNamed // an entry with its id
)

var historySeed = maphash.MakeSeed()

// Add records one message.
func (h *History) Add(m Msg) {
	if h.gens == nil {
		h.gens = map[int]*genAcc{}
	}
	g := h.gens[m.Generation]
	if g == nil {
		g = &genAcc{info: GenInfo{Number: m.Generation, First: m.Time, Last: m.Time}}
		h.gens[m.Generation] = g
	}
	if m.Time.Before(g.info.First) {
		g.info.First = m.Time
	}
	if m.Time.After(g.info.Last) {
		g.info.Last = m.Time
	}
	l := histLine{ordinal: m.Ordinal, sum: maphash.String(historySeed, m.SHA256), size: m.Size}
	switch {
	case m.Kind == KindHeader:
		l.kind = classHeader
	case m.Kind == KindRaw:
		l.kind = classRaw
	case isOrdinalID(m.EntryID, m.Ordinal):
		l.kind = classAnon
	default:
		l.kind, l.id = classNamed, maphash.String(historySeed, m.EntryID)
	}
	g.lines = append(g.lines, l)
}

// isOrdinalID reports whether id is the one pisync gives a line without an id of its own.
func isOrdinalID(id string, ordinal int64) bool {
	return id == "" || id == OrdinalID(ordinal) || (len(id) > 1 && id[0] == 'L' && isDigits(id[1:]))
}

func isDigits(s string) bool {
	_, err := strconv.ParseUint(s, 10, 63)
	return err == nil
}

// Generations returns the generations in ascending order, each compared with the
// newest one before it that is not shrunk itself (Shrunk): a session overwritten by a
// fresh header and then appended to, or rewritten again, still lacks what it lost,
// while a rewrite seen half done (a shrunk generation) and then whole is not.
func (h *History) Generations() []GenInfo {
	nums := make([]int, 0, len(h.gens))
	for n := range h.gens {
		nums = append(nums, n)
	}
	sort.Ints(nums)
	out := make([]GenInfo, 0, len(nums))
	var base *genSets
	for _, n := range nums {
		g := h.gens[n].sets()
		if h.Skip != nil && h.Skip(n) {
			out = append(out, g.info)
			continue
		}
		if base != nil {
			g.info.Shrunk = shrinkOf(base, g)
		}
		out = append(out, g.info)
		if g.info.Shrunk == nil {
			base = g
		}
	}
	return out
}

// genSets is one generation as the comparisons see it: each ordinal once.
type genSets struct {
	info   GenInfo
	named  map[uint64]struct{} // the real entry ids
	anon   int64               // entries without an id of their own
	byOrd  map[int64]uint64    // line digests by ordinal
	maxOrd int64
}

func (g *genAcc) sets() *genSets {
	s := &genSets{info: g.info, named: map[uint64]struct{}{}, byOrd: make(map[int64]uint64, len(g.lines)), maxOrd: -1}
	for _, l := range g.lines {
		if _, dup := s.byOrd[l.ordinal]; dup {
			continue // a second copy of a line: the generation holds it once
		}
		s.byOrd[l.ordinal] = l.sum
		s.maxOrd = max(s.maxOrd, l.ordinal)
		s.info.Lines++
		s.info.Bytes += l.size + 1
		switch l.kind {
		case classHeader:
			s.info.Header = true
		case classAnon:
			s.info.Entries++
			s.anon++
		case classNamed:
			s.info.Entries++
			s.named[l.id] = struct{}{}
		}
	}
	return s
}

// shrinkOf compares generation g with its predecessor p: the entries of p whose id g
// lacks, plus those of p without an id of their own that g has neither kept nor replaced
// by entries with new ids (Pi's v1 → v3 migration gives every entry a new id).
func shrinkOf(p, g *genSets) *Shrink {
	var missing, added int64
	for id := range p.named {
		if _, ok := g.named[id]; !ok {
			missing++
		}
	}
	for id := range g.named {
		if _, ok := p.named[id]; !ok {
			added++
		}
	}
	missing += max(0, p.anon-g.anon-added)
	if missing == 0 {
		return nil
	}
	s := &Shrink{From: p.info.Number, Missing: missing, Reason: ShrinkDropped}
	switch {
	case g.info.Entries == 0:
		s.Reason = ShrinkHeaderOnly
	case g.isPrefixOf(p):
		s.Reason = ShrinkTruncated
	}
	return s
}

// isPrefixOf reports whether g holds the first lines of p, the same bytes, and no more.
func (g *genSets) isPrefixOf(p *genSets) bool {
	if g.maxOrd >= p.maxOrd || int64(len(g.byOrd)) != g.maxOrd+1 {
		return false
	}
	for ord, sum := range g.byOrd {
		if p.byOrd[ord] != sum {
			return false
		}
	}
	return true
}

// Newest is the newest generation of gens (nil when empty).
func Newest(gens []GenInfo) *GenInfo {
	if len(gens) == 0 {
		return nil
	}
	return &gens[len(gens)-1]
}
