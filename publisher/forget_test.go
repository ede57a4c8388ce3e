package publisher

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pisync/pisync/checkpoint"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/natstest"
	"github.com/pisync/pisync/session/sessiontest"
	"github.com/pisync/pisync/watcher"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDeletedFilesAreForgotten: a daemon that runs for months must not keep state for
// every file deleted meanwhile. A deleted session is recorded as deleted (its head says
// so) and then dropped from memory and from the checkpoint store, while it still counts
// as deleted; a deleted file that is not a session is dropped at once. Files that stay
// are untouched.
func TestDeletedFilesAreForgotten(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	nc := natstest.Connect(t, srv.URL())
	js, err := NewJetStream(nc, 5*time.Second, 64)
	if err != nil {
		t.Fatal(err)
	}
	names := mirror.DefaultNames()
	if err := mirror.Provision(ctx, js, names, mirror.Config{}); err != nil {
		t.Fatal(err)
	}
	owner, err := mirror.NewOwner("acme", "dev")
	if err != nil {
		t.Fatal(err)
	}
	store, _, err := checkpoint.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	p, err := New(ctx, Options{JS: js, Names: names, Owner: owner, Host: "h1", Checkpoints: store,
		CommitInterval: 20 * time.Millisecond, HeadInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	defer p.Close(context.Background())

	root := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 8))
	var files []*sessiontest.File
	for i := range 3 {
		f := sessiontest.New(rng, root, "/home/dev/p", sessiontest.Format(i%4))
		if err := f.Append(f.HeaderLine("/home/dev/p"), f.Entry(300), f.Entry(500)); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	notSession := filepath.Join(root, "notes.jsonl")
	if err := os.WriteFile(notSession, []byte("{\"hello\":1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := watcher.New(watcher.Options{Roots: []string{root}, Sink: p, MoveGrace: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	wdone := make(chan error, 1)
	go func() { wdone <- w.Run(wctx) }()
	defer func() {
		wcancel()
		<-wdone
	}()

	r := p.reader
	waitUntil(t, "every session mirrored, the other file skipped", func() bool {
		pr := p.Progress().Roots[root]
		return pr != nil && pr.Mirrored == 3 && pr.Skipped == 1
	})
	gone := files[0]
	ino := inode(t, gone.Path)
	waitUntil(t, "the file's checkpoint staged", func() bool {
		_, ok := store.Get(checkpoint.Key(ino.Dev, ino.Ino))
		return ok
	})
	for _, path := range []string{gone.Path, notSession} {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}

	waitUntil(t, "the deleted session and the other file forgotten", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.files) == 2 && len(p.byPath) == 2 && len(p.byConv) == 2 && len(p.goneFiles) == 0
	})
	if _, ok := store.Get(checkpoint.Key(ino.Dev, ino.Ino)); ok {
		t.Error("the deleted file's checkpoint record is still in the store")
	}
	c, err := r.Conv(gone.ID)
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := r.Head(ctx, c)
	if err != nil || !h.LocalDeleted || h.Entries != 3 {
		t.Errorf("head of the deleted file: %+v, %v; want it marked deleted with 3 entries", h, err)
	}
	pr := p.Progress().Roots[root]
	if pr.Deleted != 1 || pr.Sessions != 2 || pr.Mirrored != 2 || pr.Skipped != 0 {
		t.Errorf("progress after the deletions: %+v", *pr)
	}
	for _, f := range files[1:] {
		id := inode(t, f.Path)
		if _, ok := store.Get(checkpoint.Key(id.Dev, id.Ino)); !ok {
			t.Errorf("%s: checkpoint lost", f.Path)
		}
	}
}

func inode(t *testing.T, path string) watcher.FileID {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return watcher.FileID{Dev: uint64(st.Dev), Ino: st.Ino}
}

// waitUntil polls cond until it holds, failing the test after 20 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
