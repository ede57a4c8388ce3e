package publisher

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/checkpoint"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// TestTruncatedPastUncommittedAckNewGeneration (torture T7): a daemon published a line
// and was killed before its checkpoint recorded the acknowledgement; the file was then
// cut back to the checkpoint (Pi's in-place rewrite without its last line). At the next
// start the file ends exactly where its checkpoint says, which proved the file mirrored,
// while the newest generation holds a line the file no longer has. A mirrored line that
// vanished locally starts a new generation, in the first generation and in later ones.
func TestTruncatedPastUncommittedAckNewGeneration(t *testing.T) {
	for _, rewrittenBefore := range []bool{false, true} {
		name := "generation 1"
		if rewrittenBefore {
			name = "generation 2"
		}
		t.Run(name, func(t *testing.T) { truncatedPastUncommittedAck(t, rewrittenBefore) })
	}
}

func truncatedPastUncommittedAck(t *testing.T, rewrittenBefore bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	root, stateDir := t.TempDir(), t.TempDir()
	rng := rand.New(rand.NewPCG(41, 43))
	f := sessiontest.New(rng, root, "/home/dev/p", sessiontest.CLIV3)
	if err := f.Append(f.HeaderLine("/home/dev/p"), f.Entry(300), f.Entry(400)); err != nil {
		t.Fatal(err)
	}
	// run starts a publisher on the state directory and a watcher, waits until the head
	// says generation gen with the file's lines, then stops both (a clean stop commits).
	run := func(what string, gen int, during func()) {
		t.Helper()
		runDaemon(t, ctx, srv.URL(), stateDir, watcher.Options{Roots: []string{root}, MoveGrace: 50 * time.Millisecond},
			f.ID, what, during, func(p *Publisher, c mirror.Conv) bool {
				h, _, err := p.reader.Head(ctx, c)
				return err == nil && h.Generation == gen && h.LastOrdinal == int64(len(f.Lines)-1)
			})
	}
	gen := 1
	run("the file mirrored", gen, nil)
	if rewrittenBefore {
		lines := append([][]byte(nil), f.Lines...)
		lines[1] = f.Entry(500) // another line of another length: a new generation
		if err := sessiontest.Rewrite(f.Path, lines); err != nil {
			t.Fatal(err)
		}
		f.Lines = lines
		gen++
		run("the rewrite mirrored", gen, nil)
	}
	store, before, ok := checkpointOf(t, stateDir, f.Path)
	if !ok || before.Generation != gen {
		t.Fatalf("checkpoint %+v (found %v), want generation %d", before, ok, gen)
	}
	_ = store.Close()

	// One more line acknowledged, then the daemon "dies" before its checkpoint says so.
	kept := append([][]byte(nil), f.Lines...)
	run("the appended line mirrored", gen, func() {
		if err := f.Append(f.Entry(300)); err != nil {
			t.Fatal(err)
		}
	})
	store = openStore(t, stateDir)
	store.Put(before)
	if err := store.Commit(); err != nil {
		t.Fatal(err)
	}
	_ = store.Close()
	// The file is cut back to where the checkpoint is, in place.
	if err := sessiontest.Rewrite(f.Path, kept); err != nil {
		t.Fatal(err)
	}
	f.Lines = kept
	run("a new generation without the vanished line", gen+1, nil)
}

// runDaemon starts a publisher on stateDir and a watcher with wopts (its sink the
// publisher), runs during once the first scan is done, waits until done holds for
// conversation id, then stops both: a clean stop commits the checkpoints.
func runDaemon(t *testing.T, ctx context.Context, url, stateDir string, wopts watcher.Options, id, what string,
	during func(), done func(p *Publisher, c mirror.Conv) bool) {
	t.Helper()
	store := openStore(t, stateDir)
	p := startPublisher(t, ctx, url, store)
	wopts.Sink = p
	w, stop := startWatcherWith(t, ctx, wopts)
	if during != nil {
		select { // what during does happens to a running daemon
		case <-w.Ready():
		case <-ctx.Done():
			t.Fatal("watcher not ready")
		}
		during()
	}
	c, err := p.reader.Conv(id)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, what, func() bool { return done(p, c) })
	stop()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkpointOf opens the checkpoint store in stateDir and returns it with the record of
// the file at path.
func checkpointOf(t *testing.T, stateDir, path string) (*checkpoint.Store, checkpoint.Record, bool) {
	t.Helper()
	store := openStore(t, stateDir)
	rec, ok := store.Get(checkpoint.Key(inodeOf(t, path)))
	return store, rec, ok
}

// inodeOf is the identity of the file at path, as the checkpoint store keys it.
func inodeOf(t *testing.T, path string) (dev, ino uint64) {
	t.Helper()
	id := inode(t, path)
	return id.Dev, id.Ino
}
