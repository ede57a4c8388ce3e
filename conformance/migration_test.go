package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/pitest"
	"github.com/pisync/pisync/mirror"
)

// TestV1Migration: Pi's coding-agent rewrites a version-1 file in place when it opens it
// (truncate, then one write per line, with new random entry ids). With the daemon
// running, for a v1 file written before it started and one written while it runs:
// generation 1 (the v1 file) and the newest generation (Pi's v3 rewrite) are both in the
// mirror, byte for byte; `pisync recover --all` brings back the v3 file byte for byte and
// Pi reads it as before; `--generation 1` brings back the v1 file, which Pi opens and
// migrates to the same entries (up to their random ids).
func TestV1Migration(t *testing.T) {
	t.Parallel()
	sw := newStopwatch(t)
	pi := pitest.New(t)
	srv := natstest.Run(t)
	base := t.TempDir()
	root := filepath.Join(base, "sessions")

	type v1file struct {
		name string
		pitest.V1File
		v1, v3 []byte // the file before and after Pi's migration
	}
	files := []*v1file{{name: "written before the daemon started", V1File: pi.WriteV1(t, root)}}
	d := startDaemon(t, srv.URL(), filepath.Join(base, "state"), root)
	mc := newMirrorClient(t, srv.URL())
	files = append(files, &v1file{name: "written while it runs", V1File: pi.WriteV1(t, root)})
	mc.waitMirrored(t, root)
	sw.lap("v1 files mirrored")
	v1dumps := map[string]string{}
	for _, f := range files {
		f.v1 = mustRead(t, f.Path)
		if f.Lines != len(readLines(t, f.Path)) || f.Format != "cli-v1" {
			t.Fatalf("%s: write-v1 says %d lines of %s, the file has %d", f.name, f.Lines, f.Format, len(readLines(t, f.Path)))
		}
		v1dumps[f.Path] = "cli"
	}
	wantV1 := pi.DumpMany(t, dumpRequests(v1dumps))

	// Both migrations at once, while the daemon watches.
	var wg sync.WaitGroup
	migrations := make([]pitest.Migration, len(files))
	errs := make([]error, len(files))
	for i, f := range files {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), pitest.CallTimeout)
			defer cancel()
			out, err := pi.Output(ctx, "migrate", f.Path)
			if err == nil {
				err = json.Unmarshal(out, &migrations[i])
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, m := range migrations {
		if errs[i] != nil {
			t.Fatalf("%s: %v", files[i].name, errs[i])
		}
		if !m.Rewritten || m.FromVersion != 1 || m.ToVersion != 3 || m.ConversationID != files[i].ConversationID {
			t.Fatalf("%s: Pi's migration: %+v", files[i].name, m)
		}
		files[i].v3 = mustRead(t, files[i].Path)
	}
	sw.lap("Pi migrated both")
	mc.waitMirrored(t, root)
	d.stop(t)
	sw.lap("v3 files mirrored")

	// Both generations are in the mirror, byte for byte.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, f := range files {
		conv, err := mc.r.Conv(f.ConversationID)
		if err != nil {
			t.Fatal(err)
		}
		newest, err := mc.r.ReadGeneration(ctx, conv, 0)
		if err != nil {
			t.Fatal(err)
		}
		first, err := mc.r.ReadGeneration(ctx, conv, 1)
		if err != nil {
			t.Fatalf("%s: generation 1: %v", f.name, err)
		}
		if newest.Number < 2 {
			t.Errorf("%s: newest generation %d after Pi's rewrite, want 2 or more", f.name, newest.Number)
		}
		if newest.Number > 2 {
			// Pi truncates, then writes line by line: a daemon may see a rewrite more
			// than once. Allowed, but worth knowing.
			t.Logf("%s: generations %v", f.name, newest.Generations)
		}
		for _, g := range []struct {
			what string
			msgs [][]byte
			want []byte
		}{{"generation 1", mirroredLines(first.Msgs), f.v1}, {"generation " + strconv.Itoa(newest.Number), mirroredLines(newest.Msgs), f.v3}} {
			if got := append(bytes.Join(g.msgs, []byte("\n")), '\n'); !bytes.Equal(got, g.want) {
				t.Errorf("%s: %s in the mirror: %s", f.name, g.what, firstDifference(g.want, got))
			}
		}
	}

	// The newest generation, recovered in place.
	loaders := map[string]string{}
	for _, f := range files {
		loaders[f.Path] = "cli"
	}
	want := pi.DumpMany(t, dumpRequests(loaders))
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	reports := recoverJSON(t, srv.URL(), append([]string{"--all"}, rootArgs(root)...)...).byConversation()
	out1 := filepath.Join(base, "generation1")
	args := []string{"--generation", "1", "--out", out1}
	for _, f := range files {
		args = append(args, "--conversation", f.ConversationID)
	}
	gen1 := recoverJSON(t, srv.URL(), args...).byConversation()
	sw.lap("recovered both generations")
	gen1dumps := map[string]string{}
	for _, f := range files {
		gen1dumps[gen1[f.ConversationID].Output] = "cli"
	}
	got := pi.DumpMany(t, dumpRequests(loaders))
	gotV1 := pi.DumpMany(t, dumpRequests(gen1dumps))
	sw.lap("Pi dumped the rebuilt files")

	for _, f := range files {
		t.Run(f.name, func(t *testing.T) {
			r := reports[f.ConversationID]
			checkCompleteReport(t, r, f.Path, f.v3)
			if r.Generation < 2 || !slices.Contains(r.Generations, 1) {
				t.Errorf("recovered generation %d of %v, want the newest, after generation 1", r.Generation, r.Generations)
			}
			// Pi's migration keeps every entry (with new ids): never a shrink.
			if n := len(r.History); n < 2 || r.History[n-1].Shrunk != nil {
				t.Errorf("history after Pi's migration: %+v", r.History)
			}
			if b := mustRead(t, f.Path); !bytes.Equal(b, f.v3) {
				t.Errorf("recovered file is not Pi's v3 rewrite: %s", firstDifference(f.v3, b))
			}
			if got[f.Path].Error != "" {
				t.Fatalf("Pi refuses the recovered file: %s", got[f.Path].Error)
			}
			if diffs := pitest.DiffDumps(want[f.Path].Dump.Raw, got[f.Path].Dump.Raw); diffs != nil {
				t.Errorf("Pi reads the recovered file differently:\n%s", strings.Join(diffs, "\n"))
			}

			r1 := gen1[f.ConversationID]
			if r1.Generation != 1 || r1.Result != "written" || !r1.Complete || len(r1.Placeholders) > 0 {
				t.Errorf("generation 1: %+v", r1)
			}
			if b := mustRead(t, r1.Output); !bytes.Equal(b, f.v1) {
				t.Errorf("generation 1 recovered is not the v1 file: %s", firstDifference(f.v1, b))
			}
			if gotV1[r1.Output].Error != "" {
				t.Fatalf("Pi refuses the recovered v1 file: %s", gotV1[r1.Output].Error)
			}
			// Opening a v1 file migrates it to random ids: equal up to those.
			if diffs := pitest.DiffDumps(normalize(t, wantV1[f.Path].Dump.Raw), normalize(t, gotV1[r1.Output].Dump.Raw)); diffs != nil {
				t.Errorf("Pi reads the recovered v1 file differently:\n%s", strings.Join(diffs, "\n"))
			}
			// And the migration in the mirror is Pi's migration of that file, up to ids.
			if diffs := pitest.DiffDumps(normalize(t, wantV1[f.Path].Dump.Raw), normalize(t, want[f.Path].Dump.Raw)); diffs != nil {
				t.Errorf("Pi's migration differs from Pi's reading of the v1 file:\n%s", strings.Join(diffs, "\n"))
			}
		})
	}
}

// mirroredLines are the bodies of a generation's messages (no blobs in these files).
func mirroredLines(msgs []mirror.Msg) [][]byte {
	out := make([][]byte, len(msgs))
	for i, m := range msgs {
		out[i] = m.Data
	}
	return out
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
