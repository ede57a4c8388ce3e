package publisher

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/mirrortest"
	"github.com/pisync/pisync/internal/natstest"
	"github.com/pisync/pisync/internal/sessiontest"
	"github.com/pisync/pisync/watcher"
)

// TestShiftedLongLineIsReopen (torture T20, seed 973639266386): a line too long to be
// handed over inline is read again by the sink from the watcher's descriptor. Pi
// rewrote the file in place with an earlier line one byte shorter between the two reads:
// the section at the line's offset was still full length, one byte early, and was
// mirrored as a line no file ever held. The re-read section must still be bounded by
// newlines, or the file is reopened.
func TestShiftedLongLineIsReopen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	p := publisherAt(t, ctx, srv.URL())
	root := t.TempDir()
	sf := sessiontest.New(rand.New(rand.NewPCG(20, 20)), root, "/home/dev/p", sessiontest.CLIV3)
	lines := [][]byte{sf.HeaderLine("/home/dev/p"), sf.Message(300), sf.Message(100 << 10)}
	if err := sf.Append(lines...); err != nil {
		t.Fatal(err)
	}
	f, fd := openForLines(t, ctx, p, root, sf.Path, lines[0])
	off := int64(0)
	for ord, l := range lines[:2] {
		if err := p.Line(ctx, f, watcher.Line{Ordinal: int64(ord), Offset: off, Len: int64(len(l)), Data: l, Seen: time.Now(), Src: fd}); err != nil {
			t.Fatalf("line %d: %v", ord, err)
		}
		off += int64(len(l)) + 1
	}
	// In place (same inode, the watcher's descriptor sees it): line 2 one byte shorter.
	n := len(lines[1])
	shorter := append(bytes.Clone(lines[1][:n-2]), lines[1][n-1]) // one byte before its end dropped
	mirrortest.WriteFile(t, sf.Path, mirrortest.JoinLines([][]byte{lines[0], shorter, lines[2]}))
	long := watcher.Line{Ordinal: 2, Offset: off, Len: int64(len(lines[2])), Seen: time.Now(), Src: fd}
	if err := p.Line(ctx, f, long); !errors.Is(err, watcher.ErrReopen) {
		t.Fatalf("a long line read again one byte early: %v, want ErrReopen", err)
	}
}

// openForLines opens the session file at path under root for p as the watcher would
// (Discovered), for a test that then hands p its lines itself; the descriptor is the
// lines' Src.
func openForLines(t *testing.T, ctx context.Context, p *Publisher, root, path string, header []byte) (watcher.File, *os.File) {
	t.Helper()
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fd.Close() })
	info, err := fd.Stat()
	if err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(root, path)
	f := watcher.File{Root: root, Rel: filepath.ToSlash(rel), Path: path, ID: inode(t, path), Header: header, Size: info.Size()}
	if _, err := p.Open(ctx, f, watcher.Discovered); err != nil {
		t.Fatal(err)
	}
	return f, fd
}
