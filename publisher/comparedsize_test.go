package publisher

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// TestTruncatedWithinComparedLinesNewGeneration (torture T22, seed 88862246953): the
// watcher reopens a file at the size it found (here in the middle of Pi's in-place
// rewrite of the same lines), and measures any later truncation against that size. Open
// compared the whole file with the mirror as it was by then, the rewrite finished: every
// mirrored line in place, so they were held as mirrored. The file was then cut back to
// fewer lines than that comparison saw, but not below the size the watcher knew: the
// watcher read on as if the file had grown, every line it found was held, and the
// newest generation kept lines the file no longer has. Open must judge the file at the
// size the watcher announced, the one its truncations are measured against.
func TestTruncatedWithinComparedLinesNewGeneration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	p := publisherAt(t, ctx, srv.URL())
	root := t.TempDir()
	sf := sessiontest.New(rand.New(rand.NewPCG(22, 22)), root, "/home/dev/p", sessiontest.CLIV3)
	lines := [][]byte{sf.HeaderLine("/home/dev/p")}
	for range 5 {
		lines = append(lines, sf.Entry(300))
	}
	if err := sf.Append(lines...); err != nil {
		t.Fatal(err)
	}
	f, fd := openForLines(t, ctx, p, root, sf.Path, lines[0])
	sizeOf := func(lines [][]byte) int64 { return int64(len(mirrortest.JoinLines(lines))) }
	deliver := func(f watcher.File, from, to int) {
		t.Helper()
		off := sizeOf(lines[:from])
		for ord := from; ord < to; ord++ {
			l := lines[ord]
			if err := p.Line(ctx, f, watcher.Line{Ordinal: int64(ord), Offset: off, Len: int64(len(l)), Data: l, Seen: time.Now(), Src: fd}); err != nil {
				t.Fatalf("line %d: %v", ord, err)
			}
			off += int64(len(l)) + 1
		}
	}
	c, err := p.reader.Conv(sf.ID)
	if err != nil {
		t.Fatal(err)
	}
	// waitHead waits until the head says generation gen ends at ordinal last; else it
	// reports what the newest generation in the stream holds.
	waitHead := func(what string, gen int, last int64) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if h, _, err := p.reader.Head(ctx, c); err == nil && h.Generation == gen && h.LastOrdinal == last {
				return
			}
		}
		var nw newest
		if err := p.reader.Scan(ctx, c, mirror.ScanOptions{HeadersOnly: true}, nw.add); err != nil {
			t.Fatal(err)
		}
		t.Fatalf("%s: the newest generation is %d with %d lines; want generation %d with %d", what, nw.gen, nw.genMsgs, gen, last+1)
	}
	deliver(f, 0, len(lines))
	waitHead("the file mirrored", 1, 5)

	// Pi rewrites the file in place with the same lines; the watcher finds it at 3 lines
	// and reopens it, by when the rewrite is done.
	f.Size = sizeOf(lines[:3])
	if _, err := p.Open(ctx, f, watcher.Truncated); err != nil {
		t.Fatal(err)
	}
	deliver(f, 0, 3)
	// Then the file is cut back in place to 4 lines: more than the watcher knew of, fewer
	// than the mirror holds. The watcher reads the fourth line as new.
	lines = lines[:4]
	mirrortest.WriteFile(t, sf.Path, mirrortest.JoinLines(lines))
	f.Size = sizeOf(lines)
	deliver(f, 3, 4)
	waitHead("the file cut back to 4 lines", 2, 3)
}
