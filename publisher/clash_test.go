package publisher

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// TestClashingPairsFoundTogetherBothMirrored pins issue 13 item 11 (guarantee 9): a v1
// session and its copy migrated to v3 carry one header id under two file names. Found in
// the same first scan, both must be mirrored (under two keys) and the clash counted, in
// whatever order and interleaving the watcher's workers open them. Each round starts a
// fresh publisher on many such pairs whose names sort in a random order, with more
// workers than cores, so that the openings of a pair overlap.
func TestClashingPairsFoundTogetherBothMirrored(t *testing.T) {
	const rounds, pairs = 6, 10
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	rng := rand.New(rand.NewPCG(11, 13))
	for round := range rounds {
		root := t.TempDir()
		var files []*sessiontest.File
		for range pairs {
			v1 := sessiontest.New(rng, root, "/home/dev/p", sessiontest.CLIV1)
			v3 := sessiontest.New(rng, root, "/home/dev/p", sessiontest.CLIV3)
			v3.ID = v1.ID // the migrated copy keeps the id; its name is its own
			pair := []*sessiontest.File{v1, v3}
			rng.Shuffle(len(pair), func(i, j int) { pair[i], pair[j] = pair[j], pair[i] })
			for _, f := range pair {
				if err := f.Append(f.HeaderLine("/home/dev/p"), f.Entry(300), f.Entry(400), f.Entry(200)); err != nil {
					t.Fatal(err)
				}
			}
			files = append(files, pair...)
		}
		store := openStore(t, t.TempDir())
		p := startPublisher(t, ctx, srv.URL(), store)
		w, err := watcher.New(watcher.Options{Roots: []string{root}, Sink: p, Workers: 8, MoveGrace: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(wctx) }()
		waitUntil(t, "every file mirrored", func() bool {
			pr := p.Progress().Roots[root]
			return pr != nil && pr.Mirrored == len(files)
		})
		wcancel()
		<-done
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		_ = store.Close()
		checkBothMirrored(t, ctx, p.reader, root, files, fmt.Sprintf("round %d", round))
		if n := testutil.ToFloat64(p.m.clashes); n != pairs {
			t.Errorf("round %d: clashes counted %v, want %d", round, n, pairs)
		}
		if n := testutil.ToFloat64(p.m.duplicates); n != 0 {
			t.Errorf("round %d: %v publishes acknowledged as duplicates, want 0", round, n)
		}
		if t.Failed() {
			return
		}
	}
}

// checkBothMirrored checks that each file is the newest generation of its own
// conversation key, byte for byte, and that no two files share a key.
func checkBothMirrored(t *testing.T, ctx context.Context, r *mirror.Reader, root string, files []*sessiontest.File, what string) {
	t.Helper()
	heads, err := r.Heads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bySource := map[string]mirror.Head{}
	for _, h := range heads {
		if h.Root == root {
			bySource[h.Source] = h
		}
	}
	keys := map[string]string{}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f.Path)
		h, ok := bySource[filepath.ToSlash(rel)]
		if !ok {
			t.Errorf("%s: %s has no head of its own", what, rel)
			continue
		}
		if other, dup := keys[h.Key]; dup {
			t.Errorf("%s: %s and %s mirrored under one key %s", what, rel, other, h.Key)
		}
		keys[h.Key] = rel
		c, err := r.Conv(h.Key)
		if err != nil {
			t.Fatal(err)
		}
		g, err := r.ReadGeneration(ctx, c, 0)
		if err != nil {
			t.Errorf("%s: %s: %v", what, rel, err)
			continue
		}
		if g.Duplicates != 0 || len(g.Generations) != 1 {
			t.Errorf("%s: %s: generations %v, %d duplicate ordinals", what, rel, g.Generations, g.Duplicates)
		}
		if len(g.Msgs) != len(f.Lines) {
			t.Errorf("%s: %s: %d lines mirrored, want %d", what, rel, len(g.Msgs), len(f.Lines))
			continue
		}
		for i, m := range g.Msgs {
			if m.Kind == mirror.KindBlob {
				rc, err := r.Blob(ctx, m.SHA256)
				if err != nil {
					t.Fatalf("%s: %s line %d: %v", what, rel, i+1, err)
				}
				m.Data, err = io.ReadAll(rc)
				rc.Close()
				if err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(m.Data, f.Lines[i]) {
				t.Errorf("%s: %s line %d differs in the mirror", what, rel, i+1)
				break
			}
		}
	}
}

// TestClashKeysStableAfterStateLoss (torture seed 424242, FINDINGS-publish): after the
// state directory was lost, the copy of a session was found before its original, took
// the plain id, and the original a new clash key: three keys for two files, two heads
// naming one path, and recovery refusing one. A file opened without a checkpoint now
// keeps the clash key its head in the mirror says it had; without a head (a daemon
// killed before its first head flush, torture T3 seed 410889947860), the key its lines
// in the mirror say it had.
func TestClashKeysStableAfterStateLoss(t *testing.T) {
	for _, headLost := range []bool{false, true} {
		t.Run(fmt.Sprintf("head lost %v", headLost), func(t *testing.T) { clashKeysStableAfterStateLoss(t, headLost) })
	}
}

func clashKeysStableAfterStateLoss(t *testing.T, headLost bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	rng := rand.New(rand.NewPCG(17, 19))
	root, aside := t.TempDir(), t.TempDir()
	orig := newSession(t, rng, root, 300, 400)
	origRel, _ := filepath.Rel(root, orig.Path)
	origRel = filepath.ToSlash(origRel)
	copyRel := "copy/" + filepath.Base(orig.Path)
	copyPath := filepath.Join(root, filepath.FromSlash(copyRel))
	// keys maps each source of the conversation's heads to its key.
	keys := func(p *Publisher) map[string]string {
		heads, err := p.reader.Heads(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, h := range heads {
			if h.Conversation == orig.ID {
				if other, dup := out[h.Source]; dup {
					t.Errorf("keys %s and %s both name %s", other, h.Key, h.Source)
				}
				out[h.Source] = h.Key
			}
		}
		return out
	}
	headAt := func(p *Publisher, source string) func() bool {
		return func() bool { _, ok := keys(p)[source]; return ok && p.Progress().Roots[root].Pending == 0 }
	}
	var lastPub *Publisher
	run := func(before, during func(p *Publisher)) map[string]string {
		store := openStore(t, t.TempDir()) // a fresh state directory every time
		p := startPublisher(t, ctx, srv.URL(), store)
		lastPub = p
		before(p)
		stop, _ := startWatcher(t, ctx, p, root)
		during(p)
		stop()
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		_ = store.Close()
		return keys(p)
	}
	// First run: the original alone, then its copy appears.
	first := run(func(*Publisher) {}, func(p *Publisher) {
		waitUntil(t, "the original mirrored", headAt(p, origRel))
		if err := os.MkdirAll(filepath.Dir(copyPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(copyPath, append(orig.Content(), append(orig.Entry(200), '\n')...), 0o644); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the copy mirrored", headAt(p, copyRel))
	})
	if first[origRel] != orig.ID || first[copyRel] == orig.ID || len(first) != 2 {
		t.Fatalf("first run: keys %v", first)
	}
	if headLost {
		// The copy's lines are in the mirror, its head is not.
		kv, err := lastPub.opts.JS.KeyValue(ctx, lastPub.opts.Names.HeadsBucket())
		if err != nil {
			t.Fatal(err)
		}
		conv, err := mirror.NewConv(lastPub.opts.Owner, first[copyRel])
		if err != nil {
			t.Fatal(err)
		}
		if err := kv.Purge(ctx, conv.HeadKey()); err != nil {
			t.Fatal(err)
		}
	}
	// State lost; the copy is found first (the original is out of the root meanwhile).
	moved := filepath.Join(aside, filepath.Base(orig.Path))
	second := run(func(*Publisher) {
		if err := os.Rename(orig.Path, moved); err != nil {
			t.Fatal(err)
		}
	}, func(p *Publisher) {
		waitUntil(t, "the copy mirrored again", func() bool {
			pr := p.Progress().Roots[root]
			return pr != nil && pr.Mirrored == 1
		})
		if err := os.Rename(moved, orig.Path); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "both mirrored", func() bool {
			pr := p.Progress().Roots[root]
			return pr != nil && pr.Mirrored == 2
		})
	})
	if len(second) != 2 || second[origRel] != first[origRel] || second[copyRel] != first[copyRel] {
		t.Errorf("after the state was lost: keys %v, were %v", second, first)
	}
	if n := testutil.ToFloat64(lastPub.m.clashes); n != 1 {
		t.Errorf("after the state was lost: clashes counted %v, want 1", n)
	}
}

// TestRemovalKeepsHeadOfKeyTakenOver (torture T4): a v1 session migrated to v3 under a
// new name and the old file removed. The new file took the plain key (the old one had
// vanished) before the watcher reported the removal, which then wrote the old file's
// last state over the new file's head. The head must describe the new file.
func TestRemovalKeepsHeadOfKeyTakenOver(t *testing.T) {
	ctx, p, _ := publisherOnServer(t)
	rng := rand.New(rand.NewPCG(29, 31))
	root := t.TempDir()
	v1 := sessiontest.New(rng, root, "/home/dev/p", sessiontest.CLIV1)
	if err := v1.Append(v1.HeaderLine("/home/dev/p"), v1.Entry(300), v1.Entry(300)); err != nil {
		t.Fatal(err)
	}
	w, err := watcher.New(watcher.Options{Roots: []string{root}, Sink: p, MoveGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { wcancel(); <-done }()
	waitUntil(t, "the v1 file mirrored", func() bool {
		pr := p.Progress().Roots[root]
		return pr != nil && pr.Mirrored == 1
	})
	// The v3 file is written under a name the watcher ignores while the v1 file exists
	// (so that it cannot get the v1 file's inode number), the v1 file removed, then the
	// v3 file named: it finds the v1 file gone and takes the plain key (written while the
	// v1 file is still there, it could be opened first and take a clash key instead),
	// and the watcher reports the removal only after MoveGrace.
	v3 := sessiontest.New(rng, root, "/home/dev/p", sessiontest.CLIV3)
	v3.ID = v1.ID
	final := v3.Path
	v3.Path += ".tmp"
	if err := v3.Append(v3.HeaderLine("/home/dev/p"), v3.Entry(300), v3.Entry(300), v3.Entry(300)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(v1.Path); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(v3.Path, final); err != nil {
		t.Fatal(err)
	}
	v3.Path = final
	v3Rel, _ := filepath.Rel(root, v3.Path)
	c, err := p.reader.Conv(v1.ID)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the v1 file reported removed", func() bool {
		pr := p.Progress().Roots[root]
		return pr != nil && pr.Deleted == 1 && pr.Mirrored == 1
	})
	waitUntil(t, "the v1 file forgotten", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.goneFiles) == 0
	})
	h, _, err := p.reader.Head(ctx, c)
	if err != nil || h.Source != filepath.ToSlash(v3Rel) || h.Entries != 4 || h.LocalDeleted {
		t.Errorf("head of %s: %+v, %v; want the v3 file's (4 lines, not deleted)", v1.ID, h, err)
	}
}

// TestReplacementKeepsKeyOfReplacedFile (torture T3): a copy of a session mirrored under
// its clash key, moved (its key stays), and its original deleted; the copy is then
// replaced by an atomic rename. The replacement took the plain id, which no live file
// held any more, so that two keys named one path and recovery restored the stale one. A
// replacement of a file that carried the same id keeps that file's key.
func TestReplacementKeepsKeyOfReplacedFile(t *testing.T) {
	ctx, p, _ := publisherOnServer(t)
	rng := rand.New(rand.NewPCG(37, 39))
	root := t.TempDir()
	orig := newSession(t, rng, root, 300, 400)
	stop, _ := startWatcher(t, ctx, p, root)
	defer stop()
	mirrored := func(n int) func() bool {
		return func() bool {
			pr := p.Progress().Roots[root]
			return pr != nil && pr.Mirrored == n && pr.Pending == 0
		}
	}
	heads := func() map[string][]mirror.Head { return headsBySource(t, ctx, p, orig.ID, true) }
	waitUntil(t, "the original mirrored", mirrored(1))
	cp := writeCopy(t, rng, orig, filepath.Join(root, "copy", filepath.Base(orig.Path)))
	waitUntil(t, "the copy mirrored", mirrored(2))
	if err := os.Remove(orig.Path); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(root, "moved", filepath.Base(orig.Path))
	movedRel := "moved/" + filepath.Base(orig.Path)
	moveFile(t, cp.Path, moved)
	var clashKey string
	waitUntil(t, "the copy's head at its new path", func() bool {
		hs := heads()
		if len(hs[movedRel]) == 1 {
			clashKey = hs[movedRel][0].Key
		}
		return len(hs[movedRel]) == 1
	})
	if clashKey == orig.ID {
		t.Fatalf("the copy mirrors under the plain id %s, want its clash key", clashKey)
	}
	// The watcher remembers the deleted original's inode for MoveGrace. The replacement
	// can get that inode number (ext4 reuses freed inodes), and then, its lines beginning
	// with the original's, it is the original moved over the copy and grown: a move keeps
	// its own key, the plain id. Not the case under test: once the removal is reported,
	// the inode number means a new file.
	waitUntil(t, "the original reported removed", func() bool {
		pr := p.Progress().Roots[root]
		return pr != nil && pr.Deleted == 1
	})
	// Replaced by an atomic rename, one line longer.
	lines := append(append([][]byte(nil), cp.Lines...), cp.Entry(250))
	replaceFile(t, moved, lines)
	waitUntil(t, "the replacement mirrored", func() bool {
		for _, h := range heads()[movedRel] {
			if h.LastOrdinal == int64(len(lines)-1) {
				return true
			}
		}
		return false
	})
	hs := heads()[movedRel]
	if len(hs) != 1 || hs[0].Key != clashKey {
		var keys []string
		for _, h := range hs {
			keys = append(keys, fmt.Sprintf("%s (generation %d, last ordinal %d)", h.Key, h.Generation, h.LastOrdinal))
		}
		t.Errorf("heads naming the replaced file: %v; want only its key %s", keys, clashKey)
	}
}

// TestClashReportedAfterRestart (torture T8): after a restart that keeps the state
// directory, both files of a clash get their keys back from their checkpoints and no
// claim is contested; the clash must still be reported, once.
func TestClashReportedAfterRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	rng := rand.New(rand.NewPCG(53, 59))
	root, stateDir := t.TempDir(), t.TempDir()
	orig := newSession(t, rng, root, 300)
	writeCopy(t, rng, orig, filepath.Join(root, "copy", filepath.Base(orig.Path)))
	for run := range 2 {
		store := openStore(t, stateDir)
		p := startPublisher(t, ctx, srv.URL(), store)
		stop, _ := startWatcher(t, ctx, p, root)
		waitUntil(t, "both files mirrored", func() bool {
			pr := p.Progress().Roots[root]
			return pr != nil && pr.Mirrored == 2 && pr.Pending == 0
		})
		stop()
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		_ = store.Close()
		if n := testutil.ToFloat64(p.m.clashes); n != 1 {
			t.Errorf("run %d: clashes counted %v, want 1", run, n)
		}
	}
}

// TestReplacementWhileStoppedKeepsKey (torture T3): a copy of a session mirrored under
// its clash key is moved (the key stays, derived from its old path) and then replaced by
// an atomic rename while the daemon is stopped. The replacement, opened without a
// checkpoint of its own, took a new key (the plain id, or the clash key of its new
// path), so that two keys named one path and recovery could restore the stale one. The
// path keeps its key: the replaced file's record names it.
func TestReplacementWhileStoppedKeepsKey(t *testing.T) {
	c := newStoppedCopy(t, 61, 67)
	// Replaced by an atomic rename, one line longer, while the daemon is stopped.
	lines := append(append([][]byte(nil), c.cp.Lines...), c.cp.Entry(250))
	replaceFile(t, c.moved, lines)
	p, stop := c.start()
	defer stop()
	waitUntil(t, "the replacement mirrored", func() bool {
		return c.headAt(p, c.movedRel, len(lines)) && c.mirrored(p, 2)()
	})
	c.wantKeys(p)
}

// stoppedCopy is a session under root (mirrored under its plain id) and its copy, moved
// to moved/ after it got its clash key, so that the key derived from the copy's path is
// not that key: daemons are started one after another on one state directory, and
// what happens to the files while none runs decides (torture T3, T26).
type stoppedCopy struct {
	t               *testing.T
	ctx             context.Context
	url             string
	root, stateDir  string
	orig, cp        *sessiontest.File
	origRel         string
	moved, movedRel string
	clashKey        string
}

// newStoppedCopy mirrors the session and its copy with a first daemon, moves the copy,
// waits for its head at the new path, and stops that daemon.
func newStoppedCopy(t *testing.T, seed1, seed2 uint64) *stoppedCopy {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	rng := rand.New(rand.NewPCG(seed1, seed2))
	c := &stoppedCopy{t: t, ctx: ctx, url: natstest.Run(t).URL(), root: t.TempDir(), stateDir: t.TempDir()}
	c.orig = newSession(t, rng, c.root, 300, 400)
	origRel, err := filepath.Rel(c.root, c.orig.Path)
	if err != nil {
		t.Fatal(err)
	}
	c.origRel = filepath.ToSlash(origRel)
	c.moved = filepath.Join(c.root, "moved", filepath.Base(c.orig.Path))
	c.movedRel = "moved/" + filepath.Base(c.orig.Path)

	p, stop := c.start()
	waitUntil(t, "the original mirrored", c.mirrored(p, 1))
	c.cp = writeCopy(t, rng, c.orig, filepath.Join(c.root, "copy", filepath.Base(c.orig.Path)))
	waitUntil(t, "the copy mirrored", c.mirrored(p, 2))
	moveFile(t, c.cp.Path, c.moved)
	waitUntil(t, "the copy's head at its new path", func() bool {
		hs := c.heads(p)[c.movedRel]
		if len(hs) == 1 {
			c.clashKey = hs[0].Key
		}
		return len(hs) == 1 && c.mirrored(p, 2)()
	})
	if c.clashKey == c.orig.ID {
		t.Fatalf("the copy mirrors under the plain id %s, want its clash key", c.clashKey)
	}
	stop()
	return c
}

// start starts a daemon on the state directory; stop stops it.
func (c *stoppedCopy) start() (*Publisher, func()) {
	store := openStore(c.t, c.stateDir)
	p := startPublisher(c.t, c.ctx, c.url, store)
	stopWatcher, _ := startWatcher(c.t, c.ctx, p, c.root)
	return p, func() {
		stopWatcher()
		if err := p.Close(c.ctx); err != nil {
			c.t.Error(err)
		}
		_ = store.Close()
	}
}

// heads are the heads of the session's id by source, those of deleted files left out.
func (c *stoppedCopy) heads(p *Publisher) map[string][]mirror.Head {
	return headsBySource(c.t, c.ctx, p, c.orig.ID, false)
}

// mirrored tells whether n files of the root are mirrored, none pending.
func (c *stoppedCopy) mirrored(p *Publisher, n int) func() bool {
	return func() bool {
		pr := p.Progress().Roots[c.root]
		return pr != nil && pr.Mirrored == n && pr.Pending == 0
	}
}

// headAt tells whether a head naming rel says its generation holds n lines.
func (c *stoppedCopy) headAt(p *Publisher, rel string, n int) bool {
	for _, h := range c.heads(p)[rel] {
		if h.LastOrdinal == int64(n-1) {
			return true
		}
	}
	return false
}

// wantKeys checks that one head names each file: the copy's its clash key, the
// original's the plain id.
func (c *stoppedCopy) wantKeys(p *Publisher) {
	c.t.Helper()
	hs := c.heads(p)
	for _, want := range []struct{ rel, key string }{{c.movedRel, c.clashKey}, {c.origRel, c.orig.ID}} {
		var keys []string
		for _, h := range hs[want.rel] {
			keys = append(keys, fmt.Sprintf("%s (generation %d, last ordinal %d)", h.Key, h.Generation, h.LastOrdinal))
		}
		if len(hs[want.rel]) != 1 || hs[want.rel][0].Key != want.key {
			c.t.Errorf("heads naming %s: %v; want only its key %s", want.rel, keys, want.key)
		}
	}
}

// writeCopy writes a copy of f (same id, its own entries' bytes) at path.
func writeCopy(t *testing.T, rng *rand.Rand, f *sessiontest.File, path string) *sessiontest.File {
	t.Helper()
	cp := f.Clone(rng, path)
	if err := os.MkdirAll(filepath.Dir(cp.Path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cp.Path, cp.Content(), 0o644); err != nil {
		t.Fatal(err)
	}
	return cp
}

// headsBySource maps each source of conversation id's heads to the heads naming it;
// those saying the file was deleted only if withDeleted.
func headsBySource(t *testing.T, ctx context.Context, p *Publisher, id string, withDeleted bool) map[string][]mirror.Head {
	t.Helper()
	list, err := p.reader.Heads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]mirror.Head{}
	for _, h := range list {
		if h.Conversation == id && (withDeleted || !h.LocalDeleted) {
			out[h.Source] = append(out[h.Source], h)
		}
	}
	return out
}

// newSession writes a v3 session under root: a header and entries of the given sizes.
func newSession(t *testing.T, rng *rand.Rand, root string, sizes ...int) *sessiontest.File {
	t.Helper()
	f := sessiontest.New(rng, root, "/home/dev/p", sessiontest.CLIV3)
	lines := [][]byte{f.HeaderLine("/home/dev/p")}
	for _, n := range sizes {
		lines = append(lines, f.Entry(n))
	}
	if err := f.Append(lines...); err != nil {
		t.Fatal(err)
	}
	return f
}

// moveFile renames from to to, making to's directory.
func moveFile(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

// replaceFile replaces the file at path with lines by an atomic rename (a new inode).
func replaceFile(t *testing.T, path string, lines [][]byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := sessiontest.Rewrite(tmp, lines); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestReusedInodeKeepsPathKey (torture T26): a session (plain id) and its moved copy
// (clash key) are both replaced by an atomic rename while the daemon is stopped, and the
// copy's replacement gets the inode number the original had: ext4 hands a freed inode
// number out again at once. The original's record, still in the store (the daemon never
// saw the replacement, or was killed before it committed the record's removal), then
// names that inode with the original's path and key, and its header is the copy's
// (copies share line 1). The replacement took the original's key as if it were the
// original moved there; the original's replacement took a new clash key, and the copy's
// old key kept a head naming the copy's path, so that two keys named it and verify
// compared the file with the stale one. Each path keeps its key.
func TestReusedInodeKeepsPathKey(t *testing.T) {
	c := newStoppedCopy(t, 83, 89)
	// Both replaced while stopped, each one line longer; the copy's replacement gets the
	// original's former inode number, which the test stands for by moving the original's
	// record to the replacement's inode (the record is the daemon's own, unchanged).
	origOld := inode(t, c.orig.Path)
	origLines := append(append([][]byte(nil), c.orig.Lines...), c.orig.Entry(250))
	replaceFile(t, c.orig.Path, origLines)
	copyLines := append(append([][]byte(nil), c.cp.Lines...), c.cp.Entry(260))
	replaceFile(t, c.moved, copyLines)
	store := openStore(t, c.stateDir)
	rec, ok := store.Get(checkpoint.Key(origOld.Dev, origOld.Ino))
	if !ok || rec.Rel != c.origRel || rec.ConvKey != c.orig.ID {
		t.Fatalf("the original's record: %+v (found %v); want one naming %s under %s", rec, ok, c.origRel, c.orig.ID)
	}
	reused := inode(t, c.moved)
	store.Delete(rec.Key())
	rec.Dev, rec.Ino = reused.Dev, reused.Ino
	store.Put(rec)
	if err := store.Commit(); err != nil {
		t.Fatal(err)
	}
	_ = store.Close()

	p, stop := c.start()
	defer stop()
	waitUntil(t, "both replacements mirrored", func() bool {
		return c.headAt(p, c.movedRel, len(copyLines)) && c.headAt(p, c.origRel, len(origLines)) && c.mirrored(p, 2)()
	})
	c.wantKeys(p)
}

// TestCopyOfMovedCopyKeysFoundAfterStateLoss (torture T27): a copy is moved while the
// daemon is stopped, and a copy of it is made. The copy of the copy begins with the
// lines of the moved copy's key, whose head names a path that is gone: it is offered
// that key (movedClashKey), which the moved copy, found by its checkpoint, holds. The
// loser of that claim took a key derived from the contested clash key (id~a~b), which
// no daemon finds again once the state directory is lost: the file then took another
// key while the old one's head kept naming its path (two heads on one path, recover
// refusing the one the harness paired). Each file keeps its key across the loss.
func TestCopyOfMovedCopyKeysFoundAfterStateLoss(t *testing.T) {
	c := newStoppedCopy(t, 97, 101)
	rng := rand.New(rand.NewPCG(103, 107))
	moved2Rel := "moved2/" + filepath.Base(c.orig.Path)
	moveFile(t, c.moved, filepath.Join(c.root, filepath.FromSlash(moved2Rel)))
	writeCopy(t, rng, c.cp, filepath.Join(c.root, "copy2", filepath.Base(c.orig.Path)))
	thirdRel := "copy2/" + filepath.Base(c.orig.Path)
	rels := []string{c.origRel, moved2Rel, thirdRel}

	// keys waits until each path has one head, and returns its key by path.
	keys := func(p *Publisher, what string) map[string]string {
		t.Helper()
		waitUntil(t, what, func() bool {
			if !c.mirrored(p, 3)() {
				return false
			}
			hs := c.heads(p)
			for _, rel := range rels {
				if len(hs[rel]) != 1 {
					return false
				}
			}
			return true
		})
		out := map[string]string{}
		for rel, hs := range c.heads(p) {
			for _, h := range hs {
				if id, ok := clashKeyID(h.Key); ok {
					if _, nested := clashKeyID(id); nested {
						t.Errorf("%s mirrors under %s, a key derived from a clash key", rel, h.Key)
					}
				}
				out[rel] = h.Key
			}
		}
		return out
	}
	p, stop := c.start()
	before := keys(p, "the three files mirrored, one head each")
	stop()

	c.stateDir = t.TempDir() // the state directory lost
	p, stop = c.start()
	defer stop()
	// The keys the daemon gave the files, each head written: then no head is behind.
	waitUntil(t, "the three files mirrored again, each under a key whose head names it", func() bool {
		if !c.mirrored(p, 3)() {
			return false
		}
		hs := c.heads(p)
		for _, rel := range rels {
			key, ok := keyAt(p, filepath.Join(c.root, filepath.FromSlash(rel)))
			if !ok || !slices.ContainsFunc(hs[rel], func(h mirror.Head) bool { return h.Key == key }) {
				return false
			}
		}
		return true
	})
	hs := c.heads(p)
	for _, rel := range rels {
		var got []string
		for _, h := range hs[rel] {
			got = append(got, h.Key)
		}
		if len(got) != 1 || got[0] != before[rel] {
			t.Errorf("after the state loss heads naming %s: %v; want only its key %s", rel, got, before[rel])
		}
	}
}

// keyAt is the conversation key the daemon mirrors the file at path under.
func keyAt(p *Publisher, path string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.files[p.byPath[path]]
	if st == nil {
		return "", false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.conv.Key, true
}
