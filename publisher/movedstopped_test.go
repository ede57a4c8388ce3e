package publisher

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// TestMovedWhileStoppedHeadFollows (torture seed 507967755, 3-node cluster): a mirrored
// file moved while no daemon ran (or while the next one was starting) is found at start
// by its checkpoint, under its key; its head must follow it to the new path, as it does
// for a move the daemon sees. It kept naming the old path until the file grew again, so
// `verify` reported the file not mirrored and `recover` would write it where it no
// longer is.
func TestMovedWhileStoppedHeadFollows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	rootA, rootB, stateDir := t.TempDir(), t.TempDir(), t.TempDir()
	f := sessiontest.New(rand.New(rand.NewPCG(50, 79)), rootA, "/home/dev/p", sessiontest.CLIV3)
	if err := f.Append(f.HeaderLine("/home/dev/p"), f.Entry(300), f.Entry(400)); err != nil {
		t.Fatal(err)
	}
	opts := watcher.Options{Roots: []string{rootA, rootB}}
	headAt := func(root, rel string) func(p *Publisher, c mirror.Conv) bool {
		return func(p *Publisher, c mirror.Conv) bool {
			h, _, err := p.reader.Head(ctx, c)
			return err == nil && h.LastOrdinal == 2 && h.Root == root && h.Source == rel
		}
	}
	rel, err := filepath.Rel(rootA, f.Path)
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, ctx, srv.URL(), stateDir, opts, f.ID, "the file mirrored", nil, headAt(rootA, filepath.ToSlash(rel)))
	for _, to := range []struct{ root, rel string }{
		{rootA, "moved/" + filepath.Base(f.Path)},     // within its root
		{rootB, "elsewhere/" + filepath.Base(f.Path)}, // to another root
	} {
		dst := filepath.Join(to.root, filepath.FromSlash(to.rel))
		moveFile(t, f.Path, dst)
		f.Path = dst
		runDaemon(t, ctx, srv.URL(), stateDir, opts, f.ID, "the head at "+to.rel, nil, headAt(to.root, to.rel))
	}
}
