package publisher

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pisync/pisync/mirror"
)

// Two lines of one generation carrying the same entry id share a message id, and the
// server would keep only the first within its duplicate window (Pi never writes such a
// file; a hand-edited or merged one can be). The publisher learns of it from the
// acknowledgement: a duplicate whose stored message sits at another ordinal is not a
// retry of this line but a repeated id. The line is then sent again under its ordinal
// (kind raw, entry id L<ordinal>), so that it is kept, in its place, byte for byte, and
// counted. This costs nothing per line: only a duplicate acknowledgement makes the
// publisher look at the stored message. Past the duplicate window the server keeps a
// repeated id as it is, so the line is not lost either; recovery keeps both in file order.

// idMayRepeat reports whether it carries an entry id taken from the line (the header and
// lines mirrored under their ordinal cannot collide with another line's).
func (it *item) idMayRepeat() bool {
	if it.out == nil || it.kind == mirror.KindHeader || it.kind == mirror.KindRaw {
		return false
	}
	return it.out.Line.OwnEntryID() != ""
}

// repeatedID looks at the message the server holds under it's message id. When it is
// another line's, it republishes it under its ordinal and reports true: the item stays
// unresolved until that publish is acknowledged.
func (p *Publisher) repeatedID(st *fileState, it *item, seq uint64) (bool, error) {
	ctx, cancel := context.WithTimeout(p.runCtx, 10*time.Second)
	defer cancel()
	held, err := p.reader.LineAt(ctx, st.conv, seq)
	if err != nil {
		return false, fmt.Errorf("read the message a duplicate acknowledgement names: %w", err)
	}
	if held.Ordinal == it.ordinal {
		return false, nil // a retry of this very line
	}
	// The item is unresolved but not in flight while the mirror is asked: a reconciliation
	// of the file may resolve it meanwhile, under the file's mutex.
	st.mu.Lock()
	if it.done || it.out == nil {
		st.mu.Unlock()
		return true, nil // resolved meanwhile: nothing left to publish
	}
	l := it.out.Line
	repeated := l.EntryID
	l.EntryID = mirror.OrdinalID(it.ordinal)
	if l.Kind == mirror.KindEntry { // a blob stays a blob: its bytes are in the object store
		l.Kind, l.EntryType, l.ParentID = mirror.KindRaw, "", ""
	}
	it.setOut(p.opts.Names.NewOutgoing(st.conv, l, it.out.Data))
	// it.entry stays: Pi moves its leaf to a repeated id as to any entry, and so do the
	// head and recovery (which applies the leaf rule to a raw line that is an entry with
	// a valid id: only a repeat is mirrored so).
	it.kind = l.Kind
	st.mu.Unlock()
	p.m.repeatedIDs.Inc()
	p.log.Warn("entry id already used by an earlier line of this generation; mirrored under its line number as raw",
		zap.String("path", st.file.Path), zap.Int64("line", it.ordinal+1), zap.Int64("first_line", held.Ordinal+1),
		zap.String("entry_id", repeated))
	// An error here means the publisher is closing: the line, unresolved, is published
	// again at the next start.
	_ = p.send(p.runCtx, st, it)
	return true, nil
}
