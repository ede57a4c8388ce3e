package publisher

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// TestMovedCopyKeepsClashKeyAfterStateLoss (torture T15, guarantee 9 and §4): a session
// and its copy carry one id, the copy mirrored under its clash key (derived from its
// path in the second root). The copy is moved to the first root; its head follows it.
// Then the state directory is lost. The key derived from the copy's new path has no
// head: found before the original, the copy took the plain id, started a new generation
// over the original's conversation, and the original then took a new clash key (each
// key's conversation swapped files); found after it, the copy took a new clash key next
// to its old one. In either order each file must get back the key whose newest
// generation holds its lines, with no new generation.
func TestMovedCopyKeepsClashKeyAfterStateLoss(t *testing.T) {
	for _, copyFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("copy found first %v", copyFirst), func(t *testing.T) { movedCopyKeepsClashKey(t, copyFirst) })
	}
}

func movedCopyKeepsClashKey(t *testing.T, copyFirst bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	rng := rand.New(rand.NewPCG(71, 73))
	rootA, rootB, aside := t.TempDir(), t.TempDir(), t.TempDir()
	orig := newSession(t, rng, rootA, 300, 400)
	origRel, err := filepath.Rel(rootA, orig.Path)
	if err != nil {
		t.Fatal(err)
	}
	origRel = filepath.ToSlash(origRel)
	movedRel := "moved/" + filepath.Base(orig.Path)
	run := func(during func(p *Publisher)) map[string][]mirror.Head {
		return runWithoutState(t, ctx, srv.URL(), []string{rootA, rootB}, orig.ID, during)
	}
	mirrored := func(p *Publisher, root string, n int) func() bool {
		return func() bool {
			pr := p.Progress().Roots[root]
			return pr != nil && pr.Mirrored == n && pr.Pending == 0
		}
	}

	var clashKey string
	first := run(func(p *Publisher) {
		waitUntil(t, "the original mirrored", mirrored(p, rootA, 1))
		cp := writeCopy(t, rng, orig, filepath.Join(rootB, "copy", filepath.Base(orig.Path)))
		// Each file goes on its own way: the copy's lines are no longer the original's.
		if err := cp.Append(cp.Entry(200)); err != nil {
			t.Fatal(err)
		}
		if err := orig.Append(orig.Entry(250)); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the copy mirrored", mirrored(p, rootB, 1))
		waitUntil(t, "the original mirrored again", func() bool {
			hs := headsBySource(t, ctx, p, orig.ID, false)[origRel]
			return len(hs) == 1 && hs[0].LastOrdinal == 3
		})
		moveFile(t, cp.Path, filepath.Join(rootA, filepath.FromSlash(movedRel)))
		waitUntil(t, "the copy's head at its new path", func() bool {
			hs := headsBySource(t, ctx, p, orig.ID, false)[movedRel]
			if len(hs) == 1 {
				clashKey = hs[0].Key
			}
			return len(hs) == 1 && mirrored(p, rootA, 2)()
		})
	})
	if clashKey == orig.ID || len(first[origRel]) != 1 || first[origRel][0].Key != orig.ID {
		t.Fatalf("before the state was lost: heads %s", describeHeads(first))
	}

	// State lost; one file is found first, the other is out of the roots meanwhile.
	later := orig.Path
	if !copyFirst {
		later = filepath.Join(rootA, filepath.FromSlash(movedRel))
	}
	away := filepath.Join(aside, filepath.Base(later))
	moveFile(t, later, away)
	second := run(func(p *Publisher) {
		waitUntil(t, "the first file mirrored again", mirrored(p, rootA, 1))
		moveFile(t, away, later)
		waitUntil(t, "both mirrored", mirrored(p, rootA, 2))
	})
	want := map[string]string{origRel: orig.ID, movedRel: clashKey}
	for source, key := range want {
		hs := second[source]
		if len(hs) != 1 || hs[0].Key != key || hs[0].Generation != 1 {
			t.Errorf("after the state was lost: heads %s; want %s only under %s, generation 1",
				describeHeads(second), source, key)
			break
		}
	}
}

// runWithoutState runs a daemon on roots with a fresh state directory (as after the loss
// of the last one) while during runs, stops it, and returns the heads of conversation id
// by source.
func runWithoutState(t *testing.T, ctx context.Context, url string, roots []string, id string, during func(p *Publisher)) map[string][]mirror.Head {
	t.Helper()
	store := openStore(t, t.TempDir())
	p := startPublisher(t, ctx, url, store)
	_, stop := startWatcherWith(t, ctx, watcher.Options{Roots: roots, Sink: p, MoveGrace: 50 * time.Millisecond})
	during(p)
	stop()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_ = store.Close()
	return headsBySource(t, ctx, p, id, false)
}

// describeHeads lists heads by source, for failure messages.
func describeHeads(bySource map[string][]mirror.Head) string {
	var out []string
	for source, hs := range bySource {
		for _, h := range hs {
			out = append(out, fmt.Sprintf("%s: %s (generation %d)", source, h.Key, h.Generation))
		}
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

// TestCopyMovedBeforeItsHeadKeepsClashKey (torture seed 727543237586): a copy got its
// clash key and its head, then moved before the head followed it — the daemon was killed
// 0.3 s after the copy appeared, before its checkpoint was committed; here, moved while no
// daemon ran and started with a fresh state directory. The head still names the old
// path, where no file is; the key derived from the new path has nothing. The copy must
// get its clash key back (its lines begin the file), not a new one next to it, which left
// two keys rebuilding one file and recover refusing the older.
func TestCopyMovedBeforeItsHeadKeepsClashKey(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	rng := rand.New(rand.NewPCG(72, 74))
	rootA, rootB := t.TempDir(), t.TempDir()
	orig := newSession(t, rng, rootA, 300, 400)
	base := filepath.Base(orig.Path)
	origRel, err := filepath.Rel(rootA, orig.Path)
	if err != nil {
		t.Fatal(err)
	}
	origRel = filepath.ToSlash(origRel)
	copyRel, movedRel := "copy/"+base, "moved/"+base
	run := func(during func(p *Publisher)) map[string][]mirror.Head {
		return runWithoutState(t, ctx, srv.URL(), []string{rootA, rootB}, orig.ID, during)
	}
	mirrored := func(p *Publisher, root string) bool {
		pr := p.Progress().Roots[root]
		return pr != nil && pr.Mirrored == 1 && pr.Pending == 0
	}
	var clashKey string
	first := run(func(p *Publisher) {
		waitUntil(t, "the original mirrored", func() bool { return mirrored(p, rootA) })
		writeCopy(t, rng, orig, filepath.Join(rootB, filepath.FromSlash(copyRel)))
		waitUntil(t, "the copy's head", func() bool {
			hs := headsBySource(t, ctx, p, orig.ID, false)[copyRel]
			if len(hs) == 1 {
				clashKey = hs[0].Key
			}
			return len(hs) == 1 && mirrored(p, rootB)
		})
	})
	if clashKey == "" || clashKey == orig.ID || len(first[origRel]) != 1 || first[origRel][0].Key != orig.ID {
		t.Fatalf("before the move: heads %s", describeHeads(first))
	}
	moveFile(t, filepath.Join(rootB, filepath.FromSlash(copyRel)), filepath.Join(rootB, filepath.FromSlash(movedRel)))
	second := run(func(p *Publisher) {
		waitUntil(t, "both mirrored", func() bool { return mirrored(p, rootA) && mirrored(p, rootB) })
	})
	want := map[string]string{origRel: orig.ID, movedRel: clashKey}
	for source, key := range want {
		if hs := second[source]; len(hs) != 1 || hs[0].Key != key || hs[0].Generation != 1 {
			t.Fatalf("after the move: heads %s; want %s only under %s, generation 1", describeHeads(second), source, key)
		}
	}
	if hs := second[copyRel]; len(hs) != 0 {
		t.Fatalf("after the move: heads %s; none should name %s", describeHeads(second), copyRel)
	}
}
