package publisher

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/watcher"
)

// TestProgressCountsFilesBeingOpened (torture T23, seed 998058078928): a file whose Open
// is under way is not mirrored yet. A mirrored file moved to another root was opened at
// its new path just as the server went down; its Open waited about 5 s on a request the
// restart cut, and all the while /status.json counted the file's previous state, at its
// old path, fully acknowledged: no backlog, caught up. The harness took that for a quiet
// daemon and ran `verify`, whose pairing found a head naming the old path. A file being
// opened (reopened under a state, or found for the first time) now counts as pending,
// under the root it is opened at, its bytes as backlog until its lines are read again.
func TestProgressCountsFilesBeingOpened(t *testing.T) {
	ctx, p, _ := publisherOnServer(t)
	rootA, rootB := t.TempDir(), t.TempDir()
	rng := rand.New(rand.NewPCG(23, 998))
	f := sessiontest.New(rng, rootA, "/home/dev/p", sessiontest.CLIV3)
	if err := f.Append(f.HeaderLine("/home/dev/p"), f.Entry(300), f.Entry(400)); err != nil {
		t.Fatal(err)
	}
	stop, _ := startWatcher(t, ctx, p, rootA)
	waitUntil(t, "the file mirrored", func() bool {
		pr := p.Progress().Roots[rootA]
		return pr != nil && pr.Mirrored == 1 && pr.BacklogBytes == 0
	})
	stop()

	moved := filepath.Join(rootB, "moved", filepath.Base(f.Path))
	moveFile(t, f.Path, moved)
	size := int64(len(f.Content()))
	opening := watcher.File{ID: inode(t, moved), Root: rootB, Rel: "moved/" + filepath.Base(f.Path), Path: moved, Size: size}
	fresh := newSession(t, rng, rootB, 200, 300)
	freshSize := int64(len(fresh.Content()))
	found := watcher.File{ID: inode(t, fresh.Path), Root: rootB, Rel: filepath.Base(fresh.Path), Path: fresh.Path, Size: freshSize}

	p.beginOpen(opening) // the watcher's Open at the new path, under way
	p.beginOpen(found)   // and a file found for the first time
	pr := p.Progress()
	if a := pr.Roots[rootA]; a != nil && (a.Sessions != 0 || a.Mirrored != 0) {
		t.Errorf("old root while the moved file is opened elsewhere: %d sessions, %d mirrored; want none", a.Sessions, a.Mirrored)
	}
	b := pr.Roots[rootB]
	switch {
	case b == nil:
		t.Fatalf("while two files are opened under %s, progress has no entry for it", rootB)
	case b.Sessions != 2 || b.Pending != 2 || b.Mirrored != 0 || b.BacklogBytes != size+freshSize:
		t.Errorf("while two files are opened: %d sessions, %d pending, %d mirrored, %d bytes of backlog; want 2, 2, 0, %d",
			b.Sessions, b.Pending, b.Mirrored, b.BacklogBytes, size+freshSize)
	}
	p.endOpen(opening)
	p.endOpen(found)
	if a := p.Progress().Roots[rootA]; a == nil || a.Mirrored != 1 || a.BacklogBytes != 0 {
		t.Errorf("after the Opens ended (abandoned): %+v; want the file's state as before, mirrored", a)
	}
}
