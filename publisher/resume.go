package publisher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// resume fills st.acked and st.held. With a valid checkpoint (start.Offset > 0 or a
// checkpointed generation) it asks the mirror what it holds after the checkpointed
// stream sequence; without one, it reads the conversation's whole subject, compares the
// local file with the newest mirrored generation, and starts a new generation if any
// mirrored line changed or vanished, or the generation holds a line twice. prior is what
// the file had acknowledged under st's key before (its previous state, or checkpoint):
// it tells a copy another host continued from a file changed here (failover.go), and
// what resume found of that is returned.
//
// Memory does not grow with the file: a first pass over the messages' headers learns the
// newest generation, its extent and how far out of ordinal order it was stored, keeping
// nothing per line; the comparison and then the lines the publisher must not send again
// are read in ordinal order through a window (heldWindow).
func (p *Publisher) resume(ctx context.Context, st *fileState, start watcher.Start, prior known, log *zap.Logger) (resumeOutcome, error) {
	if st.acked.Generation > 0 && (start.Offset > 0 || st.acked.StreamSeq > 0) {
		if kept, err := p.resumeFromCheckpoint(ctx, st, log); err != nil || kept {
			return resumeOutcome{}, err
		}
		st.acked = frontier{}
		st.leaf.Set("")
	}
	nw := newest{limit: p.heldLimit()}
	err := p.reader.Scan(ctx, st.conv, mirror.ScanOptions{HeadersOnly: true}, nw.add)
	if err != nil {
		return resumeOutcome{}, fmt.Errorf("resume %s: %w", st.conv.Key, err)
	}
	top := nw.gen
	p.m.resumeQuery.WithLabelValues("scan").Inc()
	st.acked = frontier{Generation: max(top, 1), Base: nw.msgs - nw.genMsgs}
	if top == 0 {
		return resumeOutcome{}, nil
	}
	st.fenceSeq = nw.last
	held := nw.window(st.conv, p.maxDisorder())
	cmp, err := p.compareWithMirror(ctx, st.file.Path, st.file.Size, 0, 0, held)
	if err != nil {
		return resumeOutcome{}, fmt.Errorf("compare %s with the mirror: %w", st.file.Path, err)
	}
	g := genFacts{cmp: cmp.cmp, doubled: nw.doubled(), older: prior.ok && prior.at.Generation < top}
	var writer string // the host that wrote the mirror's line where the file parts from it
	for {
		c := chooseGeneration(g)
		var err error
		switch c.need {
		case genNeedStore:
			var store bool
			if g.writer.ok {
				store, err = p.storeWritesBy(ctx, st, top, cmp.line.seq)
			} else {
				store, err = p.storeWrites(ctx, st, top)
			}
			g.store = answer("", store)
		case genNeedWriter:
			writer, err = p.writerAt(ctx, st.conv, cmp)
			g.writer = answer("", writer != "" && writer != p.opts.Host)
		case genNeedIntact:
			var ok bool
			ok, err = p.intact(ctx, st, prior, top, cmp)
			g.intact = answer("", ok)
		case genNeedOwn:
			var ok bool
			ok, err = linePast(st.file.Path, st.file.Size, prior.at.Offset)
			g.own = answer("", ok)
		}
		if err != nil {
			return resumeOutcome{}, fmt.Errorf("resume %s: %w", st.conv.Key, err)
		}
		if c.need != genNeedNothing {
			continue
		}
		switch c.why {
		case genKept:
			st.held = held.reread(0)
			return resumeOutcome{}, nil
		case genContinued:
			st.held = held.reread(0)
			log.Info("another host continues this conversation past this file's last line; the file publishes nothing, and is mirrored apart if it gets lines of its own",
				zap.String("conversation", st.conv.Key), zap.String("host", writer), zap.Int64("lines", cmp.at))
			return resumeOutcome{}, nil
		case genBehind:
			p.stayBehind(st, prior)
			log.Info("another host started a newer generation of this conversation after this file's; the file publishes nothing, and is mirrored apart if it gets lines of its own",
				zap.String("conversation", st.conv.Key), zap.String("host", writer), zap.Int("generation", top))
			return resumeOutcome{behind: true}, nil
		case genDiverged:
			d := &mirror.Divergence{Key: st.conv.Key, Generation: top, Ordinal: cmp.at, Host: writer}
			if g.older {
				d.Generation, d.Ordinal = prior.at.Generation, prior.at.Ordinal
			}
			return resumeOutcome{diverged: d}, nil
		}
		st.acked.Generation, st.acked.Base = top+1, nw.msgs
		p.m.generations.Inc()
		why := "mirrored lines changed or vanished locally; starting a new generation"
		switch c.why {
		case genTwice:
			log.Warn("the newest generation holds a line twice; starting a new generation",
				zap.String("conversation", st.conv.Key), zap.Int("generation", top+1),
				zap.Uint64("messages", nw.genMsgs), zap.Int64("last_ordinal", nw.top))
			return resumeOutcome{}, nil
		case genStore:
			why = "the session store writes this conversation and the local file was appended to since; starting a new generation"
		case genUndecided:
			why = "the newest generation was stored too far out of line order to compare it in bounded memory; starting a new generation"
		}
		log.Info(why, zap.String("conversation", st.conv.Key), zap.Int("generation", top+1))
		return resumeOutcome{}, nil
	}
}

// resumeFromCheckpoint reads what the mirror holds past st's checkpoint and keeps the
// checkpoint's frontier when the file still holds it (choosePast), or reports that the
// whole file is to be compared with the mirror (kept false).
func (p *Publisher) resumeFromCheckpoint(ctx context.Context, st *fileState, log *zap.Logger) (kept bool, err error) {
	past, err := p.pastCheckpoint(ctx, st)
	if err != nil {
		return false, err
	}
	f := pastFacts{behind: past.behind}
	var held *heldWindow
	for {
		c := choosePast(f)
		switch c.need {
		case pastNeedRead:
			h, newer, last, short, err := p.heldPast(ctx, st.conv, st.acked.Generation, st.acked.StreamSeq+1, past)
			if err != nil {
				return false, err
			}
			st.fenceSeq = last
			held, f.read, f.short, f.newer = h, true, short, newer
			continue
		case pastNeedCompare:
			cmp, err := p.compareWithMirror(ctx, st.file.Path, st.file.Size, st.acked.Offset, st.acked.Ordinal, held)
			if err != nil {
				return false, fmt.Errorf("compare %s with the mirror: %w", st.file.Path, err)
			}
			f.compared, f.cmp = true, cmp.cmp
			continue
		}
		switch c.why {
		case pastKept:
			st.held = held.reread(st.acked.Ordinal)
			return true, nil
		case pastShort:
			log.Info("lines past the checkpoint were stored before its sequence; comparing the whole file with the mirror",
				zap.String("conversation", st.conv.Key), zap.Int64("checkpoint_ordinal", st.acked.Ordinal),
				zap.Uint64("checkpoint_seq", st.acked.StreamSeq), zap.Stringer("mirror", past))
		case pastVanished:
			log.Info("the mirror holds lines past the checkpoint that the file does not (changed or cut back here, or another host's copy went on); comparing the whole file with the mirror",
				zap.String("conversation", st.conv.Key), zap.Int64("checkpoint_ordinal", st.acked.Ordinal))
		case pastBehind:
			log.Warn("the mirror is behind this file's checkpoint; comparing the whole file with it",
				zap.String("conversation", st.conv.Key), zap.Uint64("checkpoint_seq", st.acked.StreamSeq), zap.Stringer("mirror", past))
		}
		return false, nil
	}
}

// checkpointView is what the mirror says about a conversation past a file's checkpoint.
// With the count of older generations known (GenBase), the stream's leader counts the
// conversation's messages: what lies past the checkpoint is that count less the
// checkpoint's (GenBase + Ordinal), whichever replica a read is served by (a replica
// behind its leader would have a resume resend acknowledged lines). Records without
// GenBase fall back to the subject's newest sequence, which any replica may answer.
type checkpointView struct {
	behind bool    // the mirror holds less than the checkpoint acknowledged
	below  *uint64 // messages the checkpoint accounts for (nil: unknown)
	count  uint64  // messages the leader counts (with below)
	last   uint64  // the subject's newest sequence (without below)
}

func (v checkpointView) String() string {
	if v.below != nil {
		return fmt.Sprintf("%d messages, the checkpoint accounts for %d", v.count, *v.below)
	}
	return fmt.Sprintf("newest sequence %d", v.last)
}

func (p *Publisher) pastCheckpoint(ctx context.Context, st *fileState) (checkpointView, error) {
	if st.acked.Generation == 1 || st.acked.Base > 0 {
		below := st.acked.Base + uint64(st.acked.Ordinal)
		n, err := p.reader.Count(ctx, st.conv)
		if err != nil {
			return checkpointView{}, err
		}
		return checkpointView{behind: n < below, below: &below, count: n}, nil
	}
	last, err := p.reader.LastSeq(ctx, st.conv)
	if err != nil {
		return checkpointView{}, err
	}
	return checkpointView{behind: last < st.acked.StreamSeq, last: last}, nil
}

// heldPast returns the lines of generation gen the mirror holds from stream sequence
// from on, whether a newer generation appears there, the subject's newest sequence
// known after the read, and whether the read found fewer messages from there on than
// the leader counts past the checkpoint (short: some were stored before from, or a
// replica did not deliver them in time); v (pastCheckpoint) answers most calls without
// reading anything. Like the whole-subject pass of resume it keeps at most heldLimit
// lines; past that the window reads them again, in ordinal order, when they are needed.
func (p *Publisher) heldPast(ctx context.Context, c mirror.Conv, gen int, from uint64, v checkpointView) (held *heldWindow, newer bool, last uint64, short bool, err error) {
	nw := &newest{only: gen, limit: p.heldLimit()}
	if v.below != nil && v.count <= *v.below || v.below == nil && v.last < from {
		p.m.resumeQuery.WithLabelValues("last_seq").Inc()
		return nw.window(c, p.maxDisorder()), false, from - 1, false, nil
	}
	var skipped uint64
	opts := mirror.ScanOptions{FromSeq: from, HeadersOnly: true, Below: v.below, Skipped: &skipped}
	if v.below != nil {
		opts.Counted = &v.count // what the read is held against: the count pastCheckpoint took
	}
	if err := p.reader.Scan(ctx, c, opts, nw.add); err != nil {
		return nil, false, 0, false, fmt.Errorf("resume %s: %w", c.Key, err)
	}
	p.m.resumeQuery.WithLabelValues("scan").Inc()
	short = v.below != nil && nw.msgs+skipped < v.count-*v.below
	return nw.window(c, p.maxDisorder()), nw.newer, max(nw.last, from-1, v.last), short, nil
}

// heldSince returns the lines of generation gen the mirror holds from stream sequence
// from on, as heldPast, all of them. A reconciliation asks from its frontier on, past
// the lines its file's window covers (heldWindow.after): what it reads is the file's own
// lines in flight, bounded by the in-flight window, and what another writer appended
// since (which makes the file give the generation up, onewriter.go).
func (p *Publisher) heldSince(ctx context.Context, c mirror.Conv, gen int, from, last uint64) (held map[int64]heldLine, newer bool, err error) {
	nw, err := p.scanGen(ctx, c, gen, from, last, 0)
	return nw.lines, nw.newer, err
}

func (p *Publisher) scanGen(ctx context.Context, c mirror.Conv, gen int, from, last uint64, limit int) (*newest, error) {
	nw := &newest{only: gen, limit: limit}
	if last < from {
		p.m.resumeQuery.WithLabelValues("last_seq").Inc()
		return nw, nil
	}
	if err := p.reader.Scan(ctx, c, mirror.ScanOptions{FromSeq: from, HeadersOnly: true}, nw.add); err != nil {
		return nw, fmt.Errorf("resume %s: %w", c.Key, err)
	}
	p.m.resumeQuery.WithLabelValues("scan").Inc()
	return nw, nil
}

// comparison is how a local file compares with the lines a generation holds.
type comparison int

const (
	differs    comparison = iota // a mirrored line is not at its ordinal in the file
	sameLength                   // the file holds exactly the mirrored lines (and perhaps a torn tail)
	longer                       // the file holds every mirrored line, then lines of its own
	shorter                      // the file holds the first mirrored lines, then ends
	undecided                    // the generation is stored too far out of order to compare in bounded memory
)

// compared is the outcome of compareWithMirror: how the file compares and, when it
// differs or is shorter, where: at is the first ordinal the file does not hold as the
// mirror does, line the first line the mirror holds from there on (found false: none).
type compared struct {
	cmp   comparison
	at    int64
	line  heldLine
	found bool
	// before is the last line the file holds as the mirror does, before at (ok: any).
	before   heldLine
	beforeOK bool
}

// compareWithMirror compares the file from ordinal from on (the line at byte offset off)
// with what the mirror holds there, byte for byte, by ordinal. It streams the file, and
// reads held in ordinal order through a fresh window, so memory grows neither with line
// size nor with the number of lines.
//
// Only the first size bytes count, the size the watcher found when it opened the file:
// the watcher tells a later truncation from growth by that size, so a line accepted past
// it could vanish unseen (a file opened in the middle of an in-place rewrite of the same
// lines, compared once the rewrite was done, then cut back to fewer lines, but not below
// that size: read on as growth, every line held, the vanished ones kept).
//
// An ordinal the generation has no line at (its file's line was too long to mirror, or
// refused for good) is the file's own when this host wrote the generation's next line:
// the file that left it out reads it again. Where another host wrote on, the file's line
// there is not one the mirror holds: a copy rebuilt by recovery has a placeholder there,
// which is none of the conversation's lines (the file differs).
func (p *Publisher) compareWithMirror(ctx context.Context, path string, size, off, from int64, held *heldWindow) (compared, error) {
	if held == nil || held.top < from {
		return compared{cmp: sameLength}, nil // nothing mirrored from there on to compare
	}
	if !held.complete && held.disorder > held.maxDisorder {
		return compared{cmp: undecided}, nil
	}
	w := held.reread(from)
	f, err := os.Open(path)
	if err != nil {
		return compared{}, err
	}
	defer f.Close()
	ord := from         // of the next line
	holesMine := false  // a hole was found left out by this host: the generation's others are too
	var at heldLine     // the mirror's line where the file differs
	var before heldLine // the last line the file holds as the mirror does
	beforeOK := false
	_, err = session.ReadLines(io.NewSectionReader(f, off, max(size-off, 0)), func(l session.DigestedLine) error {
		if ord > w.top {
			return errLonger
		}
		for !w.decided(ord) {
			if err := p.fill(ctx, w, ord, nil); err != nil {
				return err
			}
		}
		hl, ok := w.take(ord)
		switch {
		case ok && !hl.holds(l.SHA256):
			at = hl
			return errDiffers
		case !ok && !holesMine:
			next, found, err := p.nextHeld(ctx, w, ord+1)
			if err != nil {
				return err
			}
			if found {
				mine, err := p.writtenHere(ctx, w.conv, next)
				if err != nil {
					return err
				}
				if !mine {
					at = next
					return errDiffers
				}
				holesMine = true
			}
		case ok:
			before, beforeOK = hl, true
		}
		ord++
		return nil
	})
	switch {
	case errors.Is(err, errLonger):
		return compared{cmp: longer}, nil
	case errors.Is(err, errDiffers):
		return compared{cmp: differs, at: ord, line: at, found: true, before: before, beforeOK: beforeOK}, nil
	case err != nil:
		return compared{}, err
	case ord > w.top:
		return compared{cmp: sameLength}, nil // a torn tail is not a line
	}
	// Mirrored lines vanished, or another writer added them.
	next, found, err := p.nextHeld(ctx, w, ord)
	if err != nil {
		return compared{}, err
	}
	return compared{cmp: shorter, at: ord, line: next, found: found, before: before, beforeOK: beforeOK}, nil
}

// nextHeld returns the first line w holds at ordinal o or after, without taking it.
func (p *Publisher) nextHeld(ctx context.Context, w *heldWindow, o int64) (heldLine, bool, error) {
	for ; o <= w.top; o++ {
		for !w.decided(o) {
			if err := p.fill(ctx, w, o, nil); err != nil {
				return heldLine{}, false, err
			}
		}
		if h, ok := w.lines[o]; ok {
			return h, true, nil
		}
	}
	return heldLine{}, false, nil
}

// writtenHere reports whether this host published the line h of conversation c.
func (p *Publisher) writtenHere(ctx context.Context, c mirror.Conv, h heldLine) (bool, error) {
	l, err := p.reader.LineAt(ctx, c, h.seq)
	if err != nil {
		return false, fmt.Errorf("resume %s: the writer of sequence %d: %w", c.Key, h.seq, err)
	}
	return l.Host == p.opts.Host, nil
}

// The outcomes that end compareWithMirror's read of the file early.
var (
	errLonger  = errors.New("the file holds lines past the mirrored ones")
	errDiffers = errors.New("a mirrored line differs from the file's")
)

// verifyLastLine checks that the file still holds the checkpoint's last acknowledged line
// where the checkpoint says: the cheap test for a rewrite at start-up.
func verifyLastLine(path string, rec checkpoint.Record) (bool, error) {
	if rec.Offset == 0 {
		return true, nil
	}
	start := rec.Offset - rec.LastLen - 1
	if start < 0 {
		return false, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var nl [1]byte
	if _, err := f.ReadAt(nl[:], rec.Offset-1); err != nil {
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		return false, err
	}
	if nl[0] != '\n' {
		return false, nil
	}
	_, sum, err := session.DigestSection(f, start, rec.LastLen)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return false, nil // shorter than the line: not the file that held it
	case err != nil:
		return false, err
	}
	return session.HexDigest(sum) == rec.LastSHA, nil
}
