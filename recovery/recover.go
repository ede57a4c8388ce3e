package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// Options select and shape a recovery.
type Options struct {
	Out string // rebuild under this directory in Pi's layout; "" = the recorded root and path
	// Roots are the directories recovery may write under when Out is "" (absolute): a
	// conversation the mirror places elsewhere is refused (ErrOutsideRoots).
	Roots      []string
	Generation int // generation to rebuild; 0 = the newest
	// At, if set, rebuilds each conversation as the mirror held it then: the generation
	// newest at At, with the lines stored by At (the mirror's clock, not the file's).
	At     time.Time
	DryRun bool // check everything, write nothing
	Force  bool // overwrite a differing file, accept a head mismatch
	// Replace overwrites a differing file that holds nothing the mirror lacks (a file an
	// earlier recovery wrote, behind the mirror or of an older generation), without
	// accepting a head mismatch: what `recover --follow` keeps its files current by.
	Replace  bool
	DropRaw  bool // leave raw lines out, so that Pi's harness reader accepts the file
	Parallel int  // conversations recovered at once; 0 = 4
	// OnDone, if set, is called once per conversation as it finishes (serialized).
	OnDone func(Report)
}

// Recoverer rebuilds conversations from a mirror into files.
type Recoverer struct {
	m    Mirror
	opts Options

	mu      sync.Mutex
	claimed map[string]string // output path → key that claimed it in this run
	// superseded maps a key of the run whose head names the same file as a newer head
	// of the run to the key of that head (see supersededKeys); set by Run.
	superseded map[string]string
	// reserved maps a path that the heads of the run place a file at to the key of the
	// newest of those heads: no other key of the run, with a head or without, takes it.
	reserved map[string]string
	doneMu   sync.Mutex // serializes reports and OnDone
}

// New returns a Recoverer reading from m.
func New(m Mirror, opts Options) *Recoverer {
	if opts.Parallel <= 0 {
		opts.Parallel = 4
	}
	return &Recoverer{m: m, opts: opts, claimed: map[string]string{}}
}

// Selection is the conversations to recover, and what the mirror said of them when they
// were selected: Run reads them without asking again.
type Selection struct {
	Keys []string // sorted, without repeats
	// BadHeads are the values of the heads bucket that do not decode: their
	// conversations are recovered without metadata, and the command warns of each.
	BadHeads []mirror.BadHead
	heads    map[string]mirror.Head
	bad      map[string]error  // conversation key → why its head is not used
	owned    int               // conversations of the owner: with a head or with messages
	counts   map[string]uint64 // messages of each conversation; nil: not counted
}

// Select resolves a selection into conversation keys. The conversations are listed from
// the stream itself (the subjects of the owner's messages); the heads only add metadata,
// and conversations that have a head but no message come along too, so that each is
// reported. With all, that is every conversation of the owner; otherwise each id, plus
// the keys its copies were mirrored under after a clash (two local files with one id:
// "<id>~<hex>"). A head that does not decode is skipped and listed in BadHeads; it hides
// nothing. Select fails when the stream cannot be listed: what it would return could
// leave conversations out without saying so.
func Select(ctx context.Context, m Mirror, ids []string, all bool) (Selection, error) {
	list, err := m.Conversations(ctx)
	if err != nil {
		return Selection{}, err
	}
	owned := list.Keys()
	sel := Selection{heads: list.ByKey(), counts: list.Counts, BadHeads: list.Bad, bad: list.HeadErrors(), owned: len(owned)}
	set := map[string]bool{}
	for _, id := range ids {
		set[id] = true
	}
	for _, key := range owned {
		if all || set[key] || set[clashOf(key)] || set[sel.heads[key].Conversation] {
			set[key] = true
		}
	}
	sel.Keys = make([]string, 0, len(set))
	for k := range set {
		sel.Keys = append(sel.Keys, k)
	}
	sort.Strings(sel.Keys)
	return sel, nil
}

// clashOf is the conversation id a clash key ("<id>~<hex>") was derived from, "" for
// another key.
func clashOf(key string) string {
	if i := strings.LastIndexByte(key, '~'); i > 0 {
		return key[:i]
	}
	return ""
}

// Run recovers each key of sel, Options.Parallel at a time, and returns the reports in
// the order of sel.Keys.
//
// When the keys are a good share of the owner's conversations, it reads them all in one
// pass over the owner's messages (see stream), which spares the server a lookup of each
// conversation's messages among everyone's. It reads the others one by one, in the order
// their conversations are stored in the stream (by the sequence of each one's last line,
// from the heads), so that conversations stored close together are read close together
// in time: the server then loads each block of the stream from disk about once, instead
// of about once per conversation in the order of their keys, which are random.
func (r *Recoverer) Run(ctx context.Context, sel Selection) []Report {
	keys := sel.Keys
	reports := make([]Report, len(keys))
	todo := make([]int, len(keys))
	for i := range todo {
		todo[i] = i
	}
	r.mu.Lock()
	r.superseded, r.reserved = supersededKeys(sel, r.opts.Out, r.opts.Roots)
	r.mu.Unlock()
	c := r.startCommitter(reports)
	if streamWorth(len(keys), sel.owned, r.opts.Parallel) {
		todo = r.stream(ctx, sel, todo, c)
	}
	r.each(ctx, keys, streamOrder(keys, todo, sel.heads), c)
	c.close()
	return reports
}

// each recovers the keys at the indices of order one by one, Options.Parallel at a time.
func (r *Recoverer) each(ctx context.Context, keys []string, order []int, c *committer) {
	var next int
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range min(r.opts.Parallel, len(order)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				n := next
				next++
				mu.Unlock()
				if n >= len(order) {
					return
				}
				i := order[n]
				c.add(i, r.one(ctx, keys[i]))
			}
		}()
	}
	wg.Wait()
}

// done records the report of keys[i] and passes it to Options.OnDone.
func (r *Recoverer) done(reports []Report, i int, rep Report) {
	r.doneMu.Lock()
	defer r.doneMu.Unlock()
	reports[i] = rep
	if r.opts.OnDone != nil {
		r.opts.OnDone(rep)
	}
}

// streamOrder orders the indices of todo by the stream sequence of each conversation's
// last line; keys without a head keep their order, after the others.
func streamOrder(keys []string, todo []int, heads map[string]mirror.Head) []int {
	order := append([]int(nil), todo...)
	sort.SliceStable(order, func(a, b int) bool {
		ha, oka := heads[keys[order[a]]]
		hb, okb := heads[keys[order[b]]]
		if oka != okb {
			return oka
		}
		return ha.LastSeq < hb.LastSeq
	})
	return order
}

// One recovers one conversation; every outcome, failures included, is in the report.
func (r *Recoverer) One(ctx context.Context, key string) Report {
	o := r.one(ctx, key)
	if o.staged == nil {
		return o.rep
	}
	return o.committed(o.staged.commit())
}

// one recovers one conversation, its file staged but not committed.
func (r *Recoverer) one(ctx context.Context, key string) outcome {
	c, err := r.m.Conv(key)
	if err != nil {
		return outcome{rep: failed(key, r.opts.Generation, Failed, fmt.Errorf("%w: %v", mirror.ErrNotFound, err))}
	}
	head, bad, err := headOf(ctx, r.m, c)
	if err != nil {
		return outcome{rep: failed(key, r.opts.Generation, Failed, err)}
	}
	g, err := readGeneration(ctx, r.m, c, r.wantGeneration(head), r.opts.At)
	if err != nil {
		return outcome{rep: failed(key, r.opts.Generation, Failed, err)}
	}
	return r.finish(ctx, key, g, head, bad)
}

// wantGeneration is the generation to rebuild (0: the newest): --generation, else the
// one the session store writes when the head says it writes the conversation (DESIGN
// §8: lines appended to the old local file since are a newer generation of that file,
// not the conversation).
func (r *Recoverer) wantGeneration(head *mirror.Head) int {
	if r.opts.Generation == 0 && head != nil && head.StoreWrites() {
		return head.Generation
	}
	return r.opts.Generation
}

// failed is the report of a conversation that could not be rebuilt.
func failed(key string, gen int, res Result, err error) Report {
	return Report{Key: key, Conversation: key, Generation: gen, Result: res, Reason: err.Error()}
}

// outcome is a conversation rebuilt and placed; a file written is staged, and its
// report final once the file is committed.
type outcome struct {
	rep    Report
	staged *staged // nil: nothing to commit
}

// committed is the report once the staged file's commit returned err.
func (o outcome) committed(err error) Report {
	if err != nil {
		o.rep.Result, o.rep.Reason = resultOf(err), err.Error()
	}
	return o.rep
}

// finish rebuilds a conversation read from the mirror and places its file: a file to
// write is staged, for a committer to make durable and rename in place. badHead, if not
// nil, is why the conversation's head (then nil) could not be used.
func (r *Recoverer) finish(ctx context.Context, key string, g generation, head *mirror.Head, badHead error) outcome {
	rep := Report{Key: key, Conversation: key, Generation: r.opts.Generation}
	fail := func(res Result, err error) outcome {
		rep.Result, rep.Reason = res, err.Error()
		return outcome{rep: rep}
	}
	if err := inlineBlobs(ctx, r.m, g.lines); err != nil {
		return fail(resultOf(err), err)
	}
	if err := checkFork(g.lines); err != nil {
		return fail(Refused, err)
	}
	plan, err := Rebuild(Input{Key: key, Generation: g.number, Generations: g.numbers, Lines: g.lines, Head: head,
		DropRaw: r.opts.DropRaw, PointInTime: !r.opts.At.IsZero()})
	if err != nil {
		return fail(resultOf(err), err)
	}
	rep = plan.Report
	gens := g.history(head)
	if len(gens) > 1 {
		rep.History = gens
	}
	if err := r.checkShrunk(g.number, gens, &rep); err != nil {
		return fail(Refused, err)
	}
	if newest := slices.Max(append([]int{0}, g.numbers...)); head != nil && head.StoreWrites() && newest > g.number {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the session store writes generation %d; generation %d holds the local file as appended after the cut-over (--generation %d rebuilds it)", g.number, newest, newest))
	}
	if badHead != nil {
		rep.HeadCheck = "skipped: the head does not decode"
		rep.Notes = append(rep.Notes, fmt.Sprintf("%v: rebuilt without the head's metadata", badHead))
	}
	if plan.HeadMismatch {
		if !r.opts.Force {
			return fail(Refused, fmt.Errorf("head %s; --force writes it anyway", rep.HeadCheck))
		}
		rep.Forced = true
	}
	t, err := targetFor(plan, r.opts.Out, r.opts.Roots)
	if err != nil {
		return fail(Refused, err)
	}
	rep.Output = t.path()
	if err := r.supersededBy(key, head); err != nil {
		return fail(Refused, err)
	}
	if other := r.claim(rep.Output, key); other != "" {
		return fail(Refused, fmt.Errorf("conversation %s of this run is rebuilt at the same path", other))
	}
	held := func() map[string]bool {
		h := g.held()
		for _, l := range plan.Lines {
			if l.Ordinal < 0 {
				h[l.SHA256] = true // lines recovery makes: a previous recovery wrote them
			}
		}
		return h
	}
	res, forced, st, err := r.place(ctx, t, plan, held)
	rep.Forced = rep.Forced || forced
	if err != nil {
		return fail(res, err)
	}
	rep.Result = res
	return outcome{rep: rep, staged: st}
}

// place checks the target and stages the file unless a check or --dry-run says not to.
// A file at the target stays open with the staged one, for its commit to check again.
func (r *Recoverer) place(ctx context.Context, t target, plan *Plan, held func() map[string]bool) (res Result, forced bool, st *staged, err error) {
	ex, err := r.inspectTarget(t, plan, held)
	if err != nil {
		return resultOf(err), false, nil, err
	}
	defer func() {
		if st == nil {
			ex.close()
		}
	}()
	switch {
	case ex.nLacking > 0:
		return Refused, false, nil, fmt.Errorf("%s holds what the mirror lacks: %s; move it aside to recover this conversation (--force does not override this)", t.path(), ex.lackingText())
	case ex.identical:
		return Unchanged, false, nil, nil
	case ex.exists && !r.opts.Force && !r.opts.Replace:
		return Refused, false, nil, fmt.Errorf("%s exists and differs from the rebuilt file; --force overwrites it", t.path())
	}
	if r.opts.DryRun {
		// Stream the blobs through their digests anyway: a dry run says whether the
		// real one would succeed.
		if err := render(ctx, io.Discard, r.m, plan); err != nil {
			return resultOf(err), ex.exists, nil, err
		}
		return DryRun, ex.exists, nil, nil
	}
	if st, err = stage(ctx, r.m, t, plan); err != nil {
		return resultOf(err), ex.exists, nil, err
	}
	st.old = ex.inspected
	return Written, ex.exists, st, nil
}

func (r *Recoverer) inspectTarget(t target, plan *Plan, held func() map[string]bool) (existing, error) {
	root, err := os.OpenRoot(t.root)
	if errors.Is(err, fs.ErrNotExist) {
		return existing{}, nil
	}
	if err != nil {
		return existing{}, fmt.Errorf("open %s: %w", t.root, err)
	}
	defer root.Close()
	return inspect(root, t.rel, plan, held)
}

// supersededKeys finds the keys of sel whose heads place their files at one path (the
// recorded root and path, or the same name under Options.Out) and returns, for each of
// them but the one of the newest head, that key. One file mirrored under two keys (a
// clash key handed to another file after a restart or a replacement, a file given a new
// key after it moved) leaves two heads naming it, the older one stale: recovering both
// would write whichever came first and refuse the other, in an order that depends on
// timing: the stale one could win. The newest head wins whatever the order the
// conversations are read in; the others are refused, each naming the winner. It also
// returns the winner of each path: a conversation without a head (its head was never
// written, or does not decode) rebuilt at one of those paths is refused too, whichever
// comes first.
func supersededKeys(sel Selection, out string, roots []string) (superseded, best map[string]string) {
	best = map[string]string{}    // path → key of the newest head placing its file there
	placed := map[string]string{} // key → path
	for _, k := range sel.Keys {
		h, ok := sel.heads[k]
		if !ok {
			continue
		}
		at, ok := placeOf(h, out, roots)
		if !ok {
			continue
		}
		placed[k] = at
		if b, ok := best[at]; !ok || newerHead(h, k, sel.heads[b], b) {
			best[at] = k
		}
	}
	superseded = map[string]string{}
	for k, at := range placed {
		if w := best[at]; w != k {
			superseded[k] = w
		}
	}
	return superseded, best
}

// placeOf is where recovery writes the file of the conversation whose head is h, as far
// as the head tells (targetFor decides from the rebuilt file): false when it cannot tell.
func placeOf(h mirror.Head, out string, roots []string) (string, bool) {
	if h.Root == "" || h.Source == "" {
		return "", false
	}
	if out != "" && (h.Cwd == "" || h.Conversation == "" || !session.IsFileNameOf(path.Base(h.Source), h.Conversation)) {
		return "", false // the directory or the name would come from the header line
	}
	t, err := targetFor(&Plan{Root: h.Root, Source: h.Source, Header: session.Header{ID: h.Conversation, Cwd: h.Cwd}}, out, roots)
	if err != nil {
		return "", false
	}
	return t.path(), true
}

// newerHead reports whether head a (of key ak) describes the file more recently than
// head b (of key bk): a file still there beats a deleted one, then the conversation's
// own key beats a copy of it mirrored apart after another host continued it (two hosts
// with one layout name one path: the host that went on keeps the file, the copy is
// rebuilt with --out), then the head whose last line was stored later (stream sequences
// grow with time across conversations), then the later update; the key decides a tie, so
// that the outcome never depends on order.
func newerHead(a mirror.Head, ak string, b mirror.Head, bk string) bool {
	switch {
	case a.LocalDeleted != b.LocalDeleted:
		return !a.LocalDeleted
	case (a.DivergedFrom == nil) != (b.DivergedFrom == nil):
		return a.DivergedFrom == nil
	case a.LastSeq != b.LastSeq:
		return a.LastSeq > b.LastSeq
	case !a.UpdatedAt.Equal(b.UpdatedAt):
		return a.UpdatedAt.After(b.UpdatedAt)
	}
	return ak < bk
}

// supersededBy refuses key when another key of the run has a newer head naming the same
// file (see supersededKeys).
func (r *Recoverer) supersededBy(key string, head *mirror.Head) error {
	r.mu.Lock()
	w, ok := r.superseded[key]
	r.mu.Unlock()
	if !ok {
		return nil
	}
	stale := ""
	if head != nil {
		stale = fmt.Sprintf(" (it names %s, last line at stream sequence %d)", filepath.Join(head.Root, filepath.FromSlash(head.Source)), head.LastSeq)
	}
	alone := ""
	if clashOf(key) != "" {
		alone = fmt.Sprintf("; --conversation %s --out DIR rebuilds it alone", key)
	}
	return fmt.Errorf("superseded: conversation %s of this run is rebuilt at the same path and its head is newer; this key's head is stale%s%s",
		w, stale, alone)
}

// unclaim gives up key's claim of path (its file moved).
func (r *Recoverer) unclaim(path, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.claimed[path] == key {
		delete(r.claimed, path)
	}
}

func (r *Recoverer) claim(path, key string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.reserved[path]; ok && w != key {
		return w
	}
	if other, ok := r.claimed[path]; ok && other != key {
		return other
	}
	r.claimed[path] = key
	return ""
}

// resultOf classifies an error: a check that failed refuses, anything else fails.
func resultOf(err error) Result {
	if errors.Is(err, ErrDigest) || errors.Is(err, mirror.ErrBlobCorrupt) || errors.Is(err, ErrUnsafePath) || errors.Is(err, ErrOutsideRoots) || errors.Is(err, ErrTargetChanged) {
		return Refused
	}
	return Failed
}

// ErrShrunk is wrapped when the newest generation of a conversation lacks entries of the
// one before it (the file was overwritten by a fresh header, cut back, or rewritten
// without some of its lines): recovery does not restore it unless asked for it by number.
var ErrShrunk = errors.New("the newest generation is shrunk")

// checkShrunk refuses to restore the generation number gen when it is the newest, it is
// shrunk, and neither --generation nor --at chose it. With --at a shrunk generation is
// restored as asked, and noted.
func (r *Recoverer) checkShrunk(gen int, gens []mirror.GenInfo, rep *Report) error {
	var info *mirror.GenInfo
	for i := range gens {
		if gens[i].Number == gen {
			info = &gens[i]
		}
	}
	if info == nil || info.Shrunk == nil {
		return nil
	}
	s := info.Shrunk
	what := fmt.Sprintf("generation %d lacks %d entries of generation %d (%s)", gen, s.Missing, s.From, s.Reason)
	if r.opts.Generation != 0 || !r.opts.At.IsZero() {
		rep.Notes = append(rep.Notes, what)
		return nil
	}
	return fmt.Errorf("%w: %s; --generation %d restores the generation before, --generation %d this one (pisync history %s lists them)",
		ErrShrunk, what, s.From, gen, rep.Key)
}
