package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/internal/verify"
)

// TestStatusAndVerifyStates mirrors a tree with the daemon, stops it, then leaves one
// session as it is (synced), appends a line to one (pending), a partial line to another
// (torn), deletes one (local file missing), rewrites a middle line of one (drifted) and
// creates one (not yet mirrored). status and verify must say so of each.
func TestStatusAndVerifyStates(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	srv := natstest.Run(t)
	root := t.TempDir()
	var files []*sessiontest.File
	for i := range 5 {
		f := sessiontest.New(rng, root, "/home/dev/status", sessiontest.HarnessV3)
		lines := [][]byte{f.HeaderLine("/home/dev/status")}
		for range 6 + i {
			lines = append(lines, f.Entry(300))
		}
		if err := f.Append(lines...); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	nc := natstest.Connect(t, srv.URL())
	allMirrored(t, newReader(t, nc, "t1", "alice"), root, 60*time.Second)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}

	synced, pending, torn, deleted, drifted := files[0], files[1], files[2], files[3], files[4]
	if err := pending.Append(pending.Entry(400)); err != nil {
		t.Fatal(err)
	}
	if err := sessiontest.AppendBytes(torn.Path, []byte(`{"type":"message","id":"half`)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(deleted.Path); err != nil {
		t.Fatal(err)
	}
	changed := append([][]byte(nil), drifted.Lines...)
	changed[3] = []byte(`{"type":"custom","id":"0badf00d","parentId":null,"timestamp":"2026-11-01T09:00:00.000Z","customType":"edited"}`)
	if err := os.WriteFile(drifted.Path, mirrortest.JoinLines(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := sessiontest.New(rng, root, "/home/dev/new", sessiontest.CLIV3)
	if err := fresh.Append(fresh.HeaderLine("/home/dev/new"), fresh.Entry(200)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice", "--root", root}

	t.Run("status", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		rep, _ := statusJSON(t, ctx, args)
		want := map[string]verify.State{
			synced.Path: verify.StateSynced, pending.Path: verify.StatePending, torn.Path: verify.StateTorn,
			deleted.Path: verify.StateMissing, drifted.Path: verify.StateError, fresh.Path: verify.StateNotMirrored,
		}
		got := map[string]verify.State{}
		for _, s := range rep.Sessions {
			got[s.Path] = s.State
			if s.Path == synced.Path && (s.Percent != 100 || s.Generation != 1 || s.MirroredBytes != int64(len(synced.Content()))) {
				t.Errorf("synced session: %+v", s)
			}
			if s.Path == pending.Path && (s.Percent >= 100 || s.LagSeconds <= 0) {
				t.Errorf("pending session: %+v", s)
			}
		}
		for p, w := range want {
			if got[p] != w {
				t.Errorf("%s: state %q, want %q", filepath.Base(p), got[p], w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%d sessions reported, want %d", len(got), len(want))
		}
		if rep.Mirror.Conversations != 5 || rep.Mirror.Hosts != 1 || rep.Local.Sessions != 6 {
			t.Errorf("totals: host %+v, mirror %+v", rep.Local, rep.Mirror)
		}

		stdout.Reset()
		if err := StatusCommand(ctx, args, &stdout, &stderr); err != nil {
			t.Fatal(err)
		}
		t.Log("\n" + stdout.String())
		for _, w := range []string{"STATE", "synced", "pending", "torn", "local-missing", "not-mirrored", "error", "mirror, tenant t1, owner alice"} {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("table lacks %q:\n%s", w, stdout.String())
			}
		}
	})

	t.Run("verify", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		doc, err := verifyJSON(t, ctx, args)
		if !errors.Is(err, errSilent) {
			t.Fatalf("verify with a drifted file: %v, want a failure", err)
		}
		got := map[string]verifyFile{}
		for _, f := range doc.Files {
			got[f.Path] = f
		}
		check := func(path, result string, ok func(*verify.Drift) bool) {
			t.Helper()
			f := got[path]
			if f.Result != result || (ok != nil && (f.Drift == nil || !ok(f.Drift))) {
				t.Errorf("%s: %+v %+v, want %s", filepath.Base(path), f, f.Drift, result)
			}
		}
		check(synced.Path, verifyOK, func(d *verify.Drift) bool { return d.PendingLines == 0 && d.LocalLines == int64(len(synced.Lines)) })
		check(pending.Path, verifyOK, func(d *verify.Drift) bool { return d.PendingLines == 1 })
		check(torn.Path, verifyOK, func(d *verify.Drift) bool { return d.TornBytes > 0 })
		check(deleted.Path, verifyMissing, nil)
		check(fresh.Path, verifyNotMirrored, nil)
		check(drifted.Path, verifyDrift, func(d *verify.Drift) bool {
			return len(d.Items) == 1 && d.Items[0].Kind == verify.DriftChanged && d.Items[0].Line == 4
		})

		stdout.Reset()
		_ = VerifyCommand(ctx, args, &stdout, &stderr)
		t.Log("\n" + stdout.String())
		for _, w := range []string{"drift", "changed  line 4 differs from mirror line 4", "1 drifted"} {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("text output lacks %q:\n%s", w, stdout.String())
			}
		}
		// Without the drifted file, verify succeeds.
		if err := os.WriteFile(drifted.Path, drifted.Content(), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := VerifyCommand(ctx, args, &stdout, &stderr); err != nil {
			t.Errorf("verify after the drift was undone: %v\n%s", err, stdout.String())
		}
	})
}

// verifyJSON runs `pisync verify --json` and decodes its output.
func verifyJSON(t *testing.T, ctx context.Context, args []string) (verifyDoc, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := VerifyCommand(ctx, append(args, "--json"), &stdout, &stderr)
	var doc verifyDoc
	if jerr := json.Unmarshal(stdout.Bytes(), &doc); jerr != nil {
		t.Fatalf("%v\n%s%s", jerr, stdout.String(), stderr.String())
	}
	return doc, err
}

// statusJSON runs `pisync status --json`, decodes its output and returns it with what
// the command wrote on stderr.
func statusJSON(t *testing.T, ctx context.Context, args []string) (verify.StatusReport, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := StatusCommand(ctx, append(args, "--json"), &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var rep verify.StatusReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	return rep, stderr.String()
}
