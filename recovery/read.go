package recovery

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// Mirror is what recovery reads from the mirror; *mirror.Reader implements it, scoped to
// the caller's tenant and owner, so that a conversation of anyone else is "not found".
// Every method fails with an error wrapping mirror.ErrNotFound for what the owner lacks.
type Mirror interface {
	Conv(key string) (mirror.Conv, error)
	Scan(ctx context.Context, c mirror.Conv, opts mirror.ScanOptions, fn func(mirror.Msg) error) error
	ScanOwner(ctx context.Context, opts mirror.ScanOptions, fn func(key string, m mirror.Msg) error) error
	Counts(ctx context.Context) (map[string]uint64, error)
	// Conversations is the owner's conversations: the one listing every command starts from.
	Conversations(ctx context.Context) (mirror.Listing, error)
	Head(ctx context.Context, c mirror.Conv) (mirror.Head, uint64, error)
	Blob(ctx context.Context, sha256hex string) (io.ReadCloser, error)
}

var _ Mirror = (*mirror.Reader)(nil)

// maxInlineBlob bounds the blobs recovery reads into memory: only a blob header line and
// a blob leaf record are, to learn the header's fields or the leaf's target. Every other
// blob is streamed. The publisher reads lines up to this size whole as well.
const maxInlineBlob = session.MaxBufferedLine

// generation is one generation of a conversation as read from the mirror.
type generation struct {
	number  int
	numbers []int    // every generation present, ascending
	lines   []Line   // the chosen generation's lines, in stream order
	digests []string // of every line of every generation
	hist    *mirror.History
}

// history lists the conversation's generations; those the session store writes (and the
// local copies after them) are not compared with the ones before (DESIGN §8).
func (g *generation) history(head *mirror.Head) []mirror.GenInfo {
	if g.hist == nil {
		return nil
	}
	if head != nil && head.StoreWrites() {
		store := head.Generation
		g.hist.Skip = func(n int) bool { return n >= store }
	}
	return g.hist.Generations()
}

// held returns the digests of every line the mirror holds, in any generation: a local
// file is "held by the mirror" if its lines are all in it. Built on demand, since only a
// file already at the target needs it.
func (g *generation) held() map[string]bool {
	m := make(map[string]bool, len(g.digests))
	for _, d := range g.digests {
		m[d] = true
	}
	return m
}

// collector gathers generation want (0: the newest) of one conversation from its
// messages in stream order. With want 0 it keeps only the lines of the newest generation
// seen so far, so memory follows one generation. A repeated ordinal with other bytes is
// kept, for the rebuild to report (mirror.Reader.ReadGeneration drops it).
type collector struct {
	want  int
	at    time.Time // zero: now
	g     generation
	seen  map[int]bool
	msgs  uint64 // messages added
	bytes int64  // of the lines kept
}

// newCollector makes a collector for about n messages (0: unknown) of the mirror as it
// was at at (zero: as it is).
func newCollector(want, n int, at time.Time) *collector {
	return &collector{want: want, at: at, seen: map[int]bool{},
		g: generation{number: want, lines: make([]Line, 0, n), digests: make([]string, 0, n), hist: &mirror.History{}}}
}

func (c *collector) add(msg mirror.Msg) {
	c.msgs++
	c.g.digests = append(c.g.digests, msg.SHA256)
	c.g.hist.Add(msg)
	if !c.at.IsZero() && msg.Time.After(c.at) {
		return // stored after the point in time asked for
	}
	c.seen[msg.Generation] = true
	switch {
	case c.want != 0 && msg.Generation != c.want:
		return
	case c.want == 0 && msg.Generation < c.g.number:
		return
	case c.want == 0 && msg.Generation > c.g.number:
		c.g.number, c.g.lines, c.bytes = msg.Generation, c.g.lines[:0], 0
	}
	c.g.lines = append(c.g.lines, LineFromMsg(msg))
	c.bytes += int64(len(msg.Data))
}

// result is the generation gathered, or an error wrapping mirror.ErrNotFound.
func (c *collector) result(key string) (generation, error) {
	if len(c.seen) == 0 {
		if !c.at.IsZero() && c.msgs > 0 {
			return generation{}, fmt.Errorf("conversation %s: nothing of it was mirrored by %s: %w", key, c.at.Format(time.RFC3339), mirror.ErrNotFound)
		}
		return generation{}, fmt.Errorf("conversation %s: %w", key, mirror.ErrNotFound)
	}
	g := c.g
	for n := range c.seen {
		g.numbers = append(g.numbers, n)
	}
	sort.Ints(g.numbers)
	if len(g.lines) == 0 {
		return generation{}, fmt.Errorf("conversation %s generation %d (the mirror has %v): %w", key, c.want, g.numbers, mirror.ErrNotFound)
	}
	return g, nil
}

// readGeneration reads generation gen of conversation c (0: the newest).
func readGeneration(ctx context.Context, m Mirror, c mirror.Conv, gen int, at time.Time) (generation, error) {
	col := newCollector(gen, 0, at)
	err := m.Scan(ctx, c, mirror.ScanOptions{}, func(msg mirror.Msg) error {
		col.add(msg)
		return nil
	})
	if err != nil {
		return generation{}, err
	}
	return col.result(c.Key)
}

// inlineBlobs fetches the few blobs whose content the rebuild needs: a header stored as a
// blob (for the cwd and timestamp of the output path) and a leaf record stored as a blob
// (for its target). Their digests are checked here.
func inlineBlobs(ctx context.Context, m Mirror, lines []Line) error {
	for i := range lines {
		l := &lines[i]
		if l.Kind == mirror.KindBlob && l.Data == nil && repeatedBlob(*l) {
			if err := scanRepeatedBlob(ctx, m, l); err != nil {
				return fmt.Errorf("line %d: %w", l.Ordinal+1, err)
			}
			continue
		}
		if l.Kind != mirror.KindBlob || l.Data != nil || l.BlobSize > maxInlineBlob {
			continue
		}
		if !l.isHeader() && !(l.HasEnv && l.Env.Type == "leaf") {
			continue
		}
		data, err := fetchBlob(ctx, m, l.SHA256, l.BlobSize)
		if err != nil {
			return fmt.Errorf("line %d: %w", l.Ordinal+1, err)
		}
		l.Data = data
		if !l.isHeader() {
			if env, err := session.ScanEntry(data); err == nil {
				l.Env = env
			}
		}
	}
	return nil
}

// repeatedBlob reports whether l is a blob entry mirrored under its ordinal although its
// format gives every entry an id: the publisher mirrors so an entry repeating an earlier
// id of its generation (kind and type stay, the id is L<ordinal>). Pi moves its leaf to
// it, and so does the daemon's head; the id is only in the blob.
func repeatedBlob(l Line) bool {
	return l.Ordinal != 0 && l.HasEnv && l.Env.ID == "" && l.Env.Type != "" && l.Format != "" && l.Format != string(session.FormatV1)
}

// scanRepeatedBlob reads the envelope of a repeated blob entry as the publisher did: from
// the whole line when it reads such a line whole, else from its first bytes. Only the
// envelope is kept: the line is streamed at write time, through its digest.
func scanRepeatedBlob(ctx context.Context, m Mirror, l *Line) error {
	var env session.Envelope
	ok := false
	if l.BlobSize <= maxInlineBlob {
		data, err := fetchBlob(ctx, m, l.SHA256, l.BlobSize)
		if err != nil {
			return err
		}
		var serr error
		env, serr = session.ScanEntry(data)
		ok = serr == nil
	} else {
		rc, err := m.Blob(ctx, l.SHA256)
		if err != nil {
			return err
		}
		prefix, err := io.ReadAll(io.LimitReader(rc, session.LinePrefixKeep))
		rc.Close()
		if err != nil {
			return fmt.Errorf("blob %s: %w", l.SHA256, err)
		}
		env, ok = session.ScanEnvelopePrefix(prefix)
	}
	if ok && env.ID != "" && mirror.ValidEntryID(env.ID) {
		l.Env = env
	}
	return nil
}

// fetchBlob reads a whole blob (bounded by its recorded size) and checks its digest.
func fetchBlob(ctx context.Context, m Mirror, sha string, size int64) ([]byte, error) {
	rc, err := m.Blob(ctx, sha)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, size+1))
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", sha, err)
	}
	if err := checkBlob(sha, size, int64(len(data)), sha256.Sum256(data)); err != nil {
		return nil, err
	}
	return data, nil
}

func checkBlob(sha string, want, got int64, sum [32]byte) error {
	if got != want {
		return fmt.Errorf("%w: blob %s holds %d bytes, the mirror recorded %d", ErrDigest, sha, got, want)
	}
	if got := session.HexDigest(sum); got != sha {
		return fmt.Errorf("%w: blob %s hashes to %s", ErrDigest, sha, got)
	}
	return nil
}

// headOf returns the conversation's head: nil when the bucket has none, or when its
// value does not decode (then bad says why).
func headOf(ctx context.Context, m Mirror, c mirror.Conv) (head *mirror.Head, bad, err error) {
	h, _, err := m.Head(ctx, c)
	switch {
	case errors.Is(err, mirror.ErrNotFound):
		return nil, nil, nil
	case errors.Is(err, mirror.ErrBadHead):
		return nil, err, nil
	case err != nil:
		return nil, nil, err
	}
	return &h, nil, nil
}

// NewMirror binds the read API of the mirror for owner o.
func NewMirror(ctx context.Context, js jetstream.JetStream, n mirror.Names, o mirror.Owner) (Mirror, error) {
	return mirror.NewReader(ctx, js, n, o)
}
