package publisher

import (
	"context"
	"crypto/sha256"
	"fmt"

	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// pending is one publish waiting for its acknowledgement.
type pending struct {
	st    *fileState
	it    *item
	out   *mirror.Outgoing // the message sent
	ack   *mirror.Pending
	epoch uint64 // the gate's epoch when it was sent
}

// Line turns one complete line into a message and publishes it, unless the mirror
// already holds it. It blocks while the in-flight window is full (backpressure onto the
// watcher, so that the files, not memory, buffer an outage).
func (p *Publisher) Line(ctx context.Context, f watcher.File, l watcher.Line) error {
	st := p.state(f.ID)
	if st == nil || st.skipped || st.file.Path != f.Path {
		// Not the file we opened under this identity (its inode number was reused, or
		// its state was retired when another file replaced it): open it again.
		return fmt.Errorf("%s: line %d of a file not opened under this identity: %w", f.Path, l.Ordinal+1, watcher.ErrReopen)
	}
	if err := p.waitResync(ctx, st); err != nil {
		return err
	}
	st.mu.Lock()
	takenOver := st.takenOver
	st.mu.Unlock()
	if takenOver {
		return fmt.Errorf("%s line %d: another writer extends the generation it was mirrored into: %w", f.Path, l.Ordinal+1, watcher.ErrReopen)
	}
	// While the cluster has no room, the whole host waits here (the files buffer).
	if err := p.gate.wait(ctx, p.closing); err != nil {
		return err
	}
	it := &item{ordinal: l.Ordinal, end: l.Offset + l.Len + 1, length: l.Len, seen: l.Seen}
	if l.Len > p.opts.MaxLineBytes {
		p.m.tooLarge.Inc()
		p.log.Error("line over the maximum line size skipped; recovery fills the gap it leaves",
			zap.String("path", f.Path), zap.Int64("line", l.Ordinal+1), zap.Int64("bytes", l.Len))
		it.done = true // nothing to publish: the frontier moves past it
		return p.enqueueResolved(st, it)
	}

	if err := leadHolds(st, l); err != nil {
		return fmt.Errorf("%s line %d: %w", f.Path, l.Ordinal+1, err)
	}
	data := l.Data
	var sum [sha256.Size]byte
	var prefix []byte // the first bytes of a line too long to hold, for its envelope
	if data == nil {
		var into *[]byte
		if l.Len > p.opts.BlobThreshold {
			// Going the blob way: the message will not keep these bytes, so they are read
			// into a buffer kept for the next such line. Allocating one afresh for each
			// (up to 16 MiB) kept the runtime returning pages to the system.
			into = blobReads.Get().(*[]byte)
			defer blobReads.Put(into)
		}
		var err error
		data, prefix, sum, err = readAgain(l, into)
		if err != nil {
			return fmt.Errorf("%s line %d: %w", f.Path, l.Ordinal+1, err)
		}
	} else {
		sum = sha256.Sum256(data)
	}
	blob := data == nil || l.Len > p.opts.BlobThreshold
	sha := session.HexDigest(sum)
	it.sha = sha

	h, isHeld, err := p.takeHeld(ctx, st, l.Ordinal)
	if err != nil {
		return fmt.Errorf("%s line %d: read what the mirror holds: %w", f.Path, l.Ordinal+1, err)
	}
	p.classify(st, it, data, prefix, f, l)
	if isHeld {
		if h.holds(sha) {
			p.m.heldBack.Inc()
			it.done, it.seq = true, h.seq
			return p.enqueueResolved(st, it)
		}
		// The file changed under what the mirror holds: reopening compares the whole file
		// with the mirror and starts a new generation.
		return fmt.Errorf("%s line %d differs from the mirrored line: %w", f.Path, l.Ordinal+1, watcher.ErrReopen)
	}

	st.mu.Lock()
	if st.storeGen != 0 && st.storeGen == st.acked.Generation {
		// The session store writes the generation this file's lines so far are in: a
		// line appended locally since goes to a new one, which reopening starts.
		st.mu.Unlock()
		return fmt.Errorf("%s line %d: the session store writes generation %d of this conversation: %w", f.Path, l.Ordinal+1, st.acked.Generation, watcher.ErrReopen)
	}
	ml := mirror.Line{
		Kind: it.kind, EntryID: entryID(it, l.Ordinal), ParentID: it.env.ParentID,
		EntryType: entryType(it), Ordinal: l.Ordinal, Generation: st.acked.Generation,
		SHA256: sha, Format: string(st.format), Host: p.opts.Host, Source: st.file.Rel,
	}
	conv := st.conv
	st.mu.Unlock()

	// The exact size (headers built) only for a line near the limit: most lines are far
	// below it, and building their headers twice would cost every line.
	near := int64(len(data)+len(ml.Source)+len(ml.Host))+headerReserve > p.maxPayload()
	if !blob && near && p.msgSize(ml, int64(len(data))) > p.maxPayload() {
		blob = true // the threshold allows it, the server would refuse it once headers count
	}
	var body []byte
	if blob {
		if err := p.putBlob(ctx, f, l, sha, data); err != nil {
			p.m.failures.WithLabelValues("blob").Inc()
			return err
		}
		ml.Kind, ml.BlobSize = mirror.KindBlob, l.Len
	} else {
		body = data // NewOutgoing copies it: the watcher's buffer is valid only during the call
	}
	it.kind = ml.Kind
	it.setOut(p.opts.Names.NewOutgoing(conv, ml, body))
	it.weight = int64(len(body)) + 512
	if err := p.acquire(ctx, it.weight); err != nil {
		return err
	}
	it.slot = true
	st.mu.Lock()
	wait := p.waitsBehind(st, it)
	it.waiting = wait
	st.queue = append(st.queue, it)
	st.seenEnd = max(st.seenEnd, it.end)
	st.mu.Unlock()
	if wait {
		return nil
	}
	return p.send(ctx, st, it)
}

// leadHolds checks a line among the first ones against what Open made of the file's
// beginning (where its header is): a file rewritten between Open's look at its first
// lines and their delivery (a fresh header over a title-first file, say) is opened
// again, so that no line is mirrored under the kind the old content gave its ordinal. A
// header replaced by another is still a header: the next run sees the first line
// changed and reopens the file.
func leadHolds(st *fileState, l watcher.Line) error {
	at := int64(st.headerAt)
	if l.Ordinal > at && (at >= 0 || l.Ordinal >= session.LeadLines) || l.Data == nil {
		return nil
	}
	_, err := session.ParseHeader(l.Data)
	isHeader := err == nil
	switch {
	case l.Ordinal == at && !isHeader:
		return fmt.Errorf("the session header is no longer where the file was opened with it: %w", watcher.ErrReopen)
	case l.Ordinal != at && isHeader:
		return fmt.Errorf("a session header where the file was opened without one: %w", watcher.ErrReopen)
	}
	return nil
}

// classify sets the item's kind and envelope. A line that is not a JSON entry is kept
// byte for byte as raw, reported with its file and line number. A line too large to hold
// in memory (data nil) is classified by its first bytes (prefix), where Pi writes the
// envelope, ahead of the payload.
func (p *Publisher) classify(st *fileState, it *item, data, prefix []byte, f watcher.File, l watcher.Line) {
	switch at := int64(st.headerAt); {
	case l.Ordinal == at:
		it.kind = mirror.KindHeader
		return
	case l.Ordinal < at:
		it.kind = mirror.KindRaw // a record written before the header (a fork's title): kept as it is
		return
	}
	if data == nil {
		if env, ok := session.ScanEnvelopePrefix(prefix); ok {
			it.kind, it.env, it.entry = mirror.KindEntry, env, true
			return
		}
		it.kind = mirror.KindRaw
		p.m.invalid.WithLabelValues("malformed").Inc()
		p.log.Warn("huge line does not start like a JSON entry; mirrored as raw", zap.String("path", f.Path),
			zap.Int64("line", l.Ordinal+1), zap.Int64("bytes", l.Len))
		return
	}
	if session.IsBlank(data) {
		it.kind = mirror.KindRaw
		p.m.invalid.WithLabelValues("blank").Inc()
		return
	}
	env, err := session.ScanEntry(data)
	if err != nil {
		it.kind = mirror.KindRaw
		p.m.invalid.WithLabelValues("malformed").Inc()
		p.log.Warn("line is not a JSON entry; mirrored as raw", zap.String("path", f.Path),
			zap.Int64("line", l.Ordinal+1), zap.Error(err))
		return
	}
	if env.ID != "" && !mirror.ValidEntryID(env.ID) {
		it.kind = mirror.KindRaw
		p.m.invalid.WithLabelValues("malformed").Inc()
		p.log.Warn("entry id cannot be mirrored; line kept as raw", zap.String("path", f.Path), zap.Int64("line", l.Ordinal+1))
		return
	}
	it.kind, it.env, it.entry = mirror.KindEntry, env, true
}

func entryID(it *item, ordinal int64) string {
	switch {
	case it.kind == mirror.KindHeader:
		return mirror.HeaderEntryType
	case it.kind == mirror.KindRaw || it.env.ID == "":
		return mirror.OrdinalID(ordinal)
	}
	return it.env.ID
}

func entryType(it *item) string {
	switch it.kind {
	case mirror.KindHeader:
		return mirror.HeaderEntryType
	case mirror.KindRaw:
		return ""
	}
	return it.env.Type
}

// enqueueResolved appends a line that needs no publish and moves the frontier.
func (p *Publisher) enqueueResolved(st *fileState, it *item) error {
	st.mu.Lock()
	st.queue = append(st.queue, it)
	released, moved := st.advance()
	st.mu.Unlock()
	if moved > 0 {
		p.noteDirty(st)
	}
	p.release(released)
	p.sendNext(st)
	return nil
}

// typeLabel is the type label of a published line: any type Pi does not write today (a
// file can say anything) is counted as "other", so that file content cannot create
// label values without bound.
func typeLabel(it *item) string {
	switch {
	case it.kind == mirror.KindHeader:
		return "session"
	case it.kind == mirror.KindRaw:
		return ""
	case session.IsEntryType(it.env.Type):
		return it.env.Type
	}
	return "other"
}
