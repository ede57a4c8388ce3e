package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

var (
	rewriteFiles = flag.Int("backfill-rewrite.files", 2, "files rewritten in place during their back-fill")
	rewriteLines = flag.Int("backfill-rewrite.lines", 4000, "lines of about 1,000 bytes in each")
)

// TestRewriteDuringBackfill: files of many 1,000-byte lines; the daemon starts on the
// embedded server and, 0.8 s later, Pi rewrites each in place (open "w", one write per
// entry), its middle entry changed to another of the same length and three lines
// appended, while the back-fill reads them. Within 120 s the newest generation of every
// file must hold the rewritten file, byte for byte. `make rewrite-soak` runs it with 6
// files of 20,000 lines, the size where the first file's rewrite was missed in half of
// the runs before the watcher recorded the stat of a file's first Open.
func TestRewriteDuringBackfill(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var files [][][]byte
	var paths []string
	for i := range *rewriteFiles {
		var lines [][]byte
		id := fmt.Sprintf("0199ffff-0000-7000-8000-%012d", i)
		lines = append(lines, []byte(fmt.Sprintf(`{"type":"session","version":3,"id":%q,"timestamp":"2026-12-05T14:00:00.000Z","cwd":"/home/dev/big"}`, id)))
		parent := "null"
		for n := 1; n <= *rewriteLines; n++ {
			eid := fmt.Sprintf("%08x", n)
			l := fmt.Sprintf(`{"type":"message","id":%q,"parentId":%s,"timestamp":"2026-12-05T14:00:00.000Z","message":{"role":"user","content":"`, eid, parent)
			l += string(bytes.Repeat([]byte("x"), 1000-len(l)-len(`"}}`))) + `"}}`
			lines = append(lines, []byte(l))
			parent = `"` + eid + `"`
		}
		path := filepath.Join(root, "--home-dev-big--", fmt.Sprintf("2026-12-05T14-00-00-000Z_%s.jsonl", id))
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, mirrortest.JoinLines(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		files, paths = append(files, lines), append(paths, path)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	d := startTestDaemon(t, "--nats-listen", listen, "--root", root, "--state-dir", t.TempDir())
	defer d.stop()
	time.Sleep(800 * time.Millisecond) // the rewrite starts while the back-fill runs: what is tested
	for i, lines := range files {
		mid := len(lines) / 2
		changed := bytes.Replace(lines[mid], []byte(`"content":"x`), []byte(`"content":"y`), 1)
		rewritten := append(append([][]byte(nil), lines[:mid]...), changed)
		rewritten = append(rewritten, lines[mid+1:]...)
		for n := range 3 {
			rewritten = append(rewritten, []byte(fmt.Sprintf(`{"type":"message","id":"f%07x","parentId":null,"timestamp":"2026-12-05T14:00:01.000Z","message":{"role":"user","content":"appended"}}`, n)))
		}
		if err := sessiontest.Rewrite(paths[i], rewritten); err != nil {
			t.Fatal(err)
		}
	}
	r := newReader(t, natstest.Connect(t, "nats://"+listen), "t1", "alice")
	allMirrored(t, r, root, 120*time.Second)
}
