package torture

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/verify"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// snapshot is every message of the owner's conversations, by key and generation.
type snapshot struct {
	keys  map[string]map[int][]mirror.Msg
	blobs map[string][]byte // by digest
}

// newest is the newest generation of key, in stream order.
func (s *snapshot) newest(key string) []mirror.Msg {
	return s.keys[key][s.newestGen(key)]
}

// newestGen is the number of the newest generation of key.
func (s *snapshot) newestGen(key string) int {
	best := -1
	for g := range s.keys[key] {
		best = max(best, g)
	}
	return best
}

// headsByKey are the mirror's heads by conversation key (none if they cannot be read: the
// pairing then goes by lines alone).
func (r *run) headsByKey() map[string]mirror.Head {
	ctx, cancel := r.ctx(30 * time.Second)
	defer cancel()
	heads := map[string]mirror.Head{}
	if list, err := r.reader.ListHeads(ctx); err == nil {
		for _, h := range list.Heads {
			heads[h.ConvKey()] = h
		}
	}
	return heads
}

// headFaults says how the heads of the paired keys differ from what they must say once
// the daemon has caught up: the newest generation, its last ordinal, the leaf.
func (r *run) headFaults(ctx context.Context, s *snapshot, pair map[*file]string) string {
	list, err := r.reader.ListHeads(ctx)
	if err != nil {
		return "heads: " + err.Error()
	}
	heads := map[string]mirror.Head{}
	for _, h := range list.Heads {
		heads[h.ConvKey()] = h
	}
	var bad []string
	for f, key := range pair {
		h, ok := heads[key]
		var leaf session.Leaf
		for _, l := range f.sf.Lines[1:] {
			if env, err := session.ScanEntry(l); err == nil && env.Type != "session" && env.Type != "title" {
				leaf.Apply(env)
			}
		}
		gen := s.newestGen(key)
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s: no head for key %s", f, key))
		case len(f.sf.Lines) == 1 && gen > 1 && entries(s.keys[key][gen-1]) > 0 && h.Shrunk == nil:
			// A fresh header over a session is found once the file is quiet (2 s).
			bad = append(bad, fmt.Sprintf("%s: key %s holds a header only after %d entries in generation %d; its head does not say shrunk",
				f, key, entries(s.keys[key][gen-1]), gen-1))
		case h.Generation != s.newestGen(key) || h.LastOrdinal != int64(len(f.sf.Lines)-1) || h.Head != leaf.ID():
			bad = append(bad, fmt.Sprintf("%s: head of %s says generation %d, last ordinal %d, leaf %q; the mirror has generation %d, %d lines, leaf %q",
				f, key, h.Generation, h.LastOrdinal, h.Head, s.newestGen(key), len(f.sf.Lines), leaf.ID()))
		case !headNames(h, f):
			// A move changes none of the numbers above: only the path tells whether the
			// head followed (the daemon writes it within its head interval once the
			// file's Open at the new path is done). verify and recover --root go by it.
			bad = append(bad, fmt.Sprintf("%s: head of %s names %s", f, key, rel(r.dir, filepath.Join(h.Root, filepath.FromSlash(h.Source)))))
		}
	}
	sort.Strings(bad)
	return strings.Join(bad, "\n")
}

// hasHeader reports whether lines hold a session header among their first ones.
func hasHeader(lines [][]byte) bool {
	for _, l := range lines[:min(len(lines), session.LeadLines)] {
		if _, err := session.ParseHeader(l); err == nil {
			return true
		}
	}
	return false
}

// entries counts the entry lines of msgs.
func entries(msgs []mirror.Msg) int {
	n := 0
	for _, m := range msgs {
		if m.Kind == mirror.KindEntry || (m.Kind == mirror.KindBlob && m.EntryType != mirror.HeaderEntryType) {
			n++
		}
	}
	return n
}

// goodFaults checks that the lines a destroyed session had at the quiet point before
// are the start of a generation of the mirror, whatever happened to the file since (§4:
// the previous generation is the user's data).
func (r *run) goodFaults(s *snapshot) []string {
	var bad []string
	for _, f := range append(append([]*file(nil), r.fs.live...), r.fs.out...) {
	good:
		for _, lines := range f.good {
			for key, gens := range s.keys {
				if key != f.sf.ID && !strings.HasPrefix(key, f.sf.ID+"~") {
					continue
				}
				for _, msgs := range gens {
					// The generation may have grown past them (appends keep a generation).
					var prefix []mirror.Msg
					for _, m := range msgs {
						if m.Ordinal < int64(len(lines)) {
							prefix = append(prefix, m)
						}
					}
					if ok, _ := s.equal(prefix, lines); ok {
						continue good
					}
				}
			}
			bad = append(bad, fmt.Sprintf("%s: no generation holds the %d lines it had before it was destroyed in place", f, len(lines)))
		}
	}
	return bad
}

// pathFaults lists the live paths that more than one head of host names: one path, one
// key (publisher/pathkeys.go), so a live file has exactly one head naming it, whatever
// moved, was replaced or copied there before. Heads marked LocalDeleted, of another host,
// or naming a path where no live file is do not count: a file moved out or removed leaves
// its head behind on purpose. Two heads naming one file (T26, T27) are otherwise seen only
// indirectly, when verify or recover pairs the file with the wrong one.
func pathFaults(heads []mirror.Head, host string, live map[string]bool, rel func(string) string) []string {
	byPath := map[string][]string{}
	for _, h := range heads {
		p := filepath.Join(h.Root, filepath.FromSlash(h.Source))
		if h.LocalDeleted || h.Host != host || !live[p] {
			continue
		}
		byPath[p] = append(byPath[p], fmt.Sprintf("%s (generation %d, %d entries)", h.ConvKey(), h.Generation, h.Entries))
	}
	var bad []string
	for p, keys := range byPath {
		if len(keys) > 1 {
			sort.Strings(keys)
			bad = append(bad, fmt.Sprintf("%s: named by %d heads: %s", rel(p), len(keys), strings.Join(keys, ", ")))
		}
	}
	sort.Strings(bad)
	return bad
}

// pathHeadFaults is pathFaults of the mirror's heads and the live files.
func (r *run) pathHeadFaults(ctx context.Context) string {
	list, err := r.reader.ListHeads(ctx)
	if err != nil {
		return "heads: " + err.Error()
	}
	host, err := os.Hostname() // the daemon's --host default
	if err != nil {
		return "host name: " + err.Error()
	}
	live := map[string]bool{}
	for _, f := range r.fs.live {
		live[f.sf.Path] = true
	}
	return strings.Join(pathFaults(list.Heads, host, live, func(p string) string { return rel(r.dir, p) }), "\n")
}

// headNames reports whether h records f's path (its root and source).
func headNames(h mirror.Head, f *file) bool {
	return filepath.Join(h.Root, filepath.FromSlash(h.Source)) == f.sf.Path
}

// read reads the whole mirror of the owner once, blobs included.
func (r *run) read(ctx context.Context) (*snapshot, error) {
	if r.reader == nil {
		rd, err := newReader(ctx, r.nc)
		if err != nil {
			return nil, err
		}
		r.reader = rd
	}
	s := &snapshot{keys: map[string]map[int][]mirror.Msg{}, blobs: map[string][]byte{}}
	err := r.reader.ScanOwner(ctx, mirror.ScanOptions{}, func(key string, m mirror.Msg) error {
		if s.keys[key] == nil {
			s.keys[key] = map[int][]mirror.Msg{}
		}
		m.Data = append([]byte(nil), m.Data...)
		s.keys[key][m.Generation] = append(s.keys[key][m.Generation], m)
		if m.Kind == mirror.KindBlob && s.blobs[m.SHA256] == nil {
			rc, err := r.reader.Blob(ctx, m.SHA256)
			if err != nil {
				return fmt.Errorf("blob %s of %s: %w", m.SHA256, key, err)
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				return fmt.Errorf("blob %s of %s: %w", m.SHA256, key, err)
			}
			s.blobs[m.SHA256] = b
		}
		return nil
	})
	return s, err
}

// body is a message's line: its data, or its blob.
func (s *snapshot) body(m mirror.Msg) []byte {
	if m.Kind == mirror.KindBlob {
		return s.blobs[m.SHA256]
	}
	return m.Data
}

// equal says whether msgs (one generation) hold exactly lines, in ordinal order.
func (s *snapshot) equal(msgs []mirror.Msg, lines [][]byte) (bool, string) {
	byOrd := map[int64][]byte{}
	for _, m := range msgs {
		byOrd[m.Ordinal] = s.body(m)
	}
	if len(byOrd) != len(lines) || len(msgs) != len(lines) {
		return false, fmt.Sprintf("%d messages (%d ordinals), file %d lines%s", len(msgs), len(byOrd), len(lines), doubled(msgs))
	}
	for i, l := range lines {
		b, ok := byOrd[int64(i)]
		if !ok {
			return false, fmt.Sprintf("ordinal %d missing", i)
		}
		if !bytes.Equal(b, l) {
			return false, fmt.Sprintf("line %d differs: mirror %q, file %q", i+1, clip(b, 60), clip(l, 60))
		}
	}
	return true, ""
}

// doubled describes the copies of the first ordinals stored more than once in msgs (one
// generation): the stream sequence and time stored of each copy tell how far apart they
// were and, against the daemon's log, which start sent each (T25); the message id tells
// whether the server's duplicate window could have caught the second.
func doubled(msgs []mirror.Msg) string {
	byOrd := map[int64][]mirror.Msg{}
	var twice []int64
	for _, m := range msgs {
		byOrd[m.Ordinal] = append(byOrd[m.Ordinal], m)
		if len(byOrd[m.Ordinal]) == 2 {
			twice = append(twice, m.Ordinal)
		}
	}
	var b strings.Builder
	for i, o := range twice {
		if i == 5 {
			fmt.Fprintf(&b, "; %d more ordinals twice", len(twice)-i)
			break
		}
		fmt.Fprintf(&b, "; ordinal %d:", o)
		for _, m := range byOrd[o] {
			fmt.Fprintf(&b, " seq %d at %s id %s", m.Seq, m.Time.UTC().Format("15:04:05.000"), m.MsgID)
		}
	}
	return b.String()
}

// match pairs every live file with a distinct conversation key whose newest generation
// equals its complete lines (a copied file mirrors under a key of its own). It returns the
// pairing, or why some file has none.
//
// Two keys can hold equal lines (a copy of a file whose key another file held before):
// a key whose head names the file is tried first, so that the pairing is the daemon's
// and not an equal but stale conversation that recover rightly refuses (hour run seed
// 86352313757).
func (r *run) match(s *snapshot, heads map[string]mirror.Head) (map[*file]string, string) {
	cands := map[*file][]string{}
	var why []string
	for _, f := range r.fs.live {
		lines := f.sf.Lines
		if len(lines) == 0 {
			continue
		}
		var reasons []string
		for key := range s.keys {
			if key != f.sf.ID && !strings.HasPrefix(key, f.sf.ID+"~") {
				continue
			}
			if ok, reason := s.equal(s.newest(key), lines); ok {
				cands[f] = append(cands[f], key)
			} else {
				reasons = append(reasons, key+": "+reason)
			}
		}
		names := func(key string) bool {
			h, ok := heads[key]
			return ok && headNames(h, f)
		}
		sort.SliceStable(cands[f], func(i, j int) bool { return names(cands[f][i]) && !names(cands[f][j]) })
		if len(cands[f]) == 0 {
			if len(reasons) == 0 {
				reasons = []string{"no conversation in the mirror"}
			}
			sort.Strings(reasons)
			why = append(why, fmt.Sprintf("%s (%d lines): %s", f, len(lines), strings.Join(reasons, "; ")))
		}
	}
	if len(why) > 0 {
		return nil, strings.Join(why, "\n")
	}
	// Distinct keys: a small backtracking search (files sharing an id are few).
	var order []*file
	for f := range cands {
		order = append(order, f)
	}
	sort.Slice(order, func(i, j int) bool { return order[i].n < order[j].n })
	pair, used := map[*file]string{}, map[string]bool{}
	var assign func(i int) bool
	assign = func(i int) bool {
		if i == len(order) {
			return true
		}
		for _, k := range cands[order[i]] {
			if !used[k] {
				used[k], pair[order[i]] = true, k
				if assign(i + 1) {
					return true
				}
				used[k] = false
			}
		}
		return false
	}
	if !assign(0) {
		return nil, "files carrying one session id share one conversation key: one of them is not mirrored"
	}
	return pair, ""
}

// streamFaults checks the stream itself: no message id twice (but for a repeated entry
// id, see below), no ordinal twice in a generation, every digest right, every line one
// that some file held whole.
func (r *run) streamFaults(s *snapshot) []string {
	var out []string
	ids := map[string][]int64{} // Nats-Msg-Id → the ordinals stored under it
	for key, gens := range s.keys {
		for g, msgs := range gens {
			ords := map[int64]int{}
			for _, m := range msgs {
				ids[m.MsgID] = append(ids[m.MsgID], m.Ordinal)
				ords[m.Ordinal]++
				b := s.body(m)
				sum := sha256.Sum256(b)
				if hex.EncodeToString(sum[:]) != m.SHA256 {
					out = append(out, fmt.Sprintf("%s gen %d ordinal %d (seq %d): digest header does not match the bytes", key, g, m.Ordinal, m.Seq))
				}
				if !r.fs.written[sum] {
					out = append(out, fmt.Sprintf("%s gen %d ordinal %d (seq %d): a line no file ever held whole: %q", key, g, m.Ordinal, m.Seq, clip(b, 80)))
				}
			}
			for o, n := range ords {
				if n > 1 {
					out = append(out, fmt.Sprintf("%s gen %d: ordinal %d stored %d times", key, g, o, n))
				}
			}
		}
	}
	for id, ords := range ids {
		if len(ords) > 1 && !distinct(ords) {
			out = append(out, fmt.Sprintf("message id %s stored %d times (ordinals %v)", id, len(ords), ords))
		}
	}
	sort.Strings(out)
	return out
}

// check is a quiet point: every fault healed, the daemon caught up, then every invariant.
func (r *run) check() (string, error) {
	r.res.Checks++
	r.nats.up()
	r.bg.Wait()
	r.bgMu.Lock()
	bgErrs := r.bgErrs
	r.bgErrs = nil
	r.bgMu.Unlock()
	if len(bgErrs) > 0 {
		return "", &Failure{Guarantee: "concurrent commands", Detail: strings.Join(bgErrs, "\n")}
	}
	if bad := r.recoveredFaults(); len(bad) > 0 {
		return "", &Failure{Guarantee: "recover run during changes writes only lines that existed (4)",
			Detail: strings.Join(bad[:min(10, len(bad))], "\n")}
	}
	if err := r.d.supervise(); err != nil {
		return "", &Failure{Guarantee: "the daemon stays up (8)", Detail: err.Error()}
	}
	if f := r.followerUp(); f != nil {
		return "", f
	}
	// Guarantee 5: the daemon never writes to a session file.
	for _, f := range append(append([]*file(nil), r.fs.live...), r.fs.out...) {
		b, err := os.ReadFile(f.sf.Path)
		if err != nil {
			return "", err
		}
		if !bytes.Equal(b, f.content()) {
			return "", &Failure{Guarantee: "no marker in the tree (5)", Detail: fmt.Sprintf("%s changed by someone else", f)}
		}
	}

	// Quiescence: the daemon says it is caught up and the mirror equals the files.
	start := time.Now()
	deadline := start.Add(r.deadline(90 * time.Second))
	var s *snapshot
	var pair map[*file]string
	var why string
	pause := 50 * time.Millisecond
	for {
		guarantee := "nothing lost (1): newest generation equals the file within the deadline"
		if err := r.d.supervise(); err != nil {
			return "", &Failure{Guarantee: "the daemon stays up (8)", Detail: err.Error()}
		}
		ok, status := r.d.caughtUp()
		if ok {
			ctx, cancel := r.ctx(60 * time.Second)
			var err error
			s, err = r.read(ctx)
			cancel()
			if err != nil {
				why = "mirror read: " + err.Error()
			} else if pair, why = r.match(s, r.headsByKey()); why == "" {
				ctx, cancel := r.ctx(30 * time.Second)
				why = r.headFaults(ctx, s, pair)
				if why != "" {
					why = "heads behind the mirror: " + why
				} else if why = r.pathHeadFaults(ctx); why != "" {
					// Polled like the heads above: a head names a moved file's new path
					// only within the daemon's head interval.
					guarantee = "one path, one head (§2, 9): no two heads name a live file"
					why = "two heads name one file: " + why
				}
				cancel()
				if why == "" {
					break
				}
			}
		} else {
			why = "daemon not caught up: " + status
		}
		if time.Now().After(deadline) {
			return "", &Failure{Guarantee: guarantee,
				Detail: fmt.Sprintf("after %v: %s", time.Since(start).Round(time.Millisecond), why)}
		}
		time.Sleep(pause) // poll with a deadline
		pause = min(2*pause, time.Second)
	}
	caught := time.Since(start)
	if faults := r.streamFaults(s); len(faults) > 0 {
		return "", &Failure{Guarantee: "exactly once, lossless (2, 4)", Detail: strings.Join(faults[:min(20, len(faults))], "\n")}
	}
	if faults := r.goodFaults(s); len(faults) > 0 {
		return "", &Failure{Guarantee: "a session destroyed in place stays recoverable (§4)", Detail: strings.Join(faults, "\n")}
	}
	if p := logProblems(r.d.logPath); len(p) > 0 {
		return "", &Failure{Guarantee: "the daemon does not race or panic", Detail: strings.Join(p, "\n")}
	}
	if f := r.counters(); f != nil {
		return "", f
	}
	if f := r.recoverAll(pair); f != nil {
		return "", f
	}
	if f := r.verify(); f != nil {
		return "", f
	}
	torn := 0
	for _, f := range r.fs.live {
		if f.torn != nil {
			torn++
		}
	}
	for _, f := range r.fs.live {
		f.checked = append([][]byte(nil), f.sf.Lines...)
	}
	desc := fmt.Sprintf("%d files (%d torn, %d outside), %d conversations, caught up in %v, %d start-up failures restarted",
		len(r.fs.live), torn, len(r.fs.out), len(s.keys), caught.Round(time.Millisecond), r.d.restarts)
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "seed %d check %d: %s\n", r.cfg.Seed, r.res.Checks, desc)
	}
	return desc, nil
}

// heapBound is the Go heap the daemon may use at a quiet point (guarantee 6): far above
// what its windows hold (32 MiB of bytes in flight, lines of about 1 MiB), far below what
// keeping files or outages in memory would take.
const heapBound = 256 << 20

// counters checks the daemon's duplicates and clashes counters, and its heap.
func (r *run) counters() *Failure {
	heap, err := r.d.metric("go_memstats_heap_inuse_bytes")
	if err != nil {
		return &Failure{Guarantee: "metrics", Detail: err.Error()}
	}
	if heap > heapBound {
		return &Failure{Guarantee: "bounded resources (6)", Detail: fmt.Sprintf("heap in use %.0f MiB at a quiet point", heap/(1<<20))}
	}
	dups, err := r.d.metric("pisync_publish_duplicates_total")
	if err != nil {
		return &Failure{Guarantee: "metrics", Detail: err.Error()}
	}
	// Without a NATS fault since it started, the daemon never resends: after a restart it
	// asks the mirror what it holds (guarantee 2), so the server sees no duplicate.
	if dups > 0 && !r.natsFaultSinceStart && r.set.AckTimeout >= 10*time.Second {
		return &Failure{Guarantee: "exactly once (2): no resend without a NATS fault",
			Detail: fmt.Sprintf("pisync_publish_duplicates_total %v since the daemon started, no NATS fault since", dups)}
	}
	ids := map[string]int{}
	for _, f := range r.fs.live {
		ids[f.sf.ID]++
	}
	for id, n := range ids {
		if n < 2 {
			continue
		}
		clashes, err := r.d.metric("pisync_conversation_clashes_total")
		if err != nil {
			return &Failure{Guarantee: "metrics", Detail: err.Error()}
		}
		if clashes == 0 {
			return &Failure{Guarantee: "identity (9): the clash is reported",
				Detail: fmt.Sprintf("%d files carry %s, pisync_conversation_clashes_total is 0", n, id)}
		}
	}
	return nil
}

// recoverReport is the part of `recover --json` the harness reads.
type recoverReport struct {
	Conversations []recoverConv `json:"conversations"`
}

// recoverConv is one conversation of recoverReport.
type recoverConv struct {
	Conversation string `json:"conversation"`
	Key          string `json:"key"`
	Output       string `json:"output"`
	Result       string `json:"result"`
	Reason       string `json:"reason"`
	// What a refusal's rebuild saw, for a head mismatch (FINDINGS T9): the stream
	// read short of the head, or another leaf over the same lines.
	Generation int                 `json:"generation"`
	Lines      int                 `json:"lines"`
	Missing    []recovery.Range    `json:"missing_ordinals"`
	Conflicts  []recovery.Conflict `json:"conflicts"`
	Notes      []string            `json:"notes"`
	// HeaderSynthesized: recovery wrote a header before the lines (the file has none).
	HeaderSynthesized bool `json:"header_synthesized"`
}

// recoverAll rebuilds every conversation into a fresh directory: each live file must come
// back byte for byte (its complete lines) from the key it is mirrored under.
func (r *run) recoverAll(pair map[*file]string) *Failure {
	out, err := os.MkdirTemp(r.dir, "recovered-")
	if err != nil {
		return &Failure{Guarantee: "harness", Detail: err.Error()}
	}
	defer os.RemoveAll(out)
	stdout, stderr, err := r.runCLI(120*time.Second, "recover", "--all", "--out", out, "--json")
	if c := crashed(stderr); c != "" {
		return &Failure{Guarantee: "recover does not crash", Detail: c}
	}
	var rep recoverReport
	if jerr := json.Unmarshal(stdout, &rep); jerr != nil {
		return &Failure{Guarantee: "recover --json", Detail: fmt.Sprintf("%v (exit %v): %s", jerr, err, clip(stderr, 2000))}
	}
	byKey := map[string]int{}
	for i, c := range rep.Conversations {
		byKey[c.Key] = i
	}
	var bad []string
	for f, key := range pair {
		i, ok := byKey[key]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: key %s not in recover's report", f, key))
			continue
		}
		c := rep.Conversations[i]
		if c.Result == string(recovery.Refused) && strings.Contains(c.Reason, recovery.ErrShrunk.Error()) {
			// The file lacks entries it had (cut back, a fresh header over it): recover
			// restores that newest generation only when asked for it by number.
			gen := c.Generation
			var why string
			if c, why = r.recoverGeneration(out, key, gen); why != "" {
				bad = append(bad, fmt.Sprintf("%s: key %s, its shrunk newest generation %d asked for: %s", f, key, gen, why))
				continue
			}
		}
		if c.Result != string(recovery.Written) && c.Result != string(recovery.Unchanged) {
			var same []string
			for _, o := range rep.Conversations {
				if o.Conversation == c.Conversation {
					same = append(same, fmt.Sprintf("[key %s → %s %s]", o.Key, rel(r.dir, o.Output), o.Result))
				}
			}
			bad = append(bad, fmt.Sprintf("%s: key %s %s: %s (generation %d, %d lines rebuilt, missing %v, conflicts %v); reports of the id: %s",
				f, key, c.Result, c.Reason, c.Generation, c.Lines, c.Missing, c.Conflicts, strings.Join(same, " ")))
			continue
		}
		got, err := os.ReadFile(c.Output)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", f, err))
			continue
		}
		if c.HeaderSynthesized && !hasHeader(f.sf.Lines) {
			// A file without a header line (cut back to the records before it) comes
			// back after a header recovery writes: every line of it follows as it was.
			if _, rest, _ := bytes.Cut(got, []byte("\n")); bytes.Equal(rest, mirrortest.JoinLines(f.sf.Lines)) {
				continue
			}
		}
		if want := mirrortest.JoinLines(f.sf.Lines); !bytes.Equal(got, want) {
			bad = append(bad, fmt.Sprintf("%s: recovered %d bytes (generation %d, %d lines, notes %q) differ from the file's %d bytes of complete lines",
				f, len(got), c.Generation, c.Lines, c.Notes, len(want)))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return &Failure{Guarantee: "recovery is byte-identical (3, 4, §4)", Detail: strings.Join(bad, "\n")}
	}
	if bad := r.followFaults(rep, out); len(bad) > 0 {
		return &Failure{Guarantee: "every followed file equals the mirror's newest generation, or is reported (recover --follow)",
			Detail: strings.Join(bad[:min(20, len(bad))], "\n")}
	}
	return nil
}

// recoverGeneration recovers generation gen of key into a fresh directory under out.
func (r *run) recoverGeneration(out, key string, gen int) (c recoverConv, why string) {
	dir, err := os.MkdirTemp(out, "gen-")
	if err != nil {
		return c, err.Error()
	}
	stdout, stderr, err := r.runCLI(60*time.Second, "recover", "--conversation", key, "--generation", fmt.Sprint(gen), "--out", dir, "--json")
	var rep recoverReport
	if jerr := json.Unmarshal(stdout, &rep); jerr != nil {
		return c, fmt.Sprintf("%v (exit %v): %s", jerr, err, clip(stderr, 2000))
	}
	for _, rc := range rep.Conversations {
		if rc.Key == key {
			return rc, ""
		}
	}
	return c, "not in the report"
}

// verifyDoc is the part of `verify --json` the harness reads.
type verifyDoc struct {
	Files []struct {
		Path   string        `json:"path"`
		Result string        `json:"result"`
		Detail string        `json:"detail"`
		Error  string        `json:"error"`
		Drift  *verify.Drift `json:"drift"`
	} `json:"files"`
}

// driftSummary says what a drift was found against (verify puts no detail or error on a
// drift): the key whose head verify paired the file with, and how they differ.
func driftSummary(d *verify.Drift) string {
	if d == nil {
		return ""
	}
	out := fmt.Sprintf("(compared with %s generation %d: %d local lines, %d mirrored, %d pending", d.Key, d.Generation,
		d.LocalLines, d.MirrorLines, d.PendingLines)
	for i, it := range d.Items {
		if i == 5 {
			out += fmt.Sprintf(", %d more", len(d.Items)-i)
			break
		}
		out += fmt.Sprintf(", %s line %d mirror line %d", it.Kind, it.Line, it.MirrorLine)
	}
	return out + ")"
}

// verify runs `pisync verify`: no live file may be reported drifted or in error.
func (r *run) verify() *Failure {
	stdout, stderr, err := r.runCLI(120*time.Second, "verify", "--json", "--root", r.fs.roots[0], "--root", r.fs.roots[1])
	if c := crashed(stderr); c != "" {
		return &Failure{Guarantee: "verify does not crash", Detail: c}
	}
	var doc verifyDoc
	if jerr := json.Unmarshal(stdout, &doc); jerr != nil {
		return &Failure{Guarantee: "verify --json", Detail: fmt.Sprintf("%v (exit %v): %s", jerr, err, clip(stderr, 2000))}
	}
	var bad []string
	for _, f := range doc.Files {
		if f.Result == "drift" || f.Result == "error" || f.Result == "not-mirrored" {
			bad = append(bad, strings.TrimSpace(fmt.Sprintf("%s %s %s %s %s", f.Result, rel(r.dir, f.Path), f.Detail, f.Error, driftSummary(f.Drift))))
		}
	}
	if len(bad) > 0 {
		return &Failure{Guarantee: "verify agrees with the mirror", Detail: strings.Join(append(bad, r.headsOf()...), "\n")}
	}
	return nil
}

// headsOf lists the heads of the conversations of the live files, for a report.
func (r *run) headsOf() []string {
	ctx, cancel := r.ctx(20 * time.Second)
	defer cancel()
	list, err := r.reader.ListHeads(ctx)
	if err != nil {
		return []string{"heads: " + err.Error()}
	}
	out := []string{fmt.Sprintf("%d heads, %d bad", len(list.Heads), len(list.Bad))}
	for _, h := range list.Heads {
		out = append(out, fmt.Sprintf("head %s: host %s root %s source %s generation %d entries %d",
			h.Key, h.Host, rel(r.dir, h.Root), h.Source, h.Generation, h.Entries))
	}
	sort.Strings(out)
	return out
}

// concurrentRecover runs `recover --all --out` while the tree changes: it may refuse or
// fail while the server is down, but must not crash, and every line it writes is one
// some file held whole, or a placeholder or header it made up.
func (r *run) concurrentRecover() {
	out, err := os.MkdirTemp(r.dir, "recover-live-")
	if err != nil {
		r.t.Fatal(err)
	}
	// Lines written after this moment may be recovered too: read the digests afterwards,
	// when operations are paused at the next quiet point (check waits for this).
	r.background("recover --all (concurrent)", func() error {
		_, stderr, _ := r.runCLI(120*time.Second, "recover", "--all", "--out", out, "--json")
		if c := crashed(stderr); c != "" {
			return fmt.Errorf("crashed: %s", c)
		}
		return nil
	})
	r.recovered = append(r.recovered, out)
}

// recoveredFaults lists lines of the concurrent recoveries' files that no file ever held
// whole (placeholders and synthesized headers excepted).
func (r *run) recoveredFaults() []string {
	var bad []string
	for _, dir := range r.recovered {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			for i, l := range session.SplitLines(b) {
				if r.fs.written[sha256.Sum256(l)] || bytes.Contains(l, []byte(recovery.PlaceholderType)) ||
					(i == 0 && bytes.Contains(l, []byte(`"type":"session"`))) {
					continue
				}
				bad = append(bad, fmt.Sprintf("%s line %d: %q", rel(r.dir, p), i+1, clip(l, 80)))
			}
			return nil
		})
		os.RemoveAll(dir)
	}
	r.recovered = nil
	return bad
}

// concurrentSurvey runs status and verify while the tree changes: neither may crash.
func (r *run) concurrentSurvey() {
	for _, args := range [][]string{{"status", "--json", "--root", r.fs.roots[0], "--root", r.fs.roots[1]},
		{"verify", "--json", "--root", r.fs.roots[0], "--root", r.fs.roots[1]}} {
		r.background(args[0]+" (concurrent)", func() error {
			_, stderr, _ := r.runCLI(120*time.Second, args...)
			if c := crashed(stderr); c != "" {
				return fmt.Errorf("crashed: %s", c)
			}
			return nil
		})
	}
}

// restore deletes a file the mirror holds completely and restores it with
// `pisync recover --conversation --root`, while the daemon watches: it must come back
// byte for byte where it was.
func (r *run) restore(rng *rand.Rand) (string, error) {
	f := r.fs.pick(rng, func(f *file) bool {
		// A file without its header comes back after a header recovery writes
		// (recoverAll checks that): restored byte for byte are the others.
		return f.torn == nil && !f.moved && r.fs.sameID(f.sf.ID) == 1 && len(f.sf.Lines) > 0 && hasHeader(f.sf.Lines)
	})
	if f == nil {
		return "skipped: no file for it", nil
	}
	ctx, cancel := r.ctx(20 * time.Second)
	defer cancel()
	for {
		s, err := r.read(ctx)
		if err == nil {
			ok, _ := s.equal(s.newest(f.sf.ID), f.sf.Lines)
			// recover --root places the file where its head says: wait for the head too.
			if ok && r.headFaults(ctx, s, map[*file]string{f: f.sf.ID}) == "" {
				break
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Sprintf("skipped: %s not mirrored yet", f), nil
		case <-time.After(200 * time.Millisecond): // poll with a deadline
		}
	}
	want := f.content()
	if err := os.Remove(f.sf.Path); err != nil {
		return "", err
	}
	stdout, stderr, err := r.runCLI(60*time.Second, "recover", "--conversation", f.sf.ID, "--root", r.fs.roots[0], "--root", r.fs.roots[1], "--json")
	if err != nil && bytes.Contains(stdout, []byte(recovery.ErrShrunk.Error())) {
		// The file was cut back or overwritten since its previous generation: the user
		// restores the newest one by number.
		s, rerr := r.read(ctx)
		if rerr != nil {
			return "", rerr
		}
		stdout, stderr, err = r.runCLI(60*time.Second, "recover", "--conversation", f.sf.ID, "--generation", fmt.Sprint(s.newestGen(f.sf.ID)),
			"--root", r.fs.roots[0], "--root", r.fs.roots[1], "--json")
	}
	got, rerr := os.ReadFile(f.sf.Path)
	if err != nil || rerr != nil || !bytes.Equal(got, want) {
		r.fs.remove(f) // whatever is there now is not the run's file
		if rerr == nil {
			_ = os.Remove(f.sf.Path)
		}
		return f.String(), &Failure{Guarantee: "recover restores a deleted file byte for byte (§4)",
			Detail: fmt.Sprintf("%s: recover: %v; read: %v; %d bytes back, %d wanted\n%s\n%s", f, err, rerr, len(got), len(want),
				clip(stdout, 2000), clip(stderr, 2000))}
	}
	return f.String(), nil
}

// distinct reports whether no ordinal is in ords twice. A message id stored at two
// ordinals is a repeated entry id (op dup-id) that came after the server's duplicate
// window: the server keeps it under the shared id, and both lines are in the mirror
// (DESIGN §3, 1). A line stored twice shows as one ordinal twice.
func distinct(ords []int64) bool {
	seen := make(map[int64]bool, len(ords))
	for _, o := range ords {
		if seen[o] {
			return false
		}
		seen[o] = true
	}
	return true
}
