package publisher

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/watcher"
)

// TestOpenReadsItsRegisteredStateUnderItsLock (locksordering.txt): once Open registers a
// file's state, other goroutines reach it and change it under its mutex (checkShrinks
// marks a changed shrink dirty, Gone marks the file deleted). Open read the state's head
// flag (and the numbers of its last log line) after registering it, without the mutex:
// a data race with such a writer. Here the writer is held to the moment between the
// registration and Open's next lock (the dirty set, which the test holds), where the race
// detector sees any unlocked read of the state that Open makes after registering it.
func TestOpenReadsItsRegisteredStateUnderItsLock(t *testing.T) {
	if !raceEnabled {
		t.Skip("the race detector is the check")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	p := publisherAt(t, ctx, srv.URL())
	root := t.TempDir()
	sf := sessiontest.New(rand.New(rand.NewPCG(27, 27)), root, "/home/dev/p", sessiontest.CLIV3)
	lines := [][]byte{sf.HeaderLine("/home/dev/p"), sf.Entry(300), sf.Entry(300)}
	if err := sf.Append(lines...); err != nil {
		t.Fatal(err)
	}
	f, fd := openForLines(t, ctx, p, root, sf.Path, lines[0])
	var off int64
	for ord, l := range lines {
		if err := p.Line(ctx, f, watcher.Line{Ordinal: int64(ord), Offset: off, Len: int64(len(l)), Data: l, Seen: time.Now(), Src: fd}); err != nil {
			t.Fatalf("line %d: %v", ord, err)
		}
		off += int64(len(l)) + 1
	}
	size := int64(len(mirrortest.JoinLines(lines)))
	old := p.state(f.ID)
	waitUntil(t, "every line acknowledged", func() bool {
		old.mu.Lock()
		defer old.mu.Unlock()
		return old.acked.Offset == size
	})

	// Moved: its acknowledged lines make its head follow the move (headDirty).
	moved := filepath.Join(root, "moved.jsonl")
	if err := os.Rename(sf.Path, moved); err != nil {
		t.Fatal(err)
	}
	f.Path, f.Rel = moved, "moved.jsonl"
	f.Lead = &watcher.Lead{Lines: [][]byte{lines[0]}}

	p.dirtyMu.Lock() // Open stops at its first mark of the registered state
	written := make(chan struct{})
	go func() {
		defer close(written)
		defer p.dirtyMu.Unlock()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if st := p.state(f.ID); st != nil && st != old {
				st.mu.Lock() // as noteShrink does for a changed shrink
				st.headDirty = true
				st.mu.Unlock()
				return
			}
		}
		t.Error("the moved file's state was never registered")
	}()
	if _, err := p.Open(ctx, f, watcher.Moved); err != nil {
		t.Fatal(err)
	}
	<-written
}
