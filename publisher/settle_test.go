package publisher

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// TestUnsettledCheckpointComparedAtStart (torture T13): Pi rewrote an earlier line in
// place (the same size: header and last line unchanged) and appended one; the daemon
// delivered the appended line into the old generation and was stopped before the
// watcher's settled check could find the rewrite. At the next start the file ends where
// the checkpoint says, and the subject holds the lines it counts: without knowing that
// the check was pending, the checkpoint proved the file mirrored and the old line stayed
// in the newest generation for good. The file is compared with the mirror instead: a new
// generation, equal to the file.
func TestUnsettledCheckpointComparedAtStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	root, stateDir := t.TempDir(), t.TempDir()
	f := sessiontest.New(rand.New(rand.NewPCG(13, 13)), root, "/home/dev/p", sessiontest.CLIV3)
	if err := f.Append(f.HeaderLine("/home/dev/p"), f.Entry(300), f.Entry(400), f.Entry(300)); err != nil {
		t.Fatal(err)
	}
	// run starts a publisher and a watcher whose settled check does not come within the
	// test, waits until the newest generation is gen and holds the file's lines, and stops
	// both (a clean stop commits the checkpoints).
	run := func(what string, gen int, during func()) {
		t.Helper()
		runDaemon(t, ctx, srv.URL(), stateDir, watcher.Options{Roots: []string{root}, SettleDelay: time.Hour},
			f.ID, what, during, func(p *Publisher, c mirror.Conv) bool { return newestIs(ctx, p, c, gen, f.Lines) })
	}
	run("the file mirrored", 1, nil)
	var lines [][]byte
	run("the appended line mirrored", 1, func() {
		lines = append([][]byte(nil), f.Lines...)
		old := lines[1]
		lines[1] = bytes.Replace(lines[1], []byte(`"timestamp":"2`), []byte(`"timestamp":"3`), 1)
		if bytes.Equal(lines[1], old) {
			t.Fatal("bad fixture: no timestamp")
		}
		lines = append(lines, f.Entry(300))
		// Over the old bytes, never shorter: the watcher sees an append.
		fh, err := os.OpenFile(f.Path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fh.WriteAt(mirrortest.JoinLines(lines), 0); err != nil {
			t.Fatal(err)
		}
		if err := fh.Close(); err != nil {
			t.Fatal(err)
		}
		// Generation 1 holds the old line 2 and the new line 5 until the next start.
		f.Lines = append(append(append([][]byte(nil), lines[0]), old), lines[2:]...)
	})
	f.Lines = lines
	run("a new generation with the rewritten line", 2, nil)
}

// TestWrittenWhileStoppedComparedAtStart (torture T13's variant, seeds 166613635693,
// 476227593016, 9446429251): an earlier line rewritten the same size while no daemon
// ran, and nothing appended since. The file ends where its checkpoint says, with the
// same last line: only its modification time tells it was written. It is compared with
// the mirror at start: a new generation.
func TestWrittenWhileStoppedComparedAtStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	root, stateDir := t.TempDir(), t.TempDir()
	f := sessiontest.New(rand.New(rand.NewPCG(14, 14)), root, "/home/dev/p", sessiontest.CLIV3)
	if err := f.Append(f.HeaderLine("/home/dev/p"), f.Entry(300), f.Entry(400), f.Entry(300)); err != nil {
		t.Fatal(err)
	}
	run := func(what string, gen int) {
		t.Helper()
		runDaemon(t, ctx, srv.URL(), stateDir, watcher.Options{Roots: []string{root}}, f.ID, what, nil,
			func(p *Publisher, c mirror.Conv) bool { return newestIs(ctx, p, c, gen, f.Lines) })
	}
	run("the file mirrored", 1)
	fi, err := os.Stat(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	lines := append([][]byte(nil), f.Lines...)
	lines[2] = bytes.Replace(lines[2], []byte(`"timestamp":"2`), []byte(`"timestamp":"3`), 1)
	if bytes.Equal(lines[2], f.Lines[2]) {
		t.Fatal("bad fixture: no timestamp")
	}
	if err := sessiontest.Rewrite(f.Path, lines); err != nil {
		t.Fatal(err)
	}
	// A clock that has not moved on (a coarse file system) is not what this is about.
	if err := os.Chtimes(f.Path, time.Time{}, fi.ModTime().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	f.Lines = lines
	run("a new generation with the rewritten line", 2)
}

// newestIs reports whether the newest generation of c is gen, holds exactly lines and
// its head says so.
func newestIs(ctx context.Context, p *Publisher, c mirror.Conv, gen int, lines [][]byte) bool {
	g, err := p.reader.ReadGeneration(ctx, c, 0)
	if err != nil || g.Number != gen || len(g.Msgs) != len(lines) {
		return false
	}
	for i, m := range g.Msgs {
		sum := sha256.Sum256(lines[i])
		if m.SHA256 != hex.EncodeToString(sum[:]) {
			return false
		}
	}
	h, _, err := p.reader.Head(ctx, c)
	return err == nil && h.Generation == gen && h.LastOrdinal == int64(len(lines)-1)
}
