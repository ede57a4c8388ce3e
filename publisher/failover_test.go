package publisher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// testDaemon is a publisher, and with a root its watcher, as `pisync run` wires them
// (Reopen bound to the watcher).
type testDaemon struct {
	cp    *checkpoint.Store
	pub   *Publisher
	close func() // stops the watcher, drains the publisher, closes the checkpoints
}

// startDaemonAt starts a daemon of host on the server at url with the checkpoints of
// cpDir, watching root ("": no watcher, the test hands the publisher its files).
func startDaemonAt(t *testing.T, ctx context.Context, url, root, cpDir, host string, window int) *testDaemon {
	t.Helper()
	cp := openStore(t, cpDir)
	opts := testOptions(t, ctx, url)
	opts.Checkpoints, opts.Host = cp, host
	if os.Getenv("PISYNC_TEST_DEBUG") != "" {
		opts.Logger = zaptest.NewLogger(t).Named(host)
	}
	opts.CommitInterval, opts.HeadInterval = 20*time.Millisecond, 20*time.Millisecond
	if window > 0 {
		opts.WindowMessages = window
	}
	var reopen struct {
		sync.Mutex
		fn func(string) bool
	}
	opts.Reopen = func(path string) bool {
		reopen.Lock()
		defer reopen.Unlock()
		return reopen.fn != nil && reopen.fn(path)
	}
	p, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	stop := func() {}
	if root != "" {
		var w *watcher.Watcher
		w, stop = startWatcherFor(t, ctx, p, root)
		reopen.Lock()
		reopen.fn = w.Reopen
		reopen.Unlock()
	}
	var once sync.Once
	return &testDaemon{cp: cp, pub: p, close: func() {
		once.Do(func() {
			stop()
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.Close(cctx); err != nil {
				t.Error(err)
			}
			_ = cp.Close()
		})
	}}
}

// site is one host of a warm standby: its root and state directory, and its daemon
// while it runs. Every site of a test shares one server.
type site struct {
	t      *testing.T
	ctx    context.Context
	url    string
	name   string
	root   string
	cpDir  string
	d      *testDaemon
	reader *mirror.Reader
}

func newSite(t *testing.T, ctx context.Context, url, name string) *site {
	s := &site{t: t, ctx: ctx, url: url, name: name, root: t.TempDir(), cpDir: t.TempDir()}
	t.Cleanup(s.stop)
	return s
}

// start runs the site's daemon on its root; manual runs its publisher alone.
func (s *site) start()  { s.run(s.root) }
func (s *site) manual() { s.run("") }

func (s *site) run(root string) {
	s.t.Helper()
	s.d = startDaemonAt(s.t, s.ctx, s.url, root, s.cpDir, s.name, 0)
	s.reader = s.d.pub.reader
}

func (s *site) stop() {
	if s.d != nil {
		s.d.close()
		s.d = nil
	}
}

// copyTo writes f's bytes at the same path under root (what recovery writes of a
// conversation the mirror holds whole) and returns the copy's generator.
func copyTo(t *testing.T, f *sessiontest.File, from, root string, seed uint64) *sessiontest.File {
	t.Helper()
	rel, err := filepath.Rel(from, f.Path)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, f.Content(), 0o644); err != nil {
		t.Fatal(err)
	}
	return f.Clone(rand.New(rand.NewPCG(seed, 3)), path)
}

// gensOf reads conversation key's messages by generation, in stream order.
func gensOf(t *testing.T, ctx context.Context, r *mirror.Reader, key string) map[int][]mirror.Msg {
	t.Helper()
	c, err := r.Conv(key)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int][]mirror.Msg{}
	err = r.Scan(ctx, c, mirror.ScanOptions{HeadersOnly: true}, func(m mirror.Msg) error {
		out[m.Generation] = append(out[m.Generation], m)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// holdsLines reports whether msgs hold exactly lines, each ordinal once.
func holdsLines(msgs []mirror.Msg, lines [][]byte) bool {
	if len(msgs) != len(lines) {
		return false
	}
	byOrd := map[int64]string{}
	for _, m := range msgs {
		if _, dup := byOrd[m.Ordinal]; dup {
			return false
		}
		byOrd[m.Ordinal] = m.SHA256
	}
	for i, l := range lines {
		if byOrd[int64(i)] != lineDigest(l) {
			return false
		}
	}
	return true
}

func lineDigest(l []byte) string {
	sum := sha256.Sum256(l)
	return hex.EncodeToString(sum[:])
}

// waitGeneration waits until generation gen of key holds exactly lines.
func waitGeneration(t *testing.T, ctx context.Context, r *mirror.Reader, key string, gen int, lines [][]byte) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("generation %d of %s holding %d lines", gen, key, len(lines)), func() bool {
		return holdsLines(gensOf(t, ctx, r, key)[gen], lines)
	})
}

// headNaming waits until the head of key names host and holds n lines.
func headNaming(t *testing.T, ctx context.Context, r *mirror.Reader, key, host string, n int) mirror.Head {
	t.Helper()
	c, err := r.Conv(key)
	if err != nil {
		t.Fatal(err)
	}
	var h mirror.Head
	waitUntil(t, fmt.Sprintf("the head of %s naming %s with %d lines", key, host, n), func() bool {
		h, _, err = r.Head(ctx, c)
		return err == nil && h.Host == host && h.Entries == int64(n)
	})
	return h
}

// TestRestartBackfillAfterTakeOver: host a dies with lines it had read but not yet
// published; host b takes the conversation over from a copy and appends; host a comes
// back and sends the lines it holds past its checkpoint (a back-fill) just after host b's
// line landed. The first of them is fenced and refused; the ones behind it must not go
// out unfenced meanwhile, or they land in host b's generation after its line.
func TestRestartBackfillAfterTakeOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	a, b := newSite(t, ctx, srv.URL(), "host-a"), newSite(t, ctx, srv.URL(), "host-b")
	f := sessiontest.New(rand.New(rand.NewPCG(28, 3)), a.root, "/home/dev/p", sessiontest.CLIV3)
	mustAppendLines(t, f, f.HeaderLine("/home/dev/p"), f.Message(200), f.Message(300))
	a.start()
	waitGeneration(t, ctx, a.reader, f.ID, 1, f.Lines)
	headNaming(t, ctx, a.reader, f.ID, "host-a", 3)
	a.stop()

	bf := copyTo(t, f, a.root, b.root, 1)
	b.start()
	headNaming(t, ctx, b.reader, f.ID, "host-b", 3) // b took the conversation over
	shared := len(f.Lines)
	mustAppendLines(t, f, f.Message(150), f.Message(150), f.Message(150)) // read by a, not published

	a.manual()
	fw, fd := openForLines(t, ctx, a.d.pub, a.root, f.Path, f.Lines[0])
	mustAppendLines(t, bf, bf.Message(150))
	waitGeneration(t, ctx, b.reader, f.ID, 1, bf.Lines)
	off := int64(0)
	for _, l := range f.Lines[:shared] {
		off += int64(len(l)) + 1
	}
	for ord := shared; ord < len(f.Lines); ord++ {
		l := f.Lines[ord]
		err := a.d.pub.Line(ctx, fw, watcher.Line{Ordinal: int64(ord), Offset: off, Len: int64(len(l)), Data: l, Seen: time.Now(), Src: fd})
		if err != nil && !errors.Is(err, watcher.ErrReopen) {
			t.Fatalf("line %d: %v", ord, err)
		}
		off += int64(len(l)) + 1
	}
	st := a.d.pub.state(fw.ID)
	waitUntil(t, "host a giving the generation up", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.takenOver
	})
	if g := gensOf(t, ctx, b.reader, f.ID); len(g) != 1 || !holdsLines(g[1], bf.Lines) {
		t.Fatalf("generations %v: want generation 1 holding host b's copy alone (%d lines)", lens(g), len(bf.Lines))
	}

	// Reopened, as the watcher does when asked: host a's whole file goes to its own key.
	fw.Size = int64(len(f.Content()))
	start, err := a.d.pub.Open(ctx, fw, watcher.Truncated)
	if err != nil {
		t.Fatal(err)
	}
	handLines(t, ctx, a.d.pub, fw, fd, f.Lines, start)
	checkDiverged(t, ctx, a, b, f, bf, shared)
}

// handLines hands p the lines of the file fw from start on, as the watcher would.
func handLines(t *testing.T, ctx context.Context, p *Publisher, fw watcher.File, fd *os.File, lines [][]byte, start watcher.Start) {
	t.Helper()
	off := start.Offset
	for ord := start.Ordinal; ord < int64(len(lines)); ord++ {
		l := lines[ord]
		if err := p.Line(ctx, fw, watcher.Line{Ordinal: ord, Offset: off, Len: int64(len(l)), Data: l, Seen: time.Now(), Src: fd}); err != nil {
			t.Fatalf("line %d: %v", ord, err)
		}
		off += int64(len(l)) + 1
	}
}

// checkDiverged checks the outcome of a divergence: the conversation's key holds host
// w's copy (the winner, wf) in generation 1 and its head names w; host l's copy (lf) is
// mirrored whole under l's diverged key, whose head names l and records that w
// continued the conversation after shared lines; every message once.
func checkDiverged(t *testing.T, ctx context.Context, l, w *site, lf, wf *sessiontest.File, shared int) {
	t.Helper()
	checkDivergedAt(t, ctx, l, w, lf, wf, 1, mirror.Divergence{Key: lf.ID, Generation: 1, Ordinal: int64(shared), Host: w.name})
}

// checkDivergedAt is checkDiverged with the winner's copy in generation wgen of the
// conversation, and the divergence want recorded.
func checkDivergedAt(t *testing.T, ctx context.Context, l, w *site, lf, wf *sessiontest.File, wgen int, want mirror.Divergence) {
	t.Helper()
	r := w.reader
	if r == nil {
		r = l.reader
	}
	rel, err := filepath.Rel(l.root, lf.Path)
	if err != nil {
		t.Fatal(err)
	}
	dkey := divergedKey(lf.ID, l.name, watcher.File{Root: l.root, Rel: filepath.ToSlash(rel)})
	waitGeneration(t, ctx, r, dkey, 1, lf.Lines)
	waitGeneration(t, ctx, r, lf.ID, wgen, wf.Lines)
	h := headNaming(t, ctx, r, dkey, l.name, len(lf.Lines))
	if h.DivergedFrom == nil || *h.DivergedFrom != want || h.Conversation != lf.ID || h.Key != dkey {
		t.Errorf("the diverged key's head: %+v, diverged from %+v; want %+v", h, h.DivergedFrom, want)
	}
	if wh := headNaming(t, ctx, r, lf.ID, w.name, len(wf.Lines)); wh.DivergedFrom != nil || wh.Generation != wgen {
		t.Errorf("the conversation's head: %+v", wh)
	}
	if g := gensOf(t, ctx, r, dkey); len(g) != 1 {
		t.Errorf("%s: generations %v, want one", dkey, lens(g))
	}
	if g := gensOf(t, ctx, r, lf.ID); len(g) != wgen {
		t.Errorf("%s: generations %v, want %d", lf.ID, lens(g), wgen)
	}
}

func mustAppendLines(t *testing.T, f *sessiontest.File, lines ...[]byte) {
	t.Helper()
	if err := f.Append(lines...); err != nil {
		t.Fatal(err)
	}
}

// failover is a warm standby on one server: host a mirrored a conversation (f, whose
// first shared lines both copies hold), host b runs on a byte-for-byte copy (bf) and
// took it over.
type failover struct {
	ctx    context.Context
	a, b   *site
	f, bf  *sessiontest.File
	shared int
}

// newFailover mirrors f from host a, stops a, and starts host b on a copy of f; it
// returns once b's head names it. headerless: f has no header line (Pi #8939), and b's
// copy one that recovery made, which makes it a new generation (2) on b. unrecorded: a's
// last line was published but a died before its checkpoint recorded it (b's copy has it).
func newFailover(t *testing.T, seed uint64, headerless, unrecorded bool) *failover {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	srv := natstest.Run(t)
	x := &failover{ctx: ctx, a: newSite(t, ctx, srv.URL(), "host-a"), b: newSite(t, ctx, srv.URL(), "host-b")}
	x.f = sessiontest.New(rand.New(rand.NewPCG(seed, 4)), x.a.root, "/home/dev/p", sessiontest.CLIV3)
	if !headerless {
		mustAppendLines(t, x.f, x.f.HeaderLine("/home/dev/p"))
	}
	mustAppendLines(t, x.f, x.f.Message(200), x.f.Message(300))
	x.shared = len(x.f.Lines)
	x.a.start()
	waitGeneration(t, ctx, x.a.reader, x.f.ID, 1, x.f.Lines)
	headNaming(t, ctx, x.a.reader, x.f.ID, "host-a", x.shared)
	x.a.stop()
	if unrecorded {
		saved := copyDir(t, x.a.cpDir)
		x.a.start()
		mustAppendLines(t, x.f, x.f.Message(150))
		x.shared = len(x.f.Lines)
		waitGeneration(t, ctx, x.a.reader, x.f.ID, 1, x.f.Lines)
		x.a.stop()
		restoreDir(t, saved, x.a.cpDir)
	}
	x.bf = copyTo(t, x.f, x.a.root, x.b.root, seed)
	gen := 1
	if headerless {
		x.bf.Reset(x.bf.Format, append([][]byte{x.f.HeaderLine("/home/dev/p")}, x.f.Lines...))
		if err := sessiontest.Rewrite(x.bf.Path, x.bf.Lines); err != nil {
			t.Fatal(err)
		}
		gen = 2
	}
	x.b.start()
	waitGeneration(t, ctx, x.b.reader, x.f.ID, gen, x.bf.Lines)
	headNaming(t, ctx, x.b.reader, x.f.ID, "host-b", len(x.bf.Lines))
	return x
}

// TestFailoverDivergence: the primary comes back (restarted with its state, or it never
// died and was cut off) while the standby holds the conversation. Whichever copy's line
// lands first past the lines they share goes on under the conversation's key; the other
// copy, once it has lines of its own, is mirrored whole under its diverged key. A copy
// with nothing of its own publishes nothing.
func TestFailoverDivergence(t *testing.T) {
	for _, tc := range []struct {
		name       string
		headerless bool // b's copy is not a's lines: b started generation 2
		unrecorded bool // a died before its checkpoint recorded its last line
		run        func(t *testing.T, x *failover)
	}{
		{"a, still running, appends after b did", false, false, func(t *testing.T, x *failover) {
			x.a.start()
			mustAppendLines(t, x.bf, x.bf.Message(150), x.bf.Message(150))
			waitGeneration(t, x.ctx, x.b.reader, x.f.ID, 1, x.bf.Lines)
			mustAppendLines(t, x.f, x.f.Message(150))
			checkDiverged(t, x.ctx, x.a, x.b, x.f, x.bf, x.shared)
			mustAppendLines(t, x.f, x.f.Message(150)) // a goes on under its own key
			mustAppendLines(t, x.bf, x.bf.Message(150))
			checkDiverged(t, x.ctx, x.a, x.b, x.f, x.bf, x.shared)
		}},
		{"a comes back from its checkpoint with lines written while it was down", false, false, func(t *testing.T, x *failover) {
			mustAppendLines(t, x.bf, x.bf.Message(150))
			waitGeneration(t, x.ctx, x.b.reader, x.f.ID, 1, x.bf.Lines)
			mustAppendLines(t, x.f, x.f.Message(150), x.f.Message(150))
			x.a.start()
			checkDiverged(t, x.ctx, x.a, x.b, x.f, x.bf, x.shared)
		}},
		{"a, killed before its checkpoint recorded a line b's copy has, comes back with lines of its own", false, true, func(t *testing.T, x *failover) {
			mustAppendLines(t, x.bf, x.bf.Message(150))
			waitGeneration(t, x.ctx, x.b.reader, x.f.ID, 1, x.bf.Lines)
			mustAppendLines(t, x.f, x.f.Message(150))
			x.a.start()
			checkDiverged(t, x.ctx, x.a, x.b, x.f, x.bf, x.shared)
		}},
		{"a comes back with nothing of its own, then appends", false, false, func(t *testing.T, x *failover) {
			mustAppendLines(t, x.bf, x.bf.Message(150))
			headNaming(t, x.ctx, x.b.reader, x.f.ID, "host-b", len(x.bf.Lines))
			before := keysOf(t, x.ctx, x.b.reader)
			x.a.start()
			waitUntil(t, "host a's file seen", func() bool {
				pr := x.a.d.pub.Progress().Roots[x.a.root]
				return pr != nil && pr.Sessions == 1 && pr.Pending == 0
			})
			x.a.stop() // its last checkpoint and head flush done
			if after := keysOf(t, x.ctx, x.b.reader); after != before {
				t.Fatalf("host a came back with nothing to add; the mirror went from %s to %s", before, after)
			}
			x.a.start() // and again, now from the checkpoint it wrote
			mustAppendLines(t, x.f, x.f.Message(150))
			checkDiverged(t, x.ctx, x.a, x.b, x.f, x.bf, x.shared)
		}},
		{"a and b append at once", false, false, func(t *testing.T, x *failover) {
			x.a.start()
			var wg sync.WaitGroup
			for _, f := range []*sessiontest.File{x.f, x.bf} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := f.Append(f.Message(150)); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			mustAppendLines(t, x.f, x.f.Message(150))
			mustAppendLines(t, x.bf, x.bf.Message(150))
			// One of them goes on under the conversation's key, the other diverges.
			dkeyOf := func(s *site, f *sessiontest.File) string {
				rel, _ := filepath.Rel(s.root, f.Path)
				return divergedKey(f.ID, s.name, watcher.File{Root: s.root, Rel: filepath.ToSlash(rel)})
			}
			var loser string
			waitUntil(t, "one copy diverged", func() bool {
				for _, c := range []struct {
					s *site
					f *sessiontest.File
				}{{x.a, x.f}, {x.b, x.bf}} {
					if len(gensOf(t, x.ctx, x.b.reader, dkeyOf(c.s, c.f))) > 0 {
						loser = c.s.name
						return true
					}
				}
				return false
			})
			if loser == "host-a" {
				checkDiverged(t, x.ctx, x.a, x.b, x.f, x.bf, x.shared)
			} else {
				checkDiverged(t, x.ctx, x.b, x.a, x.bf, x.f, x.shared)
			}
		}},
		{"b's copy made a new generation; a comes back with nothing of its own, then appends", true, false, func(t *testing.T, x *failover) {
			before := keysOf(t, x.ctx, x.b.reader)
			x.a.start()
			waitUntil(t, "host a's file seen", func() bool {
				pr := x.a.d.pub.Progress().Roots[x.a.root]
				return pr != nil && pr.Sessions == 1 && pr.Pending == 0
			})
			x.a.stop()
			if after := keysOf(t, x.ctx, x.b.reader); after != before {
				t.Fatalf("host a came back with nothing to add; the mirror went from %s to %s", before, after)
			}
			x.a.start()
			mustAppendLines(t, x.f, x.f.Message(150))
			mustAppendLines(t, x.bf, x.bf.Message(150))
			checkDivergedAt(t, x.ctx, x.a, x.b, x.f, x.bf, 2,
				mirror.Divergence{Key: x.f.ID, Generation: 1, Ordinal: int64(x.shared), Host: "host-b"})
		}},
		{"b's copy made a new generation; a, still running, appends", true, false, func(t *testing.T, x *failover) {
			x.a.start()
			mustAppendLines(t, x.f, x.f.Message(150))
			checkDivergedAt(t, x.ctx, x.a, x.b, x.f, x.bf, 2,
				mirror.Divergence{Key: x.f.ID, Generation: 1, Ordinal: int64(x.shared), Host: "host-b"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newFailover(t, 41, tc.headerless, tc.unrecorded))
		})
	}
}

// keysOf describes what the mirror holds: each conversation key, its messages and head.
func keysOf(t *testing.T, ctx context.Context, r *mirror.Reader) string {
	t.Helper()
	counts, err := r.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	heads, err := r.Heads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := fmt.Sprint(counts)
	for _, h := range heads {
		out += fmt.Sprintf(" %s:%s/gen %d/seq %d/%d lines", h.ConvKey(), h.Host, h.Generation, h.LastSeq, h.Entries)
	}
	return out
}
