package main

import (
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// fileMark is what guarantee 5 says the daemon never changes in the session tree.
type fileMark struct {
	data  string
	mode  fs.FileMode
	mtime time.Time
}

// treeMarks records every entry under root (directories included, so that a file the
// daemon would add shows too).
func treeMarks(t *testing.T, root string) map[string]fileMark {
	t.Helper()
	out := map[string]fileMark{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		m := fileMark{mode: fi.Mode(), mtime: fi.ModTime()}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			m.data = string(b)
		}
		out[p] = m
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameMarks(t *testing.T, when string, got, want map[string]fileMark) {
	t.Helper()
	for p, w := range want {
		g, ok := got[p]
		switch {
		case !ok:
			t.Errorf("%s: %s vanished", when, p)
		case g.data != w.data:
			t.Errorf("%s: %s: bytes changed", when, p)
		case g.mode != w.mode:
			t.Errorf("%s: %s: mode %v, was %v", when, p, g.mode, w.mode)
		case !g.mtime.Equal(w.mtime): // a directory's too: a file created and removed shows there
			t.Errorf("%s: %s: mtime %v, was %v", when, p, g.mtime, w.mtime)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: %s appeared in the session tree", when, p)
		}
	}
}

// TestNoMarkerInTheTree is guarantee 5: across a back-fill, live appends, a restart and
// a start with a lost state directory, no file or directory of the session tree changes
// because of the daemon (bytes, mode, modification time; a directory's time would show a
// file created and removed in it), and nothing is added to it.
// Read-only files and directories are part of the tree, so that a daemon that chmods
// what it cannot read would be caught too.
func TestNoMarkerInTheTree(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(71, 72))
	srv := natstest.Run(t)
	root := t.TempDir()
	files := writeSessions(t, rng, root, 6, 8)
	if err := files[0].Append(files[0].ImageEntry(700 << 10)); err != nil { // a blob
		t.Fatal(err)
	}
	if err := os.Chmod(files[1].Path, 0o444); err != nil {
		t.Fatal(err)
	}
	// Modification times in the past, so that a touch by the daemon cannot coincide.
	old := time.Now().Add(-48 * time.Hour).Truncate(time.Second)
	for _, f := range files {
		if err := os.Chtimes(f.Path, old, old); err != nil {
			t.Fatal(err)
		}
	}
	nc := natstest.Connect(t, srv.URL())
	var r *mirror.Reader // once the first daemon has provisioned the mirror
	state := t.TempDir()
	run := func(when, stateDir string, appendLive bool) {
		t.Helper()
		want := treeMarks(t, root)
		d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", stateDir, "--verify-interval", "200ms")
		if r == nil {
			r = newReader(t, nc, "t1", "alice")
		}
		allMirrored(t, r, root, 60*time.Second)
		if appendLive {
			for _, f := range files[2:4] {
				if err := f.Append(f.Entry(500)); err != nil {
					t.Fatal(err)
				}
			}
			want = treeMarks(t, root) // the test's own writes
			allMirrored(t, r, root, 60*time.Second)
		}
		if err := d.stop(); err != nil {
			t.Fatal(err)
		}
		sameMarks(t, when, treeMarks(t, root), want)
	}
	run("back-fill", state, false)
	run("live appends", state, true)
	run("restart", state, false)
	run("lost state directory", t.TempDir(), false)
}
