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
}

func mustAppendLines(t *testing.T, f *sessiontest.File, lines ...[]byte) {
	t.Helper()
	if err := f.Append(lines...); err != nil {
		t.Fatal(err)
	}
}
