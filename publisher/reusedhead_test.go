package publisher

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/watcher"
)

// TestHeadOfAFileOnAFreedInode: a session file is deleted and, within the watcher's move
// grace, a new session is written in another directory under the inode number it freed
// (ext4 hands it out again at once). The watcher reports the old file gone and the new
// one discovered; the new session's lines are mirrored and so must its head be.
func TestHeadOfAFileOnAFreedInode(t *testing.T) {
	ctx, p, _ := publisherOnServer(t)
	root := t.TempDir()
	_, stop := startWatcherWith(t, ctx, watcher.Options{Roots: []string{root}, Sink: p, MoveGrace: 2 * time.Second})
	defer stop()
	rng := rand.New(rand.NewPCG(3, 4))
	reused := 0
	for i := range 24 {
		old := sessiontest.New(rng, root, "/srv/a", sessiontest.Format(i%4))
		if err := old.Append(old.HeaderLine("/srv/a"), old.Entry(300)); err != nil {
			t.Fatal(err)
		}
		waitHead(t, ctx, p, old.ID, 1)
		if i%2 == 1 { // lines still in flight when the file goes
			if err := old.Append(old.Entry(900), old.Entry(50)); err != nil {
				t.Fatal(err)
			}
		}
		freed := inode(t, old.Path)
		if err := os.Remove(old.Path); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%4) * 8 * time.Millisecond) // where the watcher is in between varies
		nu := sessiontest.New(rng, root, "/srv/b", sessiontest.Format((i+1)%4))
		if err := os.MkdirAll(filepath.Dir(nu.Path), 0o755); err != nil {
			t.Fatal(err)
		}
		lines := [][]byte{nu.HeaderLine("/srv/b"), nu.Entry(200), nu.Entry(400), nu.Entry(100)}
		if err := sessiontest.AppendBytes(nu.Path, mirrortest.JoinLines(lines)); err != nil {
			t.Fatal(err)
		}
		if inode(t, nu.Path) == freed {
			reused++
		}
		waitHead(t, ctx, p, nu.ID, 3)
	}
	if reused == 0 {
		t.Skip("the file system never handed a freed inode number out again")
	}
	t.Logf("%d of 24 new sessions on a freed inode number", reused)
}

// waitHead waits until the head of conversation id says its last ordinal is last.
func waitHead(t *testing.T, ctx context.Context, p *Publisher, id string, last int64) {
	t.Helper()
	c, err := p.reader.Conv(id)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		h, _, err := p.reader.Head(ctx, c)
		if err == nil && h.LastOrdinal == last {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("head of %s: %+v, %v; want last ordinal %d", id, h, err, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
