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

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats.go v1.55.0: each object store Put (a blob) makes a JetStream context whose
		// deferred cleanup can clear the channel this goroutine waits on before it has
		// read it (see cmd/pisync's TestMain). A leaked connection is still caught.
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

// TestDeletedFilesAreForgotten: a daemon that runs for months must not keep state for
// every file deleted meanwhile. A deleted session is recorded as deleted (its head says
// so) and then dropped from memory and from the checkpoint store, while it still counts
// as deleted; a deleted file that is not a session is dropped at once. Files that stay
// are untouched.
func TestDeletedFilesAreForgotten(t *testing.T) {
	ctx, p, store := publisherOnServer(t)

	root := t.TempDir()
	files := writeFiles(t, root, 3)
	notSession := filepath.Join(root, "notes.jsonl")
	if err := os.WriteFile(notSession, []byte("{\"hello\":1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stopWatcher, _ := startWatcher(t, ctx, p, root)
	defer stopWatcher()

	r := p.reader
	waitUntil(t, "every session mirrored, the other file skipped", func() bool {
		pr := p.Progress().Roots[root]
		return pr != nil && pr.Mirrored == 3 && pr.Skipped == 1
	})
	moved := files[2]
	newPath := filepath.Join(root, "elsewhere", filepath.Base(moved.Path))
	if err := os.MkdirAll(filepath.Dir(newPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(moved.Path, newPath); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the moved file known at its new path only", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		_, old := p.byPath[moved.Path]
		_, now := p.byPath[newPath]
		return !old && now
	})
	p.mu.Lock()
	claim, id := p.byConv[moved.ID], inode(t, newPath)
	p.mu.Unlock()
	if claim != id {
		t.Errorf("the moved file's conversation is claimed by %v, want %v (guarantee 9)", claim, id)
	}
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
	for _, path := range []string{files[1].Path, newPath} {
		id := inode(t, path)
		if _, ok := store.Get(checkpoint.Key(id.Dev, id.Ino)); !ok {
			t.Errorf("%s: checkpoint lost", path)
		}
	}
}

// TestForgottenFileComesBackOnce: a session moved out of the roots is forgotten,
// checkpoint included; moved back with a line more, it resumes from the mirror, which
// then holds each of its lines once (guarantee 2), and its head no longer says deleted.
func TestForgottenFileComesBackOnce(t *testing.T) {
	ctx, p, store := publisherOnServer(t)
	root, outside := t.TempDir(), t.TempDir()
	f := writeFiles(t, root, 1)[0]
	stopWatcher, _ := startWatcher(t, ctx, p, root)
	defer stopWatcher()
	waitUntil(t, "the session mirrored", func() bool {
		pr := p.Progress().Roots[root]
		return pr != nil && pr.Mirrored == 1
	})
	id := inode(t, f.Path)
	waitUntil(t, "the file's checkpoint staged", func() bool {
		_, ok := store.Get(checkpoint.Key(id.Dev, id.Ino))
		return ok
	})

	inRoot := f.Path
	f.Path = filepath.Join(outside, filepath.Base(inRoot))
	if err := os.Rename(inRoot, f.Path); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the file forgotten, checkpoint included", func() bool {
		_, ok := store.Get(checkpoint.Key(id.Dev, id.Ino))
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.files) == 0 && !ok
	})
	if err := f.Append(f.Entry(400)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(f.Path, inRoot); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the file back and mirrored", func() bool {
		pr := p.Progress().Roots[root]
		return pr != nil && pr.Mirrored == 1
	})

	c, err := p.reader.Conv(f.ID)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]int{}
	if err := p.reader.Scan(ctx, c, mirror.ScanOptions{}, func(m mirror.Msg) error {
		seen[m.Ordinal]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 4 {
		t.Errorf("the mirror holds ordinals %v, want 0 to 3", seen)
	}
	for ord, n := range seen {
		if n != 1 {
			t.Errorf("line %d is in the stream %d times", ord+1, n)
		}
	}
	waitUntil(t, "the head no longer says deleted", func() bool {
		h, _, err := p.reader.Head(ctx, c)
		return err == nil && !h.LocalDeleted && h.Entries == 4
	})
}

func inode(t *testing.T, path string) watcher.FileID {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return watcher.FileID{Dev: uint64(st.Dev), Ino: st.Ino}
}

// waitUntil polls cond until it holds, failing the test after 60 s: a 3-node cluster
// whose node just came back can take 20 s and more to answer under -race on a loaded
// machine (TestResumeFromLaggingReplicaResendsNothing), and a passing test never waits it.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPruneCheckpointsDeletedWhileStopped: a session deleted while the daemon was
// stopped is found after the next first scan: its head is marked deleted and its
// checkpoint removed. The records of files still there, and of a root not watched, stay.
func TestPruneCheckpointsDeletedWhileStopped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	stateDir, root := t.TempDir(), t.TempDir()
	files := writeFiles(t, root, 3)
	keys := make([]string, len(files))
	for i, f := range files {
		id := inode(t, f.Path)
		keys[i] = checkpoint.Key(id.Dev, id.Ino)
	}

	// First run: everything mirrored, then stopped.
	store := openStore(t, stateDir)
	p := startPublisher(t, ctx, srv.URL(), store)
	stopWatcher, _ := startWatcher(t, ctx, p, root)
	waitUntil(t, "every session mirrored", func() bool {
		pr := p.Progress().Roots[root]
		return pr != nil && pr.Mirrored == 3
	})
	stopWatcher()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	elsewhere := checkpoint.Record{Dev: 1, Ino: 2, Root: filepath.Join(root, "not-watched"), Rel: "x.jsonl",
		ConvKey: files[1].ID, StreamSeq: 1}
	store.Put(elsewhere)
	if err := store.Commit(); err != nil {
		t.Fatal(err)
	}
	store.Close()
	if err := os.Remove(files[0].Path); err != nil {
		t.Fatal(err)
	}

	// Second run: the deletion is found after the first scan.
	store = openStore(t, stateDir)
	defer store.Close()
	p = startPublisher(t, ctx, srv.URL(), store)
	defer p.Close(context.Background())
	stopWatcher, ready := startWatcher(t, ctx, p, root)
	defer stopWatcher()
	<-ready
	n, err := p.PruneCheckpoints(ctx, []string{root, elsewhere.Root})
	if err != nil || n != 1 {
		t.Fatalf("PruneCheckpoints = %d, %v; want 1 record removed", n, err)
	}
	if err := store.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, ok := store.Get(keys[0]); ok {
		t.Error("the deleted file's checkpoint is still in the store")
	}
	for _, k := range append(keys[1:], elsewhere.Key()) {
		if _, ok := store.Get(k); !ok {
			t.Errorf("checkpoint %s was removed", k)
		}
	}
	for i, f := range files {
		c, err := p.reader.Conv(f.ID)
		if err != nil {
			t.Fatal(err)
		}
		h, _, err := p.reader.Head(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if want := i == 0; h.LocalDeleted != want {
			t.Errorf("%s: head says deleted %v, want %v", f.Path, h.LocalDeleted, want)
		}
	}
	if n, err := p.PruneCheckpoints(ctx, []string{root}); err != nil || n != 0 {
		t.Errorf("second PruneCheckpoints = %d, %v; want nothing left to remove", n, err)
	}
}

// publisherOnServer starts a publisher (see startPublisher) on a fresh server with a
// fresh checkpoint store, closed when the test ends, and a context for the test.
func publisherOnServer(t *testing.T) (context.Context, *Publisher, *checkpoint.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	srv := natstest.Run(t)
	store := openStore(t, t.TempDir())
	t.Cleanup(func() { _ = store.Close() }) // after the publisher's last commit
	p := startPublisher(t, ctx, srv.URL(), store)
	t.Cleanup(func() { p.Close(context.Background()) })
	return ctx, p, store
}

func openStore(t *testing.T, dir string) *checkpoint.Store {
	t.Helper()
	store, _, err := checkpoint.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// startPublisher starts a publisher for owner acme/dev on host h1, with short commit and
// head intervals, against a provisioned mirror on the server at url.
func startPublisher(t *testing.T, ctx context.Context, url string, store *checkpoint.Store) *Publisher {
	t.Helper()
	opts := testOptions(t, ctx, url)
	opts.Checkpoints = store
	opts.CommitInterval, opts.HeadInterval = 20*time.Millisecond, 20*time.Millisecond
	p, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	return p
}

// testOptions are the options of a publisher for owner acme/dev on host h1 against a
// provisioned mirror on the server at url, without a checkpoint store.
func testOptions(t testing.TB, ctx context.Context, url string) Options {
	t.Helper()
	nc := natstest.Connect(t, url)
	js, err := NewJetStream(nc, 5*time.Second, 64)
	if err != nil {
		t.Fatal(err)
	}
	names := mirror.DefaultNames()
	mirrortest.Provision(t, ctx, js, names, mirror.Config{})
	owner, err := mirror.NewOwner("acme", "dev")
	if err != nil {
		t.Fatal(err)
	}
	return Options{JS: js, Names: names, Owner: owner, Host: "h1", AckTimeout: 5 * time.Second}
}

// startWatcher watches root for p; stop waits for the watcher to end.
func startWatcher(t *testing.T, ctx context.Context, p *Publisher, root string) (stop func(), ready <-chan struct{}) {
	t.Helper()
	w, stop := startWatcherFor(t, ctx, p, root)
	return stop, w.Ready()
}

// writeFiles writes n sessions of a header and two entries under root.
func writeFiles(t *testing.T, root string, n int) []*sessiontest.File {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 8))
	var files []*sessiontest.File
	for i := range n {
		f := sessiontest.New(rng, root, "/home/dev/p", sessiontest.Format(i%4))
		if err := f.Append(f.HeaderLine("/home/dev/p"), f.Entry(300), f.Entry(500)); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}
