package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/internal/verify"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// treeOf maps each session file under root (relative path) to its content.
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range sessionFiles(t, root) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = string(b)
	}
	return out
}

func sameTree(t *testing.T, got, want map[string]string) {
	t.Helper()
	for rel, w := range want {
		g, ok := got[rel]
		switch {
		case !ok:
			t.Errorf("%s: not recovered", rel)
		case g != w:
			t.Errorf("%s: recovered file differs (%d bytes, want %d)", rel, len(g), len(w))
		}
	}
	for rel := range got {
		if _, ok := want[rel]; !ok {
			t.Errorf("%s: recovered, but was not there", rel)
		}
	}
}

// TestRecoverAllIntoDeletedTree is the restore of a lost session volume: mirror a tree
// with the daemon, delete it, `recover --all` into it, and get every file back byte for
// byte (blobs, raw lines, v1 files and header-only files included); then again with
// --out in Pi's layout and --json; then refusals on a tree that changed since.
func TestRecoverAllIntoDeletedTree(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	srv := natstest.Run(t)
	root := filepath.Join(t.TempDir(), "sessions")
	files := writeSessions(t, rng, root, 12, 15)
	if err := files[0].Append([]byte(""), []byte(`{"type":"message","id":"trunc`)); err != nil {
		t.Fatal(err)
	}
	if err := files[1].Append(files[1].ImageEntry(600 << 10)); err != nil { // a blob
		t.Fatal(err)
	}
	headerOnly := sessiontest.New(rng, root, "/srv/empty", sessiontest.HarnessV3)
	if err := headerOnly.Append(headerOnly.HeaderLine("/srv/empty")); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	nc := natstest.Connect(t, srv.URL())
	allMirrored(t, newReader(t, nc, "t1", "alice"), root, 60*time.Second)
	if err := d.stop(); err != nil { // flushes the heads
		t.Fatal(err)
	}
	want := treeOf(t, root)
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice", "--root", root}

	var stdout, stderr bytes.Buffer
	if err := RecoverCommand(ctx, append(conn, "--all"), &stdout, &stderr); err != nil {
		t.Fatalf("recover --all: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	sameTree(t, treeOf(t, root), want)
	n := len(want)
	if !strings.Contains(stdout.String(), fmt.Sprintf("%d conversations: %d written", n, n)) {
		t.Errorf("summary:\n%s", stdout.String())
	}

	out := t.TempDir()
	stdout.Reset()
	if err := RecoverCommand(ctx, append(conn, "--all", "--out", out, "--json"), &stdout, &stderr); err != nil {
		t.Fatalf("recover --all --out --json: %v\n%s", err, stderr.String())
	}
	var doc struct {
		Conversations []recovery.Report `json:"conversations"`
		Summary       recovery.Summary  `json:"summary"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout.String())
	}
	if doc.Summary.Written != len(want) || len(doc.Conversations) != len(want) {
		t.Errorf("json summary %+v", doc.Summary)
	}
	for _, r := range doc.Conversations {
		if !r.Complete || len(r.Placeholders) != 0 || r.HeadCheck != "ok" {
			t.Errorf("%s: complete %v, placeholders %v, head check %q", r.Key, r.Complete, r.Placeholders, r.HeadCheck)
		}
	}
	sameTree(t, treeOf(t, out), want) // the daemon's files are in Pi's layout already

	// The tree changed since: one file has a line the mirror lacks, one is an older copy.
	extra := filepath.Join(root, filepath.FromSlash(relOf(t, root, files[2].Path)))
	if err := sessiontest.AppendBytes(extra, append(files[2].Entry(300), '\n')); err != nil {
		t.Fatal(err)
	}
	older := files[3].Path
	if err := os.WriteFile(older, files[3].Content()[:len(files[3].Lines[0])+1], 0o600); err != nil {
		t.Fatal(err)
	}
	before := treeOf(t, root)
	stdout.Reset()
	err := RecoverCommand(ctx, append(conn, "--all"), &stdout, &stderr)
	if !errors.Is(err, errSilent) {
		t.Fatalf("recover over a changed tree: %v, want a failure reported in the output\n%s", err, stdout.String())
	}
	text := stdout.String()
	for _, w := range []string{"holds what the mirror lacks: line 17", "exists and differs from the rebuilt file; --force overwrites it",
		fmt.Sprintf("%d conversations: 0 written, %d unchanged, 0 dry-run, 2 refused", n, n-2)} {
		if !strings.Contains(text, w) {
			t.Errorf("output lacks %q:\n%s", w, text)
		}
	}
	sameTree(t, treeOf(t, root), before)
}

func relOf(t *testing.T, root, path string) string {
	rel, err := filepath.Rel(root, path)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.ToSlash(rel)
}

// TestRecoverUsage: command lines that cannot work are usage errors (exit code 2), found
// before anything connects.
func TestRecoverUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--all", "--conversation", "x"},
		{"--all", "--generation", "-1"},
		{"--all", "--parallel", "0"},
		{"--all", "stray"},
		{"--no-such-flag"},
	} {
		var stdout, stderr bytes.Buffer
		err := RecoverCommand(context.Background(), args, &stdout, &stderr)
		if !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
		if code := exitCode(err, &stderr); code != exitUsage {
			t.Errorf("%q: exit code %d", args, code)
		}
	}
}

// TestCommandsWithoutHeads: a conversation whose head was never written and one whose
// head does not decode are neither hidden nor allowed to stop the others. status shows
// their files as no-head and warns of the bad head by its key; verify compares their
// files with the stream and fails for the bad head; recover --all lists them from the
// stream: with --out, or under a single --root, it writes them; under several roots it
// refuses them (no recorded root) and exits non-zero. A head placing files outside --root is refused, in the text and
// --json reports, with a non-zero exit code.
func TestCommandsWithoutHeads(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	srv := natstest.Run(t)
	root := filepath.Join(t.TempDir(), "sessions")
	files := writeSessions(t, rng, root, 4, 5)
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	nc := natstest.Connect(t, srv.URL())
	allMirrored(t, newReader(t, nc, "t1", "alice"), root, 60*time.Second)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, mirror.DefaultNames().HeadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	owner, _ := mirror.NewOwner("t1", "alice")
	headKey := func(f *sessiontest.File) string {
		c, _ := mirror.NewConv(owner, f.ID)
		return c.HeadKey()
	}
	missing, bad := files[1], files[2]
	if err := kv.Delete(ctx, headKey(missing)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, headKey(bad), []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	conn := []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice"}
	survey := append(append([]string{}, conn...), "--root", root)

	t.Run("status", func(t *testing.T) {
		rep, stderr := statusJSON(t, ctx, survey)
		for _, s := range rep.Sessions {
			want := verify.StateSynced
			if s.Path == missing.Path || s.Path == bad.Path {
				want = verify.StateNoHead
			}
			if s.State != want {
				t.Errorf("%s: %s (%s), want %s", filepath.Base(s.Path), s.State, s.Detail, want)
			}
		}
		if m := rep.Mirror; len(rep.Sessions) != 4 || m.Conversations != 4 || m.WithoutHead != 2 || m.BadHeads != 1 {
			t.Errorf("%d sessions; mirror totals %+v", len(rep.Sessions), m)
		}
		if !strings.Contains(stderr, headKey(bad)) || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], headKey(bad)) {
			t.Errorf("the bad head is not named: stderr %q, warnings %q", stderr, rep.Warnings)
		}
	})

	t.Run("verify", func(t *testing.T) {
		doc, err := verifyJSON(t, ctx, survey)
		if !errors.Is(err, errSilent) {
			t.Fatalf("verify with a head that does not decode: %v, want a failure", err)
		}
		for _, f := range doc.Files {
			if f.Result != verifyOK || ((f.Path == missing.Path || f.Path == bad.Path) != (f.Key != "")) {
				t.Errorf("%+v", f)
			}
		}
		if len(doc.Files) != 4 || len(doc.Warnings) != 1 || !strings.Contains(doc.Warnings[0], headKey(bad)) {
			t.Errorf("%d files, warnings %q", len(doc.Files), doc.Warnings)
		}
	})

	want := treeOf(t, root)
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}

	t.Run("status and verify with the files gone", func(t *testing.T) {
		rep, _ := statusJSON(t, ctx, survey)
		var keys []string
		for _, h := range rep.Headless {
			keys = append(keys, h.Key)
		}
		if fmt.Sprint(keys) != fmt.Sprint(sortedIDs(missing.ID, bad.ID)) || rep.Mirror.Conversations != 4 {
			t.Errorf("conversations without a head %v, totals %+v", keys, rep.Mirror)
		}
		var stdout, stderr bytes.Buffer
		if err := StatusCommand(ctx, survey, &stdout, &stderr); err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{"2 without a usable head", "conversation " + missing.ID + ": 6 lines in the stream, no usable head (the heads bucket has no head for it)",
			"conversation " + bad.ID + ": 6 lines in the stream, no usable head (undecodable head"} {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("status lacks %q:\n%s", w, stdout.String())
			}
		}
		doc, _ := verifyJSON(t, ctx, survey)
		if doc.Summary[verifyNoHead] != 2 || doc.Summary[verifyMissing] != 2 {
			t.Errorf("verify summary %v", doc.Summary)
		}
		stdout.Reset()
		_ = VerifyCommand(ctx, survey, &stdout, &stderr)
		for _, w := range []string{"no-head       conversation " + missing.ID, "2 conversations without a usable head, 1 heads that do not decode"} {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("verify lacks %q:\n%s", w, stdout.String())
			}
		}
	})

	t.Run("recover into the roots", func(t *testing.T) {
		// Under a single root, the conversations without a usable head go where their
		// lines were mirrored from: the whole tree comes back.
		var stdout, stderr bytes.Buffer
		if err := RecoverCommand(ctx, append(survey, "--all"), &stdout, &stderr); err != nil {
			t.Fatalf("recover --all into one root: %v\n%s", err, stdout.String())
		}
		if !strings.Contains(stdout.String(), "4 conversations: 4 written") {
			t.Errorf("output:\n%s", stdout.String())
		}
		if !strings.Contains(stderr.String(), "warning: head "+headKey(bad)) {
			t.Errorf("stderr does not name the bad head:\n%s", stderr.String())
		}
		sameTree(t, treeOf(t, root), want)
		if err := os.RemoveAll(root); err != nil {
			t.Fatal(err)
		}
		// With two roots nothing says which was theirs: refused, the others written.
		stdout.Reset()
		two := append(append([]string{}, survey...), "--root", filepath.Join(t.TempDir(), "second"), "--all")
		err := RecoverCommand(ctx, two, &stdout, &stderr)
		if !errors.Is(err, errSilent) {
			t.Fatalf("recover --all with conversations it cannot place: %v, want a failure\n%s", err, stdout.String())
		}
		text := stdout.String()
		for _, w := range []string{"refused   " + missing.ID, "refused   " + bad.ID, "give the one to restore into with a single --root",
			"4 conversations: 2 written, 0 unchanged, 0 dry-run, 2 refused"} {
			if !strings.Contains(text, w) {
				t.Errorf("output lacks %q:\n%s", w, text)
			}
		}
	})

	t.Run("recover with --out", func(t *testing.T) {
		out := t.TempDir()
		doc := recoverJSON(t, exitOK, append(conn, "--all", "--out", out)...)
		if doc.Summary.Written != 4 || len(doc.Warnings) != 1 || !strings.Contains(doc.Warnings[0], headKey(bad)) {
			t.Errorf("summary %+v, warnings %q", doc.Summary, doc.Warnings)
		}
		sameTree(t, treeOf(t, out), want)
	})

	t.Run("recover outside the roots", func(t *testing.T) {
		if err := os.RemoveAll(root); err != nil {
			t.Fatal(err)
		}
		other := filepath.Join(t.TempDir(), "other")
		args := append(append([]string{}, conn...), "--root", other, "--conversation", files[0].ID)
		doc := recoverJSON(t, exitFail, args...)
		if r := doc.Conversations[0]; r.Result != recovery.Refused || !strings.Contains(r.Reason, "outside the roots") ||
			!strings.Contains(r.Reason, root) || !strings.Contains(r.Reason, "--root") {
			t.Errorf("%s: %s", r.Result, r.Reason)
		}
		var stdout, stderr bytes.Buffer
		if err := RecoverCommand(ctx, args, &stdout, &stderr); !errors.Is(err, errSilent) || !strings.Contains(stdout.String(), "outside the roots") {
			t.Errorf("text report: %v\n%s", err, stdout.String())
		}
		t.Setenv("PISYNC_ROOT", other+string(filepath.ListSeparator)+root)
		doc = recoverJSON(t, exitOK, append(append([]string{}, conn...), "--conversation", files[0].ID)...)
		if r := doc.Conversations[0]; r.Result != recovery.Written {
			t.Errorf("with its root in PISYNC_ROOT: %s: %s", r.Result, r.Reason)
		}
		for _, p := range []string{other, filepath.Dir(other)} {
			if entries, _ := os.ReadDir(p); len(entries) > 1 || (p == other && len(entries) > 0) {
				t.Errorf("%s: written into %v", p, entries)
			}
		}
	})
}

func sortedIDs(ids ...string) []string {
	sort.Strings(ids)
	return ids
}
