package recovery

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/pisync/pisync/mirror"
)

// FollowMirror is what a Follower reads: a recovery's mirror, the owner's lines as they
// are stored, and the changes of their heads.
type FollowMirror interface {
	Mirror
	CountsAndLast(ctx context.Context) (map[string]uint64, uint64, error)
	Follow(ctx context.Context, from uint64, fn func(mirror.Followed) error) error
	WatchHeads(ctx context.Context, fn func(mirror.HeadChange)) error
}

var _ FollowMirror = (*mirror.Reader)(nil)

// FollowOptions select what a Follower keeps current, and where.
type FollowOptions struct {
	Options          // where and how files are written, as for a one-time recovery
	IDs     []string // conversations to follow (with their clash keys); none: All
	All     bool     // every conversation of the owner, those created later included
	Host    string   // only conversations mirrored from this host ("": every host)
	// Hold is how long a line stored past a hole waits for the lines before it before
	// the file is rebuilt with the hole filled (0: 2 s).
	Hold time.Duration
	// Retry is how soon a conversation left in place is tried again once its head
	// changes (0: 5 s): a busy conversation whose file holds what the mirror lacks is not
	// read whole at each of its lines.
	Retry time.Duration
	// OnReport is called with the report of each conversation the follower writes,
	// finds current, or refuses (the first recovery's and each rebuild's), serialized.
	OnReport func(Report)
	// OnAppend is called after lines are appended to a file: the ordinals of the first
	// and the last, and the time the mirror stored the first.
	OnAppend func(key string, first, last int64, stored time.Time)
}

// ErrLocalChange is wrapped when a followed file no longer has the size the follower
// left it at: something else writes it, and the follower no longer appends to it.
var ErrLocalChange = errors.New("the file changed locally")

// Follower keeps files current with the mirror (recover --follow): a recovery, then the
// lines stored since appended as they come, a new conversation or a new generation written
// by recovery's atomic replace, a file that holds what the mirror lacks left in place and
// reported. One goroutine owns the files' state; Status reads a copy.
type Follower struct {
	m    FollowMirror
	rec  *Recoverer
	opts FollowOptions

	files map[string]*followed // by conversation key
	// unsettled are the conversations with a rebuild due or lines held: what reconcile
	// looks at, so that a caught-up line costs nothing per conversation followed.
	unsettled map[string]*followed
	pending   []pendingLine // lines decided, not yet written (flushed together)
	buffered  int64         // bytes in pending

	mu     sync.Mutex
	status FollowStatus
}

// followed is what the follower knows of one conversation.
type followed struct {
	key        string
	path       string
	gen        int
	next       int64 // the ordinal the file lacks first
	size       int64 // the file's size as the follower left it
	appendable bool
	// held are lines stored past next, by ordinal, waiting for the ones before them.
	held      map[int64]mirror.Msg
	heldSince time.Time

	dirty      bool      // to be rebuilt
	dirtySince time.Time //
	lastSeq    uint64    // stream sequence of the newest line seen
	headSeq    uint64    // the head's last sequence, as last seen

	left    bool   // left in place until its head changes
	leftWhy string // the last refusal, or why it is left
	deleted bool   // its source file was deleted (the head says so)
	retryAt time.Time
}

type pendingLine struct {
	key  string
	msg  mirror.Msg
	data []byte
}

// FollowStatus is what a follower has done and how far behind the mirror it is.
type FollowStatus struct {
	Started     bool      `json:"started"`        // the first recovery is done
	Position    uint64    `json:"position"`       // stream sequence of the last line applied
	Behind      uint64    `json:"behind_entries"` // lines the mirror holds past Position
	BehindSince time.Time `json:"behind_since"`   // stored time of the oldest line not applied (zero: current)
	Appended    uint64    `json:"appended_lines"` // lines appended since start
	Written     uint64    `json:"written_files"`  // files written by recovery since start
	Current     int       `json:"current"`        // conversations whose file is current
	Waiting     int       `json:"waiting"`        // conversations with a rebuild due
	Left        []Left    `json:"left,omitempty"` // conversations left in place
	UpdatedAt   time.Time `json:"updated_at"`     //
}

// Left is a conversation whose file the follower does not keep current, and why.
type Left struct {
	Key     string `json:"key"`
	Path    string `json:"path,omitempty"`
	Deleted bool   `json:"deleted,omitempty"` // deleted at its source: the file stays
	Reason  string `json:"reason"`
}

// NewFollower returns a follower of m.
func NewFollower(m FollowMirror, opts FollowOptions) *Follower {
	if opts.Hold <= 0 {
		opts.Hold = 2 * time.Second
	}
	if opts.Retry <= 0 {
		opts.Retry = 5 * time.Second
	}
	opts.Replace = true
	return &Follower{m: m, rec: New(m, opts.Options), opts: opts, files: map[string]*followed{},
		unsettled: map[string]*followed{}}
}

// Status returns a copy of the follower's status.
func (f *Follower) Status() FollowStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.status
	s.Left = append([]Left(nil), s.Left...)
	return s
}

// flushEvery bounds how long a line decided waits to be written while the stream keeps
// delivering, and flushBytes how much is held for it.
const (
	flushEvery = 50 * time.Millisecond
	flushBytes = 1 << 20
)

// Run recovers the selected conversations, then keeps them current until ctx ends. It
// returns ctx's error, or the first error reading the mirror.
func (f *Follower) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Heads are watched from before the listing, and lines read from the stream's last
	// sequence before it: a change made while the first recovery runs is not missed (a
	// line the recovery read already is skipped by its ordinal).
	heads := newQueue[mirror.HeadChange]()
	lines := make(chan mirror.Followed, 4*scanBatchHint)
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := f.m.WatchHeads(ctx, heads.push); err != nil && ctx.Err() == nil {
			errs <- err
		}
	}()
	_, last, err := f.m.CountsAndLast(ctx)
	if err != nil {
		return fmt.Errorf("follow: %w", err)
	}
	if err := f.start(ctx); err != nil {
		return err
	}
	f.mu.Lock()
	f.status.Position = last // the first recovery read the stream at least this far
	f.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := f.m.Follow(ctx, last+1, func(l mirror.Followed) error {
			select {
			case lines <- l:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if err != nil && ctx.Err() == nil {
			errs <- err
		}
	}()
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			f.flush()
			return ctx.Err()
		case err := <-errs:
			f.flush()
			return err
		case l := <-lines:
			f.line(l)
			if l.Pending == 0 || f.buffered >= flushBytes {
				f.flush()
			}
			if l.Pending == 0 {
				f.reconcile(ctx, true)
			}
			f.noteBehind(l)
		case <-heads.ready():
			for _, c := range heads.take() {
				f.head(c)
			}
			f.reconcile(ctx, len(lines) == 0)
		case <-tick.C:
			f.flush()
			f.reconcile(ctx, len(lines) == 0)
			// The status's counts, every tick: a pass over every conversation, not one
			// per line.
			f.publish()
		}
	}
}

// scanBatchHint sizes the channel between the stream and the follower's loop.
const scanBatchHint = 512

// start runs the first recovery and takes its files.
func (f *Follower) start(ctx context.Context) error {
	sel, err := Select(ctx, f.m, f.opts.IDs, f.opts.All || len(f.opts.IDs) == 0)
	if err != nil {
		return fmt.Errorf("follow: %w", err)
	}
	if f.opts.Host != "" {
		keys := sel.Keys[:0]
		for _, k := range sel.Keys {
			if h, ok := sel.heads[k]; !ok || h.Host == f.opts.Host {
				keys = append(keys, k)
			}
		}
		sel.Keys = keys
	}
	for _, k := range sel.Keys {
		st := f.state(k)
		if h, ok := sel.heads[k]; ok {
			st.headSeq = h.LastSeq
			st.deleted = h.LocalDeleted
		}
	}
	for _, rep := range f.rec.Run(ctx, sel) {
		f.took(rep)
	}
	f.publish()
	f.mu.Lock()
	f.status.Started = true
	f.mu.Unlock()
	return ctx.Err()
}

// state is the follower's state of key, made on first use.
func (f *Follower) state(key string) *followed {
	st, ok := f.files[key]
	if !ok {
		st = &followed{key: key}
		f.files[key] = st
	}
	return st
}

// follows reports whether the selection takes in key (a conversation created later
// included, with All).
func (f *Follower) follows(key string) bool {
	if f.opts.All || len(f.opts.IDs) == 0 {
		return true
	}
	for _, id := range f.opts.IDs {
		if key == id || clashOf(key) == id {
			return true
		}
	}
	return false
}

// took records the outcome of a recovery of one conversation.
func (f *Follower) took(rep Report) {
	st := f.state(rep.Key)
	st.dirty = false
	switch rep.Result {
	case Written, Unchanged:
		st.path, st.gen, st.next, st.size = rep.Output, rep.Generation, rep.LastOrdinal+1, rep.Bytes
		st.appendable = rep.Complete && !rep.RawDropped
		st.left, st.leftWhy = false, ""
		st.held = nil
		if rep.Result == Written {
			f.mu.Lock()
			f.status.Written++
			f.mu.Unlock()
		}
	default:
		st.left, st.leftWhy = true, rep.Reason
		if rep.Output != "" {
			st.path = rep.Output
		}
		st.retryAt = time.Now().Add(f.opts.Retry)
	}
	if f.opts.OnReport != nil {
		f.opts.OnReport(rep)
	}
}

// headWait is how many Holds a rebuild waits at most for a head that lags its lines:
// the publisher writes a head once a generation's lines are acknowledged, and a
// generation read before that lacks lines of the one before it (a rewrite in progress).
const headWait = 10

// line decides what to do with one line the mirror stored.
func (f *Follower) line(l mirror.Followed) {
	st, known := f.files[l.Key]
	if !known && !f.follows(l.Key) {
		return
	}
	otherHost := f.opts.Host != "" && l.Host != f.opts.Host
	facts := lineFacts{known: known && st.path != "", otherHost: otherHost,
		gen: l.Generation, ordinal: l.Ordinal, blob: l.Kind == mirror.KindBlob, header: l.Kind == mirror.KindHeader}
	if known {
		facts.left, facts.due = st.left || st.deleted, st.dirty
		facts.fileGen, facts.next, facts.appendable = st.gen, st.next, st.appendable
	}
	act, _ := decideLine(facts)
	if act == ignoreIt {
		return
	}
	st = f.state(l.Key)
	st.lastSeq = max(st.lastSeq, l.Seq)
	switch act {
	case appendIt:
		f.queue(l.Key, st, l.Msg)
		f.drainHeld(l.Key, st)
	case holdIt:
		if st.held == nil {
			st.held = map[int64]mirror.Msg{}
			st.heldSince = time.Now()
			f.unsettled[st.key] = st
		}
		st.held[l.Ordinal] = l.Msg
	case rebuildIt:
		f.markDirty(st)
	}
}

// queue takes a line to append to st's file.
func (f *Follower) queue(key string, st *followed, m mirror.Msg) {
	f.pending = append(f.pending, pendingLine{key: key, msg: m, data: m.Data})
	f.buffered += int64(len(m.Data)) + 1
	st.next = m.Ordinal + 1
}

// drainHeld queues the held lines that now follow the file's end.
func (f *Follower) drainHeld(key string, st *followed) {
	for len(st.held) > 0 {
		m, ok := st.held[st.next]
		if !ok {
			return
		}
		delete(st.held, st.next)
		if m.Generation != st.gen || m.Kind == mirror.KindBlob || m.Kind == mirror.KindHeader {
			f.markDirty(st)
			return
		}
		f.queue(key, st, m)
	}
	st.held = nil
}

func (f *Follower) markDirty(st *followed) {
	if !st.dirty {
		st.dirty, st.dirtySince = true, time.Now()
	}
	st.held = nil
	f.unsettled[st.key] = st
}

// head takes a change of a head.
func (f *Follower) head(c mirror.HeadChange) {
	st, known := f.files[c.Key]
	if !known {
		if !f.follows(c.Key) || c.Deleted || c.Err != nil || (f.opts.Host != "" && c.Head.Host != f.opts.Host) {
			return
		}
		st = f.state(c.Key)
		f.markDirty(st)
	}
	switch {
	case c.Deleted:
		st.deleted, st.leftWhy = true, "its head was deleted from the mirror (pisync forget, or the session store deleted it); the file stays"
		return
	case c.Err != nil:
		return
	}
	st.headSeq = max(st.headSeq, c.Head.LastSeq)
	wasDeleted := st.deleted
	st.deleted = c.Head.LocalDeleted
	if at, ok := placeOf(c.Head, f.opts.Out, f.opts.Roots); ok && st.path != "" && at != st.path && !st.left && !st.deleted {
		f.move(c.Key, st, at)
	}
	switch {
	case st.deleted:
		st.leftWhy = "deleted at its source; the file stays"
	case wasDeleted || st.left:
		// Tried again (after Options.Retry); shown left in place until a rebuild succeeds.
		f.markDirty(st)
	case c.Head.Generation > st.gen && st.path != "":
		f.markDirty(st)
	}
}

// move follows a conversation whose file moved on its host (renamed, or moved to
// another directory): the follower's own file is renamed to the new place, so that the
// standby never holds the conversation at two paths. A file changed locally, or a place
// something else holds, is left to a rebuild, whose rules refuse and report what they
// must.
func (f *Follower) move(key string, st *followed, at string) {
	fi, err := os.Stat(st.path)
	if err != nil || fi.Size() != st.size {
		f.markDirty(st)
		return
	}
	if _, err := os.Lstat(at); !errors.Is(err, fs.ErrNotExist) {
		f.markDirty(st)
		return
	}
	if other := f.rec.claim(at, key); other != "" {
		f.markDirty(st)
		return
	}
	if err := os.MkdirAll(filepath.Dir(at), 0o700); err != nil {
		f.markDirty(st)
		return
	}
	if err := os.Rename(st.path, at); err != nil {
		f.markDirty(st)
		return
	}
	f.rec.unclaim(st.path, key)
	st.path = at
}

// reconcile rebuilds the conversations due: when the follower has caught up with the
// stream (quiet), those whose head has caught up with their lines (the head is written
// after the lines are acknowledged) or that waited long enough; and any whose held lines
// waited for a hole past Hold.
func (f *Follower) reconcile(ctx context.Context, quiet bool) {
	now := time.Now()
	var due []string
	for k, st := range f.unsettled {
		if st.held != nil && now.Sub(st.heldSince) >= f.opts.Hold {
			f.markDirty(st)
		}
		if !st.dirty && st.held == nil {
			delete(f.unsettled, k)
			continue
		}
		if !st.dirty || !quiet || now.Before(st.retryAt) {
			continue
		}
		waited := now.Sub(st.dirtySince)
		if st.headSeq >= st.lastSeq || (st.headSeq == 0 && waited >= f.opts.Hold) || waited >= headWait*f.opts.Hold {
			due = append(due, k)
		}
	}
	sort.Strings(due)
	for _, k := range due {
		if ctx.Err() != nil {
			return
		}
		f.flushKey(k)
		f.took(f.rec.One(ctx, k))
	}
}

// noteBehind records how far behind the mirror the follower is after line l.
func (f *Follower) noteBehind(l mirror.Followed) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status.Behind = l.Pending
	if l.Pending == 0 && len(f.pending) == 0 {
		f.status.BehindSince = time.Time{}
	} else if f.status.BehindSince.IsZero() {
		f.status.BehindSince = l.Time
	}
	f.status.Position = l.Seq
}

// publish refreshes the status counts.
func (f *Follower) publish() {
	var current, waiting int
	var left []Left
	for k, st := range f.files {
		switch {
		case st.deleted || st.left:
			left = append(left, Left{Key: k, Path: st.path, Deleted: st.deleted, Reason: st.leftWhy})
		case st.dirty || st.held != nil:
			waiting++
		case st.path != "":
			current++
		}
	}
	sort.Slice(left, func(i, j int) bool { return left[i].Key < left[j].Key })
	f.mu.Lock()
	f.status.Current, f.status.Waiting, f.status.Left = current, waiting, left
	f.status.UpdatedAt = time.Now()
	f.mu.Unlock()
}
