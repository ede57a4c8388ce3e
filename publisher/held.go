package publisher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"sync"

	"github.com/pisync/pisync/mirror"
)

// What the mirror already holds of a file, read in bounded memory.
//
// Resuming a file without its checkpoint compares it with the newest generation the
// mirror holds, and then skips publishing the lines the mirror has. Holding a digest per
// line of that generation grows with the file (a few hundred MB for a multi-GiB session).
// Instead, a first pass over the messages' headers (newest) keeps a handful of numbers:
// the generation, its first and the subject's last stream sequence, its highest ordinal,
// and its disorder, how far behind a higher ordinal a message was stored. Messages of one
// generation are stored in ordinal order but for resends after a timeout, which the
// in-flight window bounds. A message with ordinal o is therefore stored before any with
// an ordinal above o+disorder, and a window (heldWindow) that has read past o+disorder
// knows every line the mirror holds at o. It reads the generation again in ordinal order,
// holding the lines between the ordinal asked and o+disorder, and no others.
//
// A short generation (at most heldLimit messages) is kept whole by the first pass, which
// costs one read of the subject as before. A generation stored further out of order than
// maxDisorder is not compared: the file starts a new generation (undecided), which costs a
// publish of the file again and never loses or misplaces a line.

// heldLine is a line the mirror holds: its digest and stream sequence.
type heldLine struct {
	sha [sha256.Size]byte
	seq uint64
}

// holds reports whether h is the line of digest sha (hex, as published).
func (h heldLine) holds(sha string) bool {
	return h.sha == digestOf(sha)
}

// digestOf decodes a hex digest; one that does not decode is all zeros, which matches no
// line's digest.
func digestOf(sha string) [sha256.Size]byte {
	var d [sha256.Size]byte
	if len(sha) != 2*sha256.Size {
		return d
	}
	if _, err := hex.Decode(d[:], []byte(sha)); err != nil {
		return [sha256.Size]byte{}
	}
	return d
}

// heldLimit is the most lines the first pass keeps; a longer generation is read again
// through a window. Above the in-flight window, so that the lines a reconciliation looks
// at (those of the file past its frontier) are kept whole.
func (p *Publisher) heldLimit() int { return max(heldLimitMin, 2*p.opts.WindowMessages) }

// heldLimitMin is heldLimit's floor (a variable for tests).
var heldLimitMin = 8192

// maxDisorder is the most disorder a window accepts: several in-flight windows.
func (p *Publisher) maxDisorder() int64 { return max(1<<16, 4*int64(p.opts.WindowMessages)) }

// fillAhead is how many ordinals a window reads past what it must, so that a window read
// again costs one scan per fillAhead lines, not one per line (a variable for tests).
var fillAhead int64 = 8192

// newest collects what the newest generation of a conversation holds, from its messages
// in stream order (or, with only set, generation only and whether a newer one appears).
// Older generations are dropped as soon as a newer one appears, and their later messages
// (a resend can land after a newer generation started) are skipped. Its memory is at most
// limit lines (0: no limit).
type newest struct {
	only  int // collect this generation only (0: the newest)
	limit int

	gen      int
	msgs     uint64 // messages read, of every generation
	genMsgs  uint64 // of them, those of generation gen
	first    uint64 // stream sequence of gen's first message
	last     uint64 // newest stream sequence read
	top      int64  // highest ordinal of gen
	disorder int64  // how far below an ordinal stored before it a message of gen came
	newer    bool   // with only: a newer generation appears
	spilled  bool   // gen has more than limit lines: lines is nil
	lines    map[int64]heldLine
}

func (n *newest) add(m mirror.Msg) error {
	n.msgs++
	n.last = max(n.last, m.Seq)
	if n.only != 0 && m.Generation != n.only {
		n.newer = n.newer || m.Generation > n.only
		return nil
	}
	switch {
	case m.Generation < n.gen:
		return nil
	case m.Generation > n.gen || n.genMsgs == 0:
		n.gen, n.genMsgs, n.first, n.top, n.disorder = m.Generation, 0, m.Seq, m.Ordinal, 0
		n.lines, n.spilled = map[int64]heldLine{}, false
	}
	n.genMsgs++
	n.disorder = max(n.disorder, n.top-m.Ordinal)
	n.top = max(n.top, m.Ordinal)
	if n.spilled {
		return nil
	}
	if _, dup := n.lines[m.Ordinal]; !dup {
		if n.limit > 0 && len(n.lines) >= n.limit {
			n.lines, n.spilled = nil, true
			return nil
		}
		n.lines[m.Ordinal] = heldLine{sha: digestOf(m.SHA256), seq: m.Seq}
	}
	return nil
}

// doubled reports whether the generation holds an ordinal more than once (a line stored
// twice past the duplicate window): more messages than ordinals. Kept whole, the ordinals
// are counted; past limit, they are taken to be 0 to top, which misses a second copy only
// in a generation with a gap (a line over the maximum size is skipped).
func (n *newest) doubled() bool {
	if n.spilled {
		return n.genMsgs > uint64(n.top+1)
	}
	return n.genMsgs > uint64(len(n.lines))
}

// window returns what the pass found as a window (nil: no line of the generation).
func (n *newest) window(c mirror.Conv, maxDisorder int64) *heldWindow {
	if n.genMsgs == 0 {
		return nil
	}
	w := &heldWindow{conv: c, gen: n.gen, msgs: n.genMsgs, start: n.first, end: n.last, top: n.top,
		disorder: n.disorder, maxDisorder: maxDisorder, ahead: fillAhead, complete: !n.spilled}
	if w.complete {
		w.lines = n.lines
	}
	return w.reread(0)
}

// heldWindow reads the lines one generation holds in stream sequences [start, end], in
// ordinal order. Its user asks for ordinals in increasing order (take); fill reads what
// is needed to decide the one asked. With complete set every line is in lines from the
// start and nothing is read.
//
// The publisher keeps a file's window (fileState.held) while its lines are read again:
// the watcher's goroutine for the file is the only one that changes it, under the file's
// lock; reconciliations read it under that lock.
type heldWindow struct {
	conv        mirror.Conv
	gen         int
	msgs        uint64 // messages of gen in the range
	start, end  uint64
	top         int64 // highest ordinal of gen in the range
	disorder    int64
	maxDisorder int64
	ahead       int64 // fillAhead
	complete    bool

	read  uint64 // last stream sequence read
	seen  int64  // highest ordinal read
	next  int64  // lowest ordinal not taken
	done  bool   // the whole range is read
	lines map[int64]heldLine
	peak  int // most lines held at once (for tests)
	fills int // scans read (for tests)
}

// reread returns a window over the same lines from ordinal from on, read again.
func (w *heldWindow) reread(from int64) *heldWindow {
	if w == nil {
		return nil
	}
	c := *w
	c.read, c.seen, c.next, c.done = w.start-1, -1, from, w.complete
	if w.complete {
		c.lines = maps.Clone(w.lines)
		c.peak = len(c.lines)
	} else {
		c.lines = map[int64]heldLine{}
	}
	return &c
}

// decided reports whether the window has read every line the mirror holds at ordinal o.
func (w *heldWindow) decided(o int64) bool {
	return w.done || o > w.top || w.seen > o+w.disorder
}

// push adds a message read from the range.
func (w *heldWindow) push(m mirror.Msg) {
	w.read = max(w.read, m.Seq)
	if m.Seq >= w.end {
		w.done = true
	}
	if m.Seq > w.end || m.Generation != w.gen || m.Ordinal < w.next {
		return // a later message, another generation, or a late copy of a line taken
	}
	w.seen = max(w.seen, m.Ordinal)
	if w.lines == nil {
		w.lines = map[int64]heldLine{}
	}
	if _, dup := w.lines[m.Ordinal]; !dup { // the first copy stored is the one kept
		w.lines[m.Ordinal] = heldLine{sha: digestOf(m.SHA256), seq: m.Seq}
		w.peak = max(w.peak, len(w.lines))
	}
}

// take returns the line held at ordinal o (which must be decided) and forgets every line
// below o+1.
func (w *heldWindow) take(o int64) (heldLine, bool) {
	h, ok := w.lines[o]
	w.forget(o + 1)
	return h, ok
}

// forget drops the lines below ordinal o.
func (w *heldWindow) forget(o int64) {
	if o <= w.next {
		return
	}
	if o-w.next <= int64(len(w.lines)) {
		for k := w.next; k < o; k++ {
			delete(w.lines, k)
		}
	} else {
		for k := range w.lines {
			if k < o {
				delete(w.lines, k)
			}
		}
	}
	w.next = o
	if len(w.lines) == 0 && o > w.top {
		w.lines = nil // an emptied map keeps its buckets, and the file may idle for days
	}
}

// has reports whether the window holds line o with digest sha, not yet taken.
func (w *heldWindow) has(o int64, sha [sha256.Size]byte) bool {
	if w == nil {
		return false
	}
	h, ok := w.lines[o]
	return ok && h.sha == sha
}

// after is the last stream sequence the window covers (0 for none): messages up to it
// were compared with the file when it was opened.
func (w *heldWindow) after() uint64 {
	if w == nil {
		return 0
	}
	return w.end
}

// size is how many messages of the generation the window covers (for logs).
func (w *heldWindow) size() uint64 {
	if w == nil {
		return 0
	}
	return w.msgs
}

var errFilled = errors.New("window filled")

// fill reads the window on until ordinal o is decided, and fillAhead ordinals further.
// mu, if not nil, is held while the window changes.
func (p *Publisher) fill(ctx context.Context, w *heldWindow, o int64, mu sync.Locker) error {
	lock := func() {
		if mu != nil {
			mu.Lock()
		}
	}
	unlock := func() {
		if mu != nil {
			mu.Unlock()
		}
	}
	lock()
	w.fills++
	unlock()
	want := o + w.disorder + w.ahead
	// The first pass read up to w.end: a replica behind its leader must not end the
	// window early.
	opts := mirror.ScanOptions{FromSeq: w.read + 1, HeadersOnly: true, Through: w.end}
	err := p.reader.Scan(ctx, w.conv, opts, func(m mirror.Msg) error {
		lock()
		w.push(m)
		done := w.done || w.seen > want
		unlock()
		if done {
			return errFilled
		}
		return nil
	})
	switch {
	case errors.Is(err, errFilled):
		return nil
	case err != nil:
		return err
	}
	// Scan read up to the subject's newest message: nothing of the range is left.
	lock()
	w.done = true
	unlock()
	return nil
}

// takeHeld returns the line the mirror held at ordinal o of st when the file was opened,
// if any, reading st's window on as needed.
func (p *Publisher) takeHeld(ctx context.Context, st *fileState, o int64) (heldLine, bool, error) {
	st.mu.Lock()
	w := st.held
	st.mu.Unlock()
	if w == nil {
		return heldLine{}, false, nil
	}
	// Only this goroutine changes w (under st.mu), so reading it unlocked here is safe.
	for !w.decided(o) {
		if err := p.fill(ctx, w, o, &st.mu); err != nil {
			return heldLine{}, false, err
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	h, ok := w.take(o)
	return h, ok, nil
}
