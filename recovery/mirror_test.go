package recovery

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/mirror"
)

func newTestMirror(t *testing.T) *mirrortest.Mirror { return mirrortest.New(t) }

// TestRecoverGoldenThroughMirror runs the golden cases that need the real mirror: blob
// lines streamed from the object store, and a conversation with two generations.
func TestRecoverGoldenThroughMirror(t *testing.T) {
	t.Run("blob", func(t *testing.T) {
		tm := newTestMirror(t)
		dir := filepath.Join("testdata", "golden", "blob")
		root := t.TempDir()
		input, m, head := tm.MirrorInput(t, filepath.Join(dir, "input.jsonl"), 1, 400, root)
		if len(m.Blobs) != 2 {
			t.Fatalf("%d blobs, want 2", len(m.Blobs))
		}
		rep := New(tm.Reader, Options{Roots: []string{root}}).One(mirrortest.Ctx(t), m.Conv)
		if rep.Result != Written {
			t.Fatalf("%s: %s", rep.Result, rep.Reason)
		}
		if want := filepath.Join(root, filepath.FromSlash(head.Source)); rep.Output != want {
			t.Fatalf("written to %s, want the recorded root and path %s", rep.Output, want)
		}
		got, err := os.ReadFile(rep.Output)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, mirrortest.JoinLines(input)) {
			t.Error("complete mirror with blobs: not byte-identical")
		}
		checkGolden(t, filepath.Join(dir, "output.jsonl"), got)
		checkGolden(t, filepath.Join(dir, "report.json"), reportJSON(t, rep, root))
	})
	t.Run("generations", func(t *testing.T) {
		tm := newTestMirror(t)
		dir := filepath.Join("testdata", "golden", "generations")
		tm.MirrorInput(t, filepath.Join(dir, "input-gen1.jsonl"), 1, 0, mirrortest.Root)
		input, m, _ := tm.MirrorInput(t, filepath.Join(dir, "input.jsonl"), 2, 0, mirrortest.Root)
		for _, tc := range []struct {
			gen    int
			suffix string
			want   string
		}{
			{0, "", "input.jsonl"},           // newest by default
			{1, "-gen1", "input-gen1.jsonl"}, // --generation 1
			{2, "-gen2", "input.jsonl"},
		} {
			out := t.TempDir()
			rep := New(tm.Reader, Options{Out: out, Generation: tc.gen}).One(mirrortest.Ctx(t), m.Conv)
			if rep.Result != Written {
				t.Fatalf("generation %d: %s: %s", tc.gen, rep.Result, rep.Reason)
			}
			if want := filepath.Join(out, filepath.FromSlash(m.Source)); rep.Output != want {
				t.Errorf("generation %d written to %s, want Pi's layout %s", tc.gen, rep.Output, want)
			}
			got, err := os.ReadFile(rep.Output)
			if err != nil {
				t.Fatal(err)
			}
			if want := mirrortest.JoinLines(mirrortest.ReadLines(t, filepath.Join(dir, tc.want))); !bytes.Equal(got, want) {
				t.Errorf("generation %d: not the file of that generation", tc.gen)
			}
			if tc.gen != 2 {
				checkGolden(t, filepath.Join(dir, "output"+tc.suffix+".jsonl"), got)
				checkGolden(t, filepath.Join(dir, "report"+tc.suffix+".json"), reportJSON(t, rep, out))
			}
		}
		_ = input
	})
}

// TestRecoverLargeBlob: a multi-megabyte line (a base64 image) comes back byte for byte
// through the object store's chunks.
func TestRecoverLargeBlob(t *testing.T) {
	tm := newTestMirror(t)
	lines := mirrortest.ReadLines(t, filepath.Join("testdata", "golden", "missing_middle", "input.jsonl"))
	big := []byte(`{"type":"message","id":"e00000ff","parentId":"e0000007","timestamp":"2026-11-01T09:00:08.000Z","message":{"role":"user","content":[{"type":"image","mimeType":"image/png","data":"` +
		strings.Repeat("iVBORw0KGgo", 300_000) + `"}]}}`)
	lines = append(lines, big)
	m := mirrortest.MirrorFile(t, lines, 1, 512<<10)
	head := mirrortest.DaemonHead(lines, m, 1)
	head.Root = t.TempDir()
	tm.Publish(t, m, m.Msgs, &head)
	rep := New(tm.Reader, Options{Roots: []string{head.Root}}).One(mirrortest.Ctx(t), m.Conv)
	if rep.Result != Written || rep.Blobs != 1 {
		t.Fatalf("%s (%d blobs): %s", rep.Result, rep.Blobs, rep.Reason)
	}
	got, err := os.ReadFile(rep.Output)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, mirrortest.JoinLines(lines)) {
		t.Fatal("not byte-identical")
	}
}

// snapshot records every file under dir with its content, to prove nothing was written.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			out[p+"/"] = ""
			return nil
		}
		b, err := os.ReadFile(p)
		out[p] = string(b)
		return err
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return out
}

func sameSnapshot(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestRecoverStoreGeneration (DESIGN §8): for a conversation the session store writes,
// recover rebuilds the generation the head names, not the newer one the daemon mirrored
// from the old local file appended to after the cut-over; --generation still picks any.
func TestRecoverStoreGeneration(t *testing.T) {
	tm := newTestMirror(t)
	dir := filepath.Join("testdata", "golden", "generations")
	_, _, head := tm.MirrorInput(t, filepath.Join(dir, "input-gen1.jsonl"), 1, 0, mirrortest.Root)
	lines2 := mirrortest.ReadLines(t, filepath.Join(dir, "input.jsonl"))
	m2 := mirrortest.MirrorFile(t, lines2, 2, 0)
	tm.Publish(t, m2, m2.Msgs, nil)
	head.Writer = mirror.WriterStore
	conv, err := mirror.NewConv(tm.Owner, m2.Conv)
	if err != nil {
		t.Fatal(err)
	}
	if err := tm.Writer.PutHead(mirrortest.Ctx(t), conv, head); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gen, want int
		file      string
	}{
		{0, 1, "input-gen1.jsonl"}, // the store's, by default
		{2, 2, "input.jsonl"},      // the local file's, asked for
	} {
		out := t.TempDir()
		rep := New(tm.Reader, Options{Out: out, Generation: tc.gen}).One(mirrortest.Ctx(t), m2.Conv)
		if rep.Result != Written || rep.Generation != tc.want {
			t.Fatalf("--generation %d: %s generation %d (%s); want written, generation %d", tc.gen, rep.Result, rep.Generation, rep.Reason, tc.want)
		}
		got, err := os.ReadFile(rep.Output)
		if err != nil {
			t.Fatal(err)
		}
		if want := mirrortest.JoinLines(mirrortest.ReadLines(t, filepath.Join(dir, tc.file))); !bytes.Equal(got, want) {
			t.Errorf("--generation %d: not the file of generation %d", tc.gen, tc.want)
		}
		if noted := strings.Contains(strings.Join(rep.Notes, "\n"), "session store writes generation 1"); noted != (tc.gen == 0) {
			t.Errorf("--generation %d: notes %q", tc.gen, rep.Notes)
		}
	}
}
