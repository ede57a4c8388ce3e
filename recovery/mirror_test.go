package recovery

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/natstest"
)

// testMirror is a provisioned mirror on a real embedded nats-server.
type testMirror struct {
	js    jetstream.JetStream
	names mirror.Names
	owner mirror.Owner
	r     Mirror
	w     *mirror.Writer
}

func newTestMirror(t *testing.T) *testMirror {
	t.Helper()
	srv := natstest.Run(t)
	return mirrorFor(t, srv.URL(), "t1", "alice")
}

func mirrorFor(t *testing.T, url, tenant, owner string) *testMirror {
	t.Helper()
	nc := natstest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	names := mirror.DefaultNames()
	if err := mirror.Provision(ctx, js, names, mirror.Config{}); err != nil {
		t.Fatal(err)
	}
	o, err := mirror.NewOwner(tenant, owner)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewMirror(ctx, js, names, o)
	if err != nil {
		t.Fatal(err)
	}
	w, err := mirror.NewWriter(ctx, js, names, o)
	if err != nil {
		t.Fatal(err)
	}
	return &testMirror{js: js, names: names, owner: o, r: r, w: w}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// publish stores msgs of m (blobs first, as the publisher does) and, if given, the head.
func (tm *testMirror) publish(t *testing.T, m mirrored, msgs []mirror.Msg, head *mirror.Head) {
	t.Helper()
	ctx := testCtx(t)
	conv, err := mirror.NewConv(tm.owner, m.conv)
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range msgs {
		if msg.Kind == mirror.KindBlob {
			if _, err := tm.w.PutBlob(ctx, msg.SHA256, bytes.NewReader(m.blobs[msg.SHA256])); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tm.js.PublishMsg(ctx, tm.names.NewMsg(conv, msg.Line, msg.Data)); err != nil {
			t.Fatal(err)
		}
	}
	if head != nil {
		if err := tm.w.PutHead(ctx, conv, *head); err != nil {
			t.Fatal(err)
		}
	}
}

// mirrorInput publishes a golden input file whole as generation gen, with its head
// recorded under root.
func (tm *testMirror) mirrorInput(t *testing.T, path string, gen, blobThreshold int, root string) ([][]byte, mirrored, mirror.Head) {
	t.Helper()
	lines := readLines(t, path)
	m := mirrorFile(t, lines, gen, blobThreshold)
	head := daemonHead(lines, m, gen)
	head.Root = root
	tm.publish(t, m, m.msgs, &head)
	return lines, m, head
}

// TestRecoverGoldenThroughMirror runs the golden cases that need the real mirror: blob
// lines streamed from the object store, and a conversation with two generations.
func TestRecoverGoldenThroughMirror(t *testing.T) {
	t.Run("blob", func(t *testing.T) {
		tm := newTestMirror(t)
		dir := filepath.Join("testdata", "golden", "blob")
		root := t.TempDir()
		input, m, head := tm.mirrorInput(t, filepath.Join(dir, "input.jsonl"), 1, 400, root)
		if len(m.blobs) != 2 {
			t.Fatalf("%d blobs, want 2", len(m.blobs))
		}
		rep := New(tm.r, Options{}).One(testCtx(t), m.conv)
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
		if !bytes.Equal(got, joinLines(input)) {
			t.Error("complete mirror with blobs: not byte-identical")
		}
		checkGolden(t, filepath.Join(dir, "output.jsonl"), got)
		checkGolden(t, filepath.Join(dir, "report.json"), reportJSON(t, rep, root))
	})
	t.Run("generations", func(t *testing.T) {
		tm := newTestMirror(t)
		dir := filepath.Join("testdata", "golden", "generations")
		tm.mirrorInput(t, filepath.Join(dir, "input-gen1.jsonl"), 1, 0, testRoot)
		input, m, _ := tm.mirrorInput(t, filepath.Join(dir, "input.jsonl"), 2, 0, testRoot)
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
			rep := New(tm.r, Options{Out: out, Generation: tc.gen}).One(testCtx(t), m.conv)
			if rep.Result != Written {
				t.Fatalf("generation %d: %s: %s", tc.gen, rep.Result, rep.Reason)
			}
			if want := filepath.Join(out, filepath.FromSlash(m.source)); rep.Output != want {
				t.Errorf("generation %d written to %s, want Pi's layout %s", tc.gen, rep.Output, want)
			}
			got, err := os.ReadFile(rep.Output)
			if err != nil {
				t.Fatal(err)
			}
			if want := joinLines(readLines(t, filepath.Join(dir, tc.want))); !bytes.Equal(got, want) {
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
	lines := readLines(t, filepath.Join("testdata", "golden", "missing_middle", "input.jsonl"))
	big := []byte(`{"type":"message","id":"e00000ff","parentId":"e0000007","timestamp":"2026-11-01T09:00:08.000Z","message":{"role":"user","content":[{"type":"image","mimeType":"image/png","data":"` +
		strings.Repeat("iVBORw0KGgo", 300_000) + `"}]}}`)
	lines = append(lines, big)
	m := mirrorFile(t, lines, 1, 512<<10)
	head := daemonHead(lines, m, 1)
	head.Root = t.TempDir()
	tm.publish(t, m, m.msgs, &head)
	rep := New(tm.r, Options{}).One(testCtx(t), m.conv)
	if rep.Result != Written || rep.Blobs != 1 {
		t.Fatalf("%s (%d blobs): %s", rep.Result, rep.Blobs, rep.Reason)
	}
	got, err := os.ReadFile(rep.Output)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, joinLines(lines)) {
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
