package publisher

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

// TestLineBuffersReusedKeepTheirBytes: the buffer of a line's message goes back to a pool
// once its only publish is acknowledged (mirror.Outgoing.Release) and carries the next
// lines. With a window of 8 messages, each batch of lines is built in the buffers of the
// batch before it, across files read by concurrent workers, in the size classes lines of
// 0.1–6 KB fall into, and lines of 0.6–2.6 MB are read back into one reused buffer on
// their way to the object store: every line must still be mirrored with its own bytes.
func TestLineBuffersReusedKeepTheirBytes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	root := t.TempDir()
	rng := rand.New(rand.NewPCG(31, 32))
	var files []*sessiontest.File
	for i := range 6 {
		f := sessiontest.New(rng, root, "/home/dev/p", sessiontest.Format(i%4))
		lines := [][]byte{f.HeaderLine("/home/dev/p")}
		for k := range 100 {
			if k%40 == 20 {
				// Over the watcher's inline limit: read back whole (readAgain) into the
				// buffer the line before of this kind was read into, and sent as a blob.
				lines = append(lines, f.Entry(600<<10+rng.IntN(2<<20)))
				continue
			}
			lines = append(lines, f.Entry(100+rng.IntN(6000)))
		}
		if err := f.Append(lines...); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	store := openStore(t, t.TempDir())
	t.Cleanup(func() { _ = store.Close() })
	opts := testOptions(t, ctx, srv.URL())
	opts.Checkpoints, opts.WindowMessages = store, 8
	opts.CommitInterval, opts.HeadInterval = 20*time.Millisecond, 20*time.Millisecond
	p, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		p.Close(cctx)
	})
	stop, _ := startWatcher(t, ctx, p, root)
	defer stop()
	waitHeads(t, ctx, p, root, files)
	checkBothMirrored(t, ctx, p.reader, root, files, "reused buffers")
}
