package publisher

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

// TestSmallServerPayloadBackfillFlows pins issue 13 item 2: with a server max_payload of
// 64 KiB, below the blob threshold, lines of 100–300 KiB failed to publish, were retried
// every 200 ms for ever, and held the in-flight window so that every file stalled. Now
// the threshold is clamped to what the server accepts (headers included), such lines go
// the blob way in chunks the server takes, and a 60-session back-fill is mirrored whole,
// byte for byte, within the deadline.
func TestSmallServerPayloadBackfillFlows(t *testing.T) {
	const sessions = 60
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.RunWith(t, func(o *server.Options) { o.MaxPayload = 64 << 10 })
	root := t.TempDir()
	rng := rand.New(rand.NewPCG(21, 22))
	var files []*sessiontest.File
	for i := range sessions {
		f := sessiontest.New(rng, root, "/home/dev/p", sessiontest.Format(i%4))
		lines := [][]byte{f.HeaderLine("/home/dev/p"), f.Entry(400)}
		if f.Format != sessiontest.CLIV1 {
			lines = append(lines, f.ImageEntry((100+rng.IntN(200))<<10*3/4)) // base64: 100–300 KiB
		} else {
			lines = append(lines, f.Entry((100+rng.IntN(200))<<10))
		}
		lines = append(lines, f.Entry(60<<10), f.Entry(300)) // 60 KiB: under the threshold, over once headers count
		if err := f.Append(lines...); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	p := publisherAt(t, ctx, srv.URL())
	if got := p.opts.BlobThreshold; got >= 64<<10 {
		t.Errorf("blob threshold %d not clamped below the server's max_payload", got)
	}
	stop, _ := startWatcher(t, ctx, p, root)
	defer stop()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pr := p.Progress().Roots[root]
		if pr != nil && pr.Mirrored == sessions {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s: %+v", pr)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	waitHeads(t, ctx, p, root, files)
	checkBothMirrored(t, ctx, p.reader, root, files, "back-fill")
	if n := testutil.ToFloat64(p.m.blobs); n < sessions {
		t.Errorf("%v blobs stored, want at least %d", n, sessions)
	}
	if n := counted(t, p.m.failures); n != 0 {
		t.Errorf("%v publish failures counted, want none", n)
	}
}

// TestRefusedLineQuarantinedOthersFlow: a line the server refuses for good, whole and as
// a blob (here the stream's and the object store's max message sizes are below it), is
// quarantined: counted, listed with its file and line number, and passed over, while the
// lines after it and every other file are mirrored.
func TestRefusedLineQuarantinedOthersFlow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	p := publisherAt(t, ctx, srv.URL())
	for stream, limit := range map[string]int32{p.opts.Names.Stream(): 16 << 10, "OBJ_" + p.opts.Names.BlobsBucket(): 8 << 10} {
		s, err := p.opts.JS.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.MaxMsgSize = limit
		if _, err := p.opts.JS.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	rng := rand.New(rand.NewPCG(23, 24))
	var files []*sessiontest.File
	for i := range 10 {
		f := sessiontest.New(rng, root, "/home/dev/p", sessiontest.CLIV3)
		lines := [][]byte{f.HeaderLine("/home/dev/p"), f.Entry(400)}
		if i == 3 {
			lines = append(lines, f.Entry(40<<10))
		}
		lines = append(lines, f.Entry(300), f.Entry(500))
		if err := f.Append(lines...); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	stop, _ := startWatcher(t, ctx, p, root)
	defer stop()
	waitUntil(t, "every file mirrored but the refused line", func() bool {
		pr := p.Progress().Roots[root]
		return pr != nil && pr.Mirrored == len(files)
	})
	q := p.Quarantined()
	if len(q) != 1 || q[0].Path != files[3].Path || q[0].Line != 3 || q[0].Reason != "too_large" {
		t.Fatalf("quarantined %+v, want line 3 of %s, too_large", q, files[3].Path)
	}
	if n := testutil.ToFloat64(p.m.quarantined.WithLabelValues("too_large")); n != 1 {
		t.Errorf("quarantined lines counted %v, want 1", n)
	}
	// The file as the mirror holds it: everything but the quarantined line.
	bad := files[3]
	files[3] = &sessiontest.File{Path: bad.Path, ID: bad.ID, Lines: append(bad.Lines[:2:2], bad.Lines[3:]...)}
	waitHeads(t, ctx, p, root, files)
	checkBothMirrored(t, ctx, p.reader, root, files, "quarantine")
}

// waitHeads waits until the head of every file says it holds all of the file's lines
// (heads are written after the acknowledgements, at their own interval).
func waitHeads(t *testing.T, ctx context.Context, p *Publisher, root string, files []*sessiontest.File) {
	t.Helper()
	want := map[string]int64{}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f.Path)
		want[filepath.ToSlash(rel)] = int64(len(f.Lines))
	}
	waitUntil(t, "every head written", func() bool {
		heads, err := p.reader.Heads(ctx)
		if err != nil {
			return false
		}
		n := 0
		for _, h := range heads {
			if h.Root == root && want[h.Source] == h.Entries {
				n++
			}
		}
		return n == len(files)
	})
}

// publisherAt starts a publisher on the server at url with a fresh checkpoint store,
// closed when the test ends (within 10 s, even with lines still in flight).
func publisherAt(t *testing.T, ctx context.Context, url string) *Publisher {
	t.Helper()
	store := openStore(t, t.TempDir())
	t.Cleanup(func() { _ = store.Close() })
	p := startPublisher(t, ctx, url, store)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		p.Close(cctx)
	})
	return p
}
