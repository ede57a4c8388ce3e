package publisher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/store"
	"github.com/pisync/pisync/watcher"
)

// cutOver is a daemon (publisher and watcher) mirroring one local session, and the
// session store on the same mirror: the two writers of DESIGN §8's one-writer rule.
type cutOver struct {
	t      *testing.T
	ctx    context.Context
	url    string
	root   string
	cpDir  string
	file   *sessiontest.File
	conv   mirror.Conv
	owner  mirror.Owner
	store  *store.Store
	reader *mirror.Reader

	cp     *checkpoint.Store
	pub    *Publisher
	stop   func()
	n      int // store entries appended so far
	window int // the daemon's WindowMessages (0: the default)
}

func newCutOver(t *testing.T, seed uint64) *cutOver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	srv := natstest.Run(t)
	c := &cutOver{t: t, ctx: ctx, url: srv.URL(), root: t.TempDir(), cpDir: t.TempDir()}
	opts := testOptions(t, ctx, c.url) // provisions the mirror
	c.owner = opts.Owner
	js, err := jetstream.New(natstest.Connect(t, c.url))
	if err != nil {
		t.Fatal(err)
	}
	if c.store, err = store.New(ctx, js, opts.Names, store.Options{}); err != nil {
		t.Fatal(err)
	}
	if c.reader, err = mirror.NewReader(ctx, js, opts.Names, opts.Owner); err != nil {
		t.Fatal(err)
	}
	c.file = sessiontest.New(rand.New(rand.NewPCG(seed, 1)), c.root, "/home/dev/p", sessiontest.CLIV3)
	if err := c.file.Append(c.file.HeaderLine("/home/dev/p"), c.file.Message(200), c.file.Message(300)); err != nil {
		t.Fatal(err)
	}
	if c.conv, err = mirror.NewConv(c.owner, c.file.ID); err != nil {
		t.Fatal(err)
	}
	return c
}

// startDaemon starts a publisher and a watcher on the checkpoint directory, as `pisync
// run` does (Reopen bound to the watcher).
func (c *cutOver) startDaemon() {
	c.t.Helper()
	d := startDaemonAt(c.t, c.ctx, c.url, c.root, c.cpDir, "h1", c.window)
	c.cp, c.pub, c.stop = d.cp, d.pub, d.close
	c.t.Cleanup(c.stopDaemon)
}

func (c *cutOver) stopDaemon() {
	if c.pub == nil {
		return
	}
	c.stop()
	c.pub = nil
}

// storeAppend appends an entry through the session store on expected; it returns the
// entry's id, or the error code.
func (c *cutOver) storeAppend(expected string) (string, string) {
	c.n++
	id := fmt.Sprintf("5707e%03d", c.n)
	line := fmt.Sprintf(`{"type":"message","id":%q,"parentId":%q,"timestamp":"2026-12-01T18:00:%02d.000Z","message":{"role":"user","content":"from the store %d"}}`,
		id, expected, c.n%60, c.n)
	if _, e := c.store.Append(c.ctx, c.owner, c.file.ID, expected, []byte(line)); e != nil {
		return "", e.Code
	}
	return id, ""
}

// localAppend appends n entries to the local file as Pi still running on it would.
func (c *cutOver) localAppend(n int) {
	c.t.Helper()
	for range n {
		if err := c.file.Append(c.file.Message(150)); err != nil {
			c.t.Fatal(err)
		}
	}
}

// gens reads the conversation's lines by generation, in stream order.
func (c *cutOver) gens() map[int][]mirror.Msg {
	c.t.Helper()
	out := map[int][]mirror.Msg{}
	err := c.reader.Scan(c.ctx, c.conv, mirror.ScanOptions{HeadersOnly: true}, func(m mirror.Msg) error {
		out[m.Generation] = append(out[m.Generation], m)
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// holdsFile reports whether generation msgs holds exactly the local file's lines.
func (c *cutOver) holdsFile(msgs []mirror.Msg) bool {
	if len(msgs) != len(c.file.Lines) {
		return false
	}
	byOrd := map[int64]string{}
	for _, m := range msgs {
		byOrd[m.Ordinal] = m.SHA256
	}
	for i, l := range c.file.Lines {
		sum := sha256.Sum256(l)
		if byOrd[int64(i)] != hex.EncodeToString(sum[:]) {
			return false
		}
	}
	return true
}

// waitFileGeneration waits until generation gen holds the local file line for line.
func (c *cutOver) waitFileGeneration(gen int) {
	c.t.Helper()
	waitUntil(c.t, fmt.Sprintf("generation %d holding the local file", gen), func() bool {
		return c.holdsFile(c.gens()[gen])
	})
}

// checkOneWriter checks DESIGN §8 on the stream: in every generation each ordinal is
// written once, and in the generation the store writes, no line of the daemon follows
// the store's first line.
func (c *cutOver) checkOneWriter() {
	c.t.Helper()
	h, _, err := c.reader.Head(c.ctx, c.conv)
	if err != nil {
		c.t.Fatal(err)
	}
	if !h.StoreWrites() {
		c.t.Fatalf("head %+v: not the store's", h)
	}
	for gen, msgs := range c.gens() {
		seen := map[int64]mirror.Msg{}
		for _, m := range msgs {
			if prev, dup := seen[m.Ordinal]; dup && prev.SHA256 != m.SHA256 {
				c.t.Errorf("generation %d: ordinal %d written twice, by %s (entry %s) and %s (entry %s)",
					gen, m.Ordinal, prev.Host, prev.EntryID, m.Host, m.EntryID)
			}
			seen[m.Ordinal] = m
		}
		if gen != h.Generation {
			continue
		}
		first := int64(-1)
		for _, m := range msgs {
			if m.Host == "pisync-store" && (first < 0 || m.Ordinal < first) {
				first = m.Ordinal
			}
		}
		for _, m := range msgs {
			if first >= 0 && m.Host != "pisync-store" && m.Ordinal > first {
				c.t.Errorf("generation %d the store writes: the daemon's line %d (entry %s) after the store's first line %d",
					gen, m.Ordinal, m.EntryID, first)
			}
		}
	}
}

func (c *cutOver) head() mirror.Head {
	c.t.Helper()
	h, _, err := c.reader.Head(c.ctx, c.conv)
	if err != nil {
		c.t.Fatal(err)
	}
	return h
}

// TestStoreAppendThenLocalAppend: the daemon tails a file whose conversation the store
// has appended to. Lines Pi then still appends to the file are mirrored as a new
// generation of the whole file; the store's generation keeps its lines and its head,
// and the head records the file's generation apart (Local).
func TestStoreAppendThenLocalAppend(t *testing.T) {
	c := newCutOver(t, 1)
	c.startDaemon()
	c.waitFileGeneration(1)
	waitUntil(t, "the daemon's head", func() bool { h, _, err := c.reader.Head(c.ctx, c.conv); return err == nil && h.LastOrdinal == 2 })
	s1, code := c.storeAppend(c.file.Leaf())
	if code != "" {
		t.Fatalf("store append: %s", code)
	}
	c.localAppend(2)
	c.waitFileGeneration(2)
	waitUntil(t, "the file's generation recorded in the store's head", func() bool {
		h := c.head()
		return h.Local != nil && h.Local.Generation == 2 && h.Local.Entries == int64(len(c.file.Lines))
	})
	h := c.head()
	if h.Generation != 1 || h.Head != s1 || h.Writer != mirror.WriterStore {
		t.Errorf("head generation %d head %q writer %q; want the store's: 1, %q", h.Generation, h.Head, h.Writer, s1)
	}
	if g1 := c.gens()[1]; len(g1) != 4 {
		t.Errorf("the store's generation holds %d lines, want the 3 mirrored and the store's", len(g1))
	}
	// The store goes on extending its generation, and the file its own.
	if _, code := c.storeAppend(s1); code != "" {
		t.Fatalf("second store append: %s", code)
	}
	c.localAppend(1)
	c.waitFileGeneration(2)
	c.checkOneWriter()
}

// TestRestartAfterCutOver: the daemon is stopped, the store appends, and the daemon
// starts again from its checkpoint: with the file unchanged it publishes nothing; once Pi
// appends to the file, the file goes to a new generation.
func TestRestartAfterCutOver(t *testing.T) {
	for _, appendWhileStopped := range []bool{false, true} {
		t.Run(fmt.Sprintf("local append while stopped %v", appendWhileStopped), func(t *testing.T) {
			c := newCutOver(t, 2)
			c.startDaemon()
			c.waitFileGeneration(1)
			c.stopDaemon()
			if _, code := c.storeAppend(c.file.Leaf()); code != "" {
				t.Fatalf("store append: %s", code)
			}
			if appendWhileStopped {
				c.localAppend(1)
			}
			c.startDaemon()
			if !appendWhileStopped {
				waitUntil(t, "the file seen again", func() bool {
					pr := c.pub.Progress().Roots[c.root]
					return pr != nil && pr.Mirrored == 1
				})
				if g := c.gens(); len(g) != 1 || len(g[1]) != 4 {
					t.Fatalf("after a restart with the file unchanged: generations %v, want generation 1 alone with 4 lines", lens(g))
				}
				c.localAppend(1)
			}
			c.waitFileGeneration(2)
			c.checkOneWriter()
		})
	}
}

// TestLocalAndStoreAppendsInterleaved: the two orders of a local append and a store
// append on one head, and the two at once. Whichever lands first, the store's generation
// is one chain in which no line of the file follows the store's, and the file ends up
// whole in a generation of its own once it has lines the store's generation lacks.
func TestLocalAndStoreAppendsInterleaved(t *testing.T) {
	t.Run("local first", func(t *testing.T) {
		c := newCutOver(t, 3)
		c.startDaemon()
		c.waitFileGeneration(1)
		before := c.file.Leaf()
		c.localAppend(1) // mirrored into generation 1: the store has not written it yet
		c.waitFileGeneration(1)
		if _, code := c.storeAppend(before); code != store.CodeConflict {
			t.Fatalf("store append on the head before the local line: code %q, want conflict", code)
		}
		if _, code := c.storeAppend(c.file.Leaf()); code != "" {
			t.Fatalf("store append on the new head: %s", code)
		}
		c.localAppend(1)
		c.waitFileGeneration(2)
		c.checkOneWriter()
	})
	t.Run("at once", func(t *testing.T) {
		for round := range 4 {
			c := newCutOver(t, uint64(10+round))
			c.startDaemon()
			c.waitFileGeneration(1)
			leaf := c.file.Leaf()
			var wg sync.WaitGroup
			var code string
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, code = c.storeAppend(leaf)
			}()
			c.localAppend(1)
			wg.Wait()
			if code != "" && code != store.CodeConflict {
				t.Fatalf("round %d: store append: %s", round, code)
			}
			if code == store.CodeConflict { // the local line landed first: continue on it
				if _, code = c.storeAppend(c.file.Leaf()); code != "" {
					t.Fatalf("round %d: store append on the new head: %s", round, code)
				}
			}
			c.localAppend(1)
			waitUntil(t, "the file mirrored whole in the newest generation", func() bool {
				g := c.gens()
				newest := 0
				for n := range g {
					newest = max(newest, n)
				}
				return newest > 1 && c.holdsFile(g[newest])
			})
			c.checkOneWriter()
			c.stopDaemon()
			if t.Failed() {
				return
			}
		}
	})
}

func lens(g map[int][]mirror.Msg) map[int]int {
	out := map[int]int{}
	for n, msgs := range g {
		out[n] = len(msgs)
	}
	return out
}

// startWatcherFor watches root for p and returns the watcher; stop waits for it to end.
func startWatcherFor(t *testing.T, ctx context.Context, p *Publisher, root string) (*watcher.Watcher, func()) {
	t.Helper()
	return startWatcherWith(t, ctx, watcher.Options{Roots: []string{root}, Sink: p, MoveGrace: 50 * time.Millisecond})
}

// startWatcherWith runs a watcher with opts; stop waits for it to end.
func startWatcherWith(t *testing.T, ctx context.Context, opts watcher.Options) (*watcher.Watcher, func()) {
	t.Helper()
	w, err := watcher.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	return w, func() { wcancel(); <-done }
}
