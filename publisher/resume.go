package publisher

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"go.uber.org/zap"

	"github.com/pisync/pisync/checkpoint"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// resume fills st.acked and st.held. With a valid checkpoint (start.Offset > 0 or a
// checkpointed generation) it asks the mirror what it holds after the checkpointed
// stream sequence; without one, it reads the conversation's whole subject, compares the
// local file with the newest mirrored generation, and starts a new generation if any
// mirrored line changed or vanished.
func (p *Publisher) resume(ctx context.Context, st *fileState, start watcher.Start, log *zap.Logger) error {
	if st.acked.Generation > 0 && (start.Offset > 0 || st.acked.StreamSeq > 0) {
		last, err := p.reader.LastSeq(ctx, st.conv)
		if err != nil {
			return err
		}
		newer, vanished := false, false
		if last >= st.acked.StreamSeq {
			held, newerGen, err := p.heldSince(ctx, st.conv, st.acked.Generation, st.acked.StreamSeq+1, last)
			if err != nil {
				return err
			}
			st.fenceSeq = last
			if !newerGen {
				// Lines acknowledged past the checkpoint (the daemon died before
				// committing them) must still be in the file: a file cut back since
				// holds less than the mirror, a new generation.
				// (The whole-file comparison below tells those from lines the session
				// store wrote.)
				cmp, err := compareWithMirror(st.file.Path, st.acked.Offset, st.acked.Ordinal, held)
				if err != nil {
					return fmt.Errorf("compare %s with the mirror: %w", st.file.Path, err)
				}
				if cmp == sameLength || cmp == longer {
					st.held = held
					return nil
				}
				vanished = true
			} else {
				// A generation started after the checkpoint was committed (the daemon
				// died in between): the checkpoint's generation is over.
				newer = true
			}
		}
		switch {
		case vanished:
			log.Info("lines mirrored past the checkpoint changed or vanished locally; comparing the whole file with the mirror",
				zap.String("conversation", st.conv.Key), zap.Int64("checkpoint_ordinal", st.acked.Ordinal))
		case !newer:
			// The mirror holds less than the checkpoint says it acknowledged: the stream
			// was purged or restored from an older backup.
			log.Warn("the mirror is behind this file's checkpoint; comparing the whole file with it",
				zap.String("conversation", st.conv.Key), zap.Uint64("checkpoint_seq", st.acked.StreamSeq), zap.Uint64("mirror_seq", last))
		}
		st.acked = frontier{}
		st.leaf.Set("")
	}
	var nw newest
	var last uint64
	err := p.reader.Scan(ctx, st.conv, mirror.ScanOptions{HeadersOnly: true}, func(m mirror.Msg) error {
		nw.add(m)
		last = max(last, m.Seq)
		return nil
	})
	if err != nil {
		return fmt.Errorf("resume %s: %w", st.conv.Key, err)
	}
	top := nw.gen
	p.m.resumeQuery.WithLabelValues("scan").Inc()
	st.acked = frontier{Generation: max(top, 1), Base: nw.msgs - nw.genMsgs}
	if top == 0 {
		return nil
	}
	st.fenceSeq = last
	held := nw.held
	cmp, err := compareWithMirror(st.file.Path, 0, 0, held)
	if err != nil {
		return fmt.Errorf("compare %s with the mirror: %w", st.file.Path, err)
	}
	store := false
	if cmp != differs && cmp != sameLength {
		// One writer at a time (DESIGN §8): a generation the session store writes is
		// kept only by a file that holds exactly its lines so far (the store then wrote
		// after them); a file with lines of its own past them was appended to locally
		// since the cut-over.
		if store, err = p.storeWrites(ctx, st, top); err != nil {
			return fmt.Errorf("resume %s: %w", st.conv.Key, err)
		}
	}
	if cmp == sameLength || cmp == longer && !store || cmp == shorter && store {
		st.held = held
		return nil
	}
	st.acked.Generation, st.acked.Base = top+1, nw.msgs
	p.m.generations.Inc()
	why := "mirrored lines changed or vanished locally; starting a new generation"
	if store {
		why = "the session store writes this conversation and the local file was appended to since; starting a new generation"
	}
	log.Info(why, zap.String("conversation", st.conv.Key), zap.Int("generation", top+1))
	return nil
}

// newest collects what the newest generation of a conversation holds, from its
// messages in stream order. Older generations are dropped as soon as a newer one
// appears, and their later messages (a resend can land after a newer generation
// started) are skipped: memory holds one generation's digests, not one per generation
// (issue 13 item 9: a file rewritten often, resumed without its state directory).
type newest struct {
	gen     int
	held    map[int64]heldLine
	msgs    uint64 // messages read, of every generation
	genMsgs uint64 // of them, those of generation gen
}

func (n *newest) add(m mirror.Msg) {
	n.msgs++
	switch {
	case m.Generation < n.gen:
		return
	case m.Generation > n.gen || n.held == nil:
		n.gen, n.held, n.genMsgs = m.Generation, map[int64]heldLine{}, 0
	}
	n.genMsgs++
	if _, dup := n.held[m.Ordinal]; !dup {
		n.held[m.Ordinal] = heldLine{sha: m.SHA256, seq: m.Seq}
	}
}

// heldSince returns the lines of generation gen the mirror holds from stream sequence
// from on, and whether a newer generation appears there; last is the subject's newest sequence (one direct get), which answers most
// calls without reading anything.
func (p *Publisher) heldSince(ctx context.Context, c mirror.Conv, gen int, from, last uint64) (held map[int64]heldLine, newer bool, err error) {
	if last < from {
		p.m.resumeQuery.WithLabelValues("last_seq").Inc()
		return nil, false, nil
	}
	held = map[int64]heldLine{}
	err = p.reader.Scan(ctx, c, mirror.ScanOptions{FromSeq: from, HeadersOnly: true}, func(m mirror.Msg) error {
		switch {
		case m.Generation > gen:
			newer = true
		case m.Generation == gen:
			if _, dup := held[m.Ordinal]; !dup {
				held[m.Ordinal] = heldLine{sha: m.SHA256, seq: m.Seq}
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("resume %s: %w", c.Key, err)
	}
	p.m.resumeQuery.WithLabelValues("scan").Inc()
	return held, newer, nil
}

// comparison is how a local file compares with the lines a generation holds.
type comparison int

const (
	differs    comparison = iota // a mirrored line is not at its ordinal in the file
	sameLength                   // the file holds exactly the mirrored lines (and perhaps a torn tail)
	longer                       // the file holds every mirrored line, then lines of its own
	shorter                      // the file holds the first mirrored lines, then ends
)

// compareWithMirror compares the file from ordinal from on (the line at byte offset off)
// with what the mirror holds there, byte for byte, by ordinal. It streams the file, so
// memory does not grow with line size.
func compareWithMirror(path string, off, from int64, held map[int64]heldLine) (comparison, error) {
	var top int64 = -1
	for o := range held {
		top = max(top, o)
	}
	if top < from {
		return sameLength, nil // nothing mirrored from there on to compare
	}
	f, err := os.Open(path)
	if err != nil {
		return differs, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(io.NewSectionReader(f, off, 1<<62), 256<<10)
	h := sha256.New()
	for ord := from; ; {
		chunk, err := r.ReadSlice('\n')
		switch {
		case err == nil && ord > top:
			return longer, nil
		case err == nil:
			h.Write(chunk[:len(chunk)-1]) // the digest covers the line without its newline
			if hl, ok := held[ord]; ok && hl.sha != hex.EncodeToString(h.Sum(nil)) {
				return differs, nil
			}
			h.Reset()
			ord++
		case errors.Is(err, bufio.ErrBufferFull):
			h.Write(chunk)
		case errors.Is(err, io.EOF) && ord > top:
			return sameLength, nil // a torn tail is not a line
		case errors.Is(err, io.EOF):
			return shorter, nil // mirrored lines vanished, or another writer added them
		default:
			return differs, err
		}
	}
}

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
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, start, rec.LastLen)); err != nil {
		return false, err
	}
	return hex.EncodeToString(h.Sum(nil)) == rec.LastSHA, nil
}
