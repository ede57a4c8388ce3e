package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// metricValue sums the samples of a metric family whose labels include want.
func metricValue(t *testing.T, d *daemon, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

// migrateV1 rewrites a v1 file in place the way Pi does when it opens one: the header
// gains "version":3, every entry gets a new random id and its predecessor as parent.
func migrateV1(t *testing.T, path string, rng *rand.Rand) []byte {
	t.Helper()
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := session.SplitLines(content)
	var out bytes.Buffer
	// A copy: appending to lines[0] in place would write over the start of line 2.
	out.Write(append(bytes.Clone(bytes.TrimSuffix(lines[0], []byte("}"))), []byte(`,"version":3}`)...))
	out.WriteByte('\n')
	prev := "null"
	for _, l := range lines[1:] {
		id := fmt.Sprintf("%08x", rng.Uint32())
		out.Write(bytes.TrimSuffix(l, []byte("}")))
		fmt.Fprintf(&out, `,"id":"%s","parentId":%s}`+"\n", id, prev)
		prev = `"` + id + `"`
	}
	// Pi truncates and writes the file again in place (writeFileSync).
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func readGen(t *testing.T, r *mirror.Reader, key string, gen int) mirror.Generation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := r.Conv(key)
	if err != nil {
		t.Fatal(err)
	}
	g, err := r.ReadGeneration(ctx, c, gen)
	if err != nil {
		t.Fatalf("read %s generation %d: %v", key, gen, err)
	}
	return g
}

func joinLines(msgs []mirror.Msg) []byte {
	var b bytes.Buffer
	for _, m := range msgs {
		b.Write(m.Data)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// TestRewrites covers files rewritten under the daemon: Pi's v1 → v3 migration starts a
// new generation, an atomic rename that keeps every mirrored line carries on, a file
// truncated and restarted with a header of a new id (what Pi's SessionManager.open does
// to a file it cannot parse, Pi #6002) is a new generation of the session whose name it
// still bears, which lacks that session's entries: shrunk, not a new conversation.
func TestRewrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(51, 52))
	srv := natstest.Run(t)
	root := t.TempDir()
	v1 := sessiontest.New(rng, root, "/legacy", sessiontest.CLIV1)
	lines := [][]byte{v1.HeaderLine("/legacy")}
	for range 6 {
		lines = append(lines, v1.Entry(400))
	}
	if err := v1.Append(lines...); err != nil {
		t.Fatal(err)
	}
	v1Original := v1.Content()
	kept := sessiontest.New(rng, root, "/kept", sessiontest.HarnessV3)
	if err := kept.Append(kept.HeaderLine("/kept"), kept.Entry(300), kept.Entry(300)); err != nil {
		t.Fatal(err)
	}
	restarted := sessiontest.New(rng, root, "/restart", sessiontest.CLIV3)
	if err := restarted.Append(restarted.HeaderLine("/restart"), restarted.Entry(300)); err != nil {
		t.Fatal(err)
	}

	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 20*time.Second)

	// 1. Pi migrates the v1 file in place: every line changes.
	migrated := migrateV1(t, v1.Path, rng)
	// 2. An atomic rename over the file with the same lines plus one more.
	tmp := kept.Path + ".tmp"
	extra := kept.Entry(500)
	if err := os.WriteFile(tmp, append(kept.Content(), append(extra, '\n')...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, kept.Path); err != nil {
		t.Fatal(err)
	}
	// 3. Truncated and restarted: a new header, a new id.
	fresh := sessiontest.New(rng, root, "/restart", sessiontest.CLIV3)
	freshContent := append(fresh.HeaderLine("/restart"), '\n')
	freshContent = append(freshContent, append(fresh.Entry(300), '\n')...)
	if err := os.WriteFile(restarted.Path, freshContent, 0o644); err != nil {
		t.Fatal(err)
	}

	allMirrored(t, r, root, 30*time.Second)
	g := readGen(t, r, v1.ID, 0)
	if g.Number != 2 || !bytes.Equal(joinLines(g.Msgs), migrated) {
		t.Fatalf("migrated v1 file: newest generation %d (%v), want 2 holding the rewritten file", g.Number, g.Generations)
	}
	if g1 := readGen(t, r, v1.ID, 1); !bytes.Equal(joinLines(g1.Msgs), v1Original) {
		t.Fatal("generation 1 no longer holds the original v1 file")
	}
	if g := readGen(t, r, kept.ID, 0); g.Number != 1 || len(g.Msgs) != 4 {
		t.Fatalf("rename keeping every line: generation %d with %d lines, want 1 with 4", g.Number, len(g.Msgs))
	}
	if g := readGen(t, r, restarted.ID, 1); len(g.Msgs) != 2 {
		t.Fatalf("the truncated conversation lost its mirror copy: %d lines", len(g.Msgs))
	}
	if g := readGen(t, r, restarted.ID, 0); g.Number != 2 || !bytes.Equal(joinLines(g.Msgs), freshContent) {
		t.Fatalf("restarted with a new header: newest generation %d of %s, want 2 holding the new file", g.Number, restarted.ID)
	}
	if metricValue(t, d, "pisync_generation_bumps_total", nil) != 2 {
		t.Errorf("generation bumps = %v, want 2", metricValue(t, d, "pisync_generation_bumps_total", nil))
	}
	msgs := readStream(t, nc)
	if dups := duplicates(msgs); len(dups) > 0 {
		t.Fatalf("duplicates: %v", dups)
	}
}

// TestCopiedSessionBothMirrored: a copied file carries the same header id as its
// original; both are mirrored under keys that do not collide, and the clash is counted.
func TestCopiedSessionBothMirrored(t *testing.T) {
	rng := rand.New(rand.NewPCG(53, 54))
	srv := natstest.Run(t)
	root := t.TempDir()
	orig := sessiontest.New(rng, root, "/a", sessiontest.HarnessV3)
	if err := orig.Append(orig.HeaderLine("/a"), orig.Entry(300), orig.Entry(300)); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 20*time.Second)

	copyPath := filepath.Join(root, "copy", filepath.Base(orig.Path))
	if err := os.MkdirAll(filepath.Dir(copyPath), 0o755); err != nil {
		t.Fatal(err)
	}
	extra := orig.Entry(400)
	if err := os.WriteFile(copyPath, append(orig.Content(), append(extra, '\n')...), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the copy mirrored under its own key", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		heads, err := r.Heads(ctx)
		if err != nil {
			return false, err.Error()
		}
		var keys []string
		for _, h := range heads {
			if h.Conversation == orig.ID && h.Entries == 4 && h.Source == "copy/"+filepath.Base(orig.Path) {
				return h.Key != orig.ID, "copy mirrored under the original's key"
			}
			keys = append(keys, h.Key)
		}
		return false, strings.Join(keys, ",")
	})
	if g := readGen(t, r, orig.ID, 0); len(g.Msgs) != 3 {
		t.Fatalf("the original's mirror copy changed: %d lines", len(g.Msgs))
	}
	if n := metricValue(t, d, "pisync_conversation_clashes_total", nil); n != 1 {
		t.Errorf("clashes = %v", n)
	}
}

// TestDeleteAndMove: a deleted file keeps its mirror copy and its head says so; a file
// moved within the root keeps its identity and is not published again.
func TestDeleteAndMove(t *testing.T) {
	rng := rand.New(rand.NewPCG(55, 56))
	srv := natstest.Run(t)
	root := t.TempDir()
	files := writeSessions(t, rng, root, 3, 10)
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 20*time.Second)
	before := len(readStream(t, nc))

	if err := os.Remove(files[0].Path); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(root, "--elsewhere--", filepath.Base(files[1].Path))
	if err := os.MkdirAll(filepath.Dir(moved), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(files[1].Path, moved); err != nil {
		t.Fatal(err)
	}
	f1 := files[1]
	f1.Path = moved
	if err := f1.Append(f1.Entry(300)); err != nil {
		t.Fatal(err)
	}
	allMirrored(t, r, root, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitHeadDeleted(t, r, files[0].ID)
	if g := readGen(t, r, files[0].ID, 0); len(g.Msgs) != len(files[0].Lines) {
		t.Fatal("the deleted file's mirror copy changed")
	}
	if after := len(readStream(t, nc)); after != before+1 {
		t.Fatalf("stream went from %d to %d messages; the move should add only the appended line", before, after)
	}
	c1, _ := r.Conv(f1.ID)
	waitFor(t, 20*time.Second, "moved file's head names its new place", func() (bool, string) {
		h, _, err := r.Head(ctx, c1)
		if err != nil {
			return false, err.Error()
		}
		return strings.HasPrefix(h.Source, "--elsewhere--/"), h.Source
	})
}

// TestDeletedWhileStopped: a session deleted while the daemon was stopped is marked
// deleted in its head after the next start's first scan, its mirror copy untouched; the
// files still there are not.
func TestDeletedWhileStopped(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 62))
	srv := natstest.Run(t)
	root, state := t.TempDir(), t.TempDir()
	files := writeSessions(t, rng, root, 3, 5)
	args := []string{"--nats", srv.URL(), "--root", root, "--state-dir", state, "--host", "h1"}
	d := startTestDaemon(t, args...)
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 20*time.Second)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(files[0].Path); err != nil {
		t.Fatal(err)
	}
	before := len(readStream(t, nc))

	d = startTestDaemon(t, args...)
	defer d.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitHeadDeleted(t, r, files[0].ID)
	for _, f := range files[1:] {
		c, _ := r.Conv(f.ID)
		if h, _, err := r.Head(ctx, c); err != nil || h.LocalDeleted {
			t.Errorf("%s: head %+v, %v; want it present, not deleted", f.Path, h, err)
		}
	}
	if g := readGen(t, r, files[0].ID, 0); len(g.Msgs) != len(files[0].Lines) {
		t.Error("the deleted file's mirror copy changed")
	}
	if after := len(readStream(t, nc)); after != before {
		t.Errorf("stream went from %d to %d messages across the restart", before, after)
	}
}

// waitHeadDeleted waits until the head of conversation id says its file is deleted.
func waitHeadDeleted(t *testing.T, r *mirror.Reader, id string) {
	t.Helper()
	c, err := r.Conv(id)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "head of "+id+" marked deleted", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h, _, err := r.Head(ctx, c)
		if err != nil {
			return false, err.Error()
		}
		return h.LocalDeleted, fmt.Sprintf("%+v", h)
	})
}

// TestBadInputKeepsFlowing: a torn tail that never completes is held and reported, never
// published half, and published once it completes; a line over --max-line-bytes is
// skipped and counted; binary garbage and a file that is not a session are skipped and
// reported once; everything else keeps flowing.
func TestBadInputKeepsFlowing(t *testing.T) {
	rng := rand.New(rand.NewPCG(57, 58))
	srv := natstest.Run(t)
	root := t.TempDir()
	good := writeSessions(t, rng, root, 2, 5)
	torn := good[0]
	if err := sessiontest.AppendBytes(torn.Path, []byte(`{"type":"message","id":"deadbeef","par`)); err != nil {
		t.Fatal(err)
	}
	huge := good[1]
	big := huge.Message(300_000)
	if err := huge.Append(big, huge.Entry(300)); err != nil {
		t.Fatal(err)
	}
	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = byte(rng.IntN(256))
	}
	if err := os.WriteFile(filepath.Join(root, "garbage.jsonl"), garbage, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "other.jsonl"), []byte(`{"type":"not-a-session"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir(), "--max-line-bytes", "200000")
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")

	waitFor(t, 20*time.Second, "torn tail reported", func() (bool, string) {
		p := d.pub.Progress().Roots[root]
		return p != nil && p.Torn == 1, fmt.Sprintf("%+v", p)
	})
	waitFor(t, 20*time.Second, "the rest mirrored", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g, err := r.ReadGeneration(ctx, mustConv(t, r, huge.ID), 0)
		if err != nil {
			return false, err.Error()
		}
		// The huge line is skipped: every other line is there.
		return len(g.Msgs) == len(huge.Lines)-1, fmt.Sprintf("%d lines", len(g.Msgs))
	})
	if n := metricValue(t, d, "pisync_lines_too_large_total", nil); n != 1 {
		t.Errorf("lines too large = %v", n)
	}
	// Recovery fills the gap the skipped line leaves: the entry after it names it as its
	// parent and gets a placeholder with exactly its id.
	var out, errOut bytes.Buffer
	err := RecoverCommand(context.Background(), []string{"--conversation", huge.ID, "--out", t.TempDir(), "--json",
		"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice"}, &out, &errOut)
	if err != nil {
		t.Fatalf("recover: %v\n%s", err, errOut.String())
	}
	bigEnv, _ := session.ScanEntry(big)
	if !strings.Contains(out.String(), `"missing_ordinals"`) || !strings.Contains(out.String(), `"id": "`+bigEnv.ID+`"`) {
		t.Errorf("recovery did not fill the skipped line %s:\n%s", bigEnv.ID, out.String())
	}
	if n := metricValue(t, d, "pisync_skipped_files_total", nil); n != 2 {
		t.Errorf("skipped files = %v, want 2 (garbage, not a session)", n)
	}
	for _, m := range readStream(t, nc) {
		if bytes.Contains(m.data, []byte("deadbeef")) {
			t.Fatal("a torn tail was published")
		}
	}
	// The writer comes back and completes the line.
	if err := sessiontest.AppendBytes(torn.Path, []byte(`entId":null,"timestamp":"2026-01-01T00:00:00.000Z"}`+"\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "completed line published", func() (bool, string) {
		for _, m := range readStream(t, nc) {
			if m.line.EntryID == "deadbeef" {
				var v map[string]any
				return json.Unmarshal(m.data, &v) == nil, "published but not whole"
			}
		}
		return false, "not yet"
	})
}

func mustConv(t *testing.T, r *mirror.Reader, key string) mirror.Conv {
	t.Helper()
	c, err := r.Conv(key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSameSizeRewriteNewGeneration pins issue 13 item 12 end to end: Pi rewrites a
// mirrored file in place (truncate, one write per entry) and one line before the last
// becomes another of the same length. Within seconds the newest generation must equal
// the file.
func TestSameSizeRewriteNewGeneration(t *testing.T) {
	rng := rand.New(rand.NewPCG(53, 54))
	srv := natstest.Run(t)
	root := t.TempDir()
	f := sessiontest.New(rng, root, "/same", sessiontest.HarnessV3)
	if err := f.Append(f.HeaderLine("/same"), f.Message(300), f.Message(300), f.Message(300)); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", state)
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 20*time.Second)
	// Restarted: the file is resumed from its checkpoint (the watcher never read what
	// lies before it), as after the SIGKILL of torture seed 20261201.
	d.stop()
	d = startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", state)
	defer d.stop()
	allMirrored(t, r, root, 20*time.Second)

	lines := slices.Clone(f.Lines)
	// Another entry id of the same length (what Pi's migration does to every line).
	i := bytes.Index(lines[1], []byte(`"id":"`)) + len(`"id":"`)
	changed := slices.Clone(lines[1])
	if changed[i] == 'f' {
		changed[i] = 'e'
	} else {
		changed[i] = 'f'
	}
	lines[1] = changed
	if err := sessiontest.Rewrite(f.Path, lines); err != nil {
		t.Fatal(err)
	}
	f.Lines = lines
	for range 20 {
		if err := f.Append(f.Message(200)); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		g := readGen(t, r, f.ID, 0)
		if g.Number == 2 && bytes.Equal(joinLines(g.Msgs), want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("newest generation %d does not hold the rewritten file", g.Number)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
