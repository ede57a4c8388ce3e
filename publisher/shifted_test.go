package publisher

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/watcher"
)

// TestShiftedLongLineIsReopen (torture T20, seed 973639266386): a line too long to be
// handed over inline is read again by the sink from the watcher's descriptor. Pi
// rewrote the file in place with an earlier line one byte shorter between the two reads:
// the section at the line's offset was still full length, one byte early, and was
// mirrored as a line no file ever held. The re-read section must still have the digest
// the watcher took as it read the line, or the file is reopened.
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
	sum := sha256.Sum256(lines[2]) // what the watcher read
	long := watcher.Line{Ordinal: 2, Offset: off, Len: int64(len(lines[2])), Seen: time.Now(), Src: fd, SHA256: &sum}
	if err := p.Line(ctx, f, long); !errors.Is(err, watcher.ErrReopen) {
		t.Fatalf("a long line read again one byte early: %v, want ErrReopen", err)
	}
}

// TestRewrittenLongLineIsReopen (torture T20, the part d281db1 left open): a line too
// long to be handed over inline has its middle rewritten in place, same length, between
// the watcher's read and the sink's re-read. The section is still bounded by newlines;
// only the digest the watcher took while reading tells that it holds other bytes, and
// the file must be reopened rather than the new bytes mirrored under the line the
// watcher delivered. One case per way the publisher reads such a line again: whole
// (published inline, or above the blob threshold) and, above the longest line it holds
// in memory, digested in chunks.
func TestRewrittenLongLineIsReopen(t *testing.T) {
	sizes := []struct {
		name string
		size int
	}{
		{"read whole, inline message", 100 << 10},
		{"read whole, blob", 600 << 10},
		{"digested in chunks, blob", session.MaxBufferedLine + 64<<10},
	}
	for _, sz := range sizes {
		// The lines once per size (a 16 MiB message takes seconds to make under -race);
		// each case writes them into a root of its own.
		genRoot := t.TempDir()
		sf := sessiontest.New(rand.New(rand.NewPCG(20, 21)), genRoot, "/home/dev/p", sessiontest.CLIV3)
		lines := [][]byte{sf.HeaderLine("/home/dev/p"), sf.Message(300), sf.Message(sz.size)}
		rel, err := filepath.Rel(genRoot, sf.Path)
		if err != nil {
			t.Fatal(err)
		}
		// The same line with letters in its middle changed: no byte added or removed.
		changed := bytes.Clone(lines[2])
		mid := len(changed) / 2
		for k := mid; k < mid+64; k++ {
			if c := changed[k]; c >= 'a' && c <= 'z' {
				changed[k] = 'a' + (c-'a'+1)%26
			}
		}
		if bytes.Equal(changed, lines[2]) {
			t.Fatal("no letter in the middle of the line to change")
		}
		for _, rewrite := range []bool{true, false} {
			name := sz.name
			if !rewrite {
				name += ", unchanged"
			}
			t.Run(name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				srv := natstest.Run(t)
				p := publisherAt(t, ctx, srv.URL())
				root := t.TempDir()
				path := filepath.Join(root, rel)
				mirrortest.WriteFile(t, path, mirrortest.JoinLines(lines))
				f, fd := openForLines(t, ctx, p, root, path, lines[0])
				off := int64(0)
				for ord, l := range lines[:2] {
					if err := p.Line(ctx, f, watcher.Line{Ordinal: int64(ord), Offset: off, Len: int64(len(l)), Data: l, Seen: time.Now(), Src: fd}); err != nil {
						t.Fatalf("line %d: %v", ord, err)
					}
					off += int64(len(l)) + 1
				}
				sum := sha256.Sum256(lines[2]) // what the watcher read
				long := watcher.Line{Ordinal: 2, Offset: off, Len: int64(len(lines[2])), Seen: time.Now(), Src: fd, SHA256: &sum}
				if !rewrite {
					if err := p.Line(ctx, f, long); err != nil {
						t.Fatalf("an unchanged long line: %v", err)
					}
					return
				}
				// In place (same inode, the watcher's descriptor sees it).
				mirrortest.WriteFile(t, path, mirrortest.JoinLines([][]byte{lines[0], lines[1], changed}))
				if err := p.Line(ctx, f, long); !errors.Is(err, watcher.ErrReopen) {
					t.Fatalf("a long line rewritten in its middle before it was read again: %v, want ErrReopen", err)
				}
			})
		}
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
	f := watcher.File{Root: root, Rel: filepath.ToSlash(rel), Path: path, ID: inode(t, path), Lead: &watcher.Lead{Lines: [][]byte{header}}, Size: info.Size()}
	if _, err := p.Open(ctx, f, watcher.Discovered); err != nil {
		t.Fatal(err)
	}
	return f, fd
}
