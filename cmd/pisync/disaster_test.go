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
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/internal/verify"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// TestHeaderOnlyOverwriteIsUndoable: a mirrored session overwritten in place by a fresh
// header (Pi's SessionManager.open on a file it cannot parse, Pi #6002; oh-my-pi's resume
// on a corrupt header, oh-my-pi #9915) becomes a generation that lacks every entry.
// `pisync history` shows it shrunk; `pisync recover --all` refuses it, lists the
// generations and exits non-zero; `--generation 1` restores the session byte for byte.
func TestHeaderOnlyOverwriteIsUndoable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		newID  bool // Pi's fresh header carries a new session id
		rename bool // written to a temporary file and renamed over the session (oh-my-pi)
	}{
		{"same id, in place", false, false},
		{"a new id, in place (Pi #6002)", true, false},
		{"a new id, by rename (oh-my-pi #9915)", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) { headerOnlyOverwrite(t, tc.newID, tc.rename) })
	}
}

func headerOnlyOverwrite(t *testing.T, newID, rename bool) {
	rng := rand.New(rand.NewPCG(61, 62))
	srv := natstest.Run(t)
	root := t.TempDir()
	f := sessiontest.New(rng, root, "/home/dev/app", sessiontest.HarnessV3)
	if err := f.Append(f.HeaderLine("/home/dev/app"), f.Message(300), f.Message(300), f.Message(300)); err != nil {
		t.Fatal(err)
	}
	original := f.Content()
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 20*time.Second)

	fresh := f.Lines[0]
	if newID {
		fresh = bytes.Replace(fresh, []byte(f.ID), []byte("0199ffff-dead-7000-8000-000000000001"), 1)
	}
	if rename {
		tmp := f.Path + ".tmp"
		if err := os.WriteFile(tmp, append(fresh, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.Path); err != nil {
			t.Fatal(err)
		}
	} else if err := sessiontest.Rewrite(f.Path, [][]byte{fresh}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "generation 2 of the overwritten session", func() (bool, string) {
		g := readGen(t, r, f.ID, 0)
		return g.Number == 2 && len(g.Msgs) == 1, "not yet"
	})
	ctx := context.Background()
	// The daemon finds it shrunk: head, metrics, status page; status says so.
	wantShrink := mirror.Shrink{From: 1, Missing: 3, Reason: mirror.ShrinkHeaderOnly}
	waitFor(t, 20*time.Second, "the head marked shrunk", func() (bool, string) {
		h, _, err := r.Head(ctx, mustConv(t, r, f.ID))
		return err == nil && h.Shrunk != nil && *h.Shrunk == wantShrink && h.Generation == 2 && h.Conversation == f.ID,
			fmt.Sprintf("%+v %v", h.Shrunk, err)
	})
	if g, c := metricValue(t, d, "pisync_sessions_shrunk", nil), metricValue(t, d, "pisync_generations_shrunk_total", nil); g != 1 || c != 1 {
		t.Errorf("pisync_sessions_shrunk %v, pisync_generations_shrunk_total %v; want 1, 1", g, c)
	}
	if doc := d.status(); len(doc.Shrunk) != 1 || doc.Shrunk[0].Path != f.Path || doc.Shrunk[0].Shrunk != wantShrink {
		t.Errorf("status page: shrunk %+v", doc.Shrunk)
	}
	conn := []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice"}
	st, _ := statusJSON(t, ctx, append(append([]string{}, conn...), "--root", root, "--host", d.f.host))
	if len(st.Sessions) != 1 || st.Sessions[0].State != verify.StateShrunk || !strings.Contains(st.Sessions[0].Detail, "--generation 1") {
		t.Errorf("status %+v", st.Sessions)
	}
	var stdout, stderr bytes.Buffer
	if err := HistoryCommand(ctx, append([]string{f.ID, "--json"}, conn...), &stdout, &stderr); err != nil {
		t.Fatalf("history: %v\n%s", err, stderr.String())
	}
	var hist struct {
		Conversations []recovery.ConvHistory `json:"conversations"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &hist); err != nil {
		t.Fatal(err)
	}
	if len(hist.Conversations) != 1 || len(hist.Conversations[0].Generations) != 2 {
		t.Fatalf("history %+v", hist)
	}
	g1, g2 := hist.Conversations[0].Generations[0], hist.Conversations[0].Generations[1]
	if g1.Entries != 3 || g1.Bytes != int64(len(original)) || g1.Shrunk != nil ||
		g2.Entries != 0 || g2.Shrunk == nil || *g2.Shrunk != (mirror.Shrink{From: 1, Missing: 3, Reason: mirror.ShrinkHeaderOnly}) {
		t.Errorf("generations %+v, %+v (shrunk %+v)", g1, g2, g2.Shrunk)
	}
	stdout.Reset()
	if err := HistoryCommand(ctx, append([]string{f.ID}, conn...), &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "shrunk: lacks 3 entries of generation 1 (header-only)") {
		t.Errorf("history text:\n%s", stdout.String())
	}

	// recover --all into the root: refused, with the generations listed, exit 1.
	if err := os.Remove(f.Path); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	err := RecoverCommand(ctx, append(append([]string{}, conn...), "--all", "--root", root), &stdout, &stderr)
	if !errors.Is(err, errSilent) || exitCode(err, &stderr) != exitFail {
		t.Fatalf("recover --all of a shrunk newest generation: %v\n%s", err, stdout.String())
	}
	for _, w := range []string{"refused   " + f.ID, "generation 2 lacks 3 entries of generation 1 (header-only)", "--generation 1",
		"GEN", "shrunk: lacks 3 entries"} {
		if !strings.Contains(stdout.String(), w) {
			t.Errorf("recover output lacks %q:\n%s", w, stdout.String())
		}
	}
	if _, err := os.Stat(f.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused conversation was written: %v", err)
	}
	// The one command that undoes it.
	doc := recoverJSON(t, exitOK, append(append([]string{}, conn...), "--conversation", f.ID, "--generation", "1", "--root", root)...)
	if doc.Conversations[0].Result != recovery.Written {
		t.Fatalf("%+v", doc.Conversations[0])
	}
	got, err := os.ReadFile(f.Path)
	if err != nil || !bytes.Equal(got, original) {
		t.Fatalf("--generation 1 does not restore the session byte for byte (%v)", err)
	}
	// Restored under the running daemon: a generation holding every entry again.
	// The restored file holds generation 2's header and more: the daemon extends
	// generation 2 with the entries, and it lacks nothing any more.
	waitFor(t, 20*time.Second, "the restored session mirrored, not shrunk", func() (bool, string) {
		h, _, err := r.Head(ctx, mustConv(t, r, f.ID))
		return err == nil && h.Generation >= 2 && h.Shrunk == nil && h.Bytes == int64(len(original)) &&
			metricValue(t, d, "pisync_sessions_shrunk", nil) == 0, fmt.Sprintf("%+v %v", h, err)
	})
}

// TestLegitimateRewritesAreNotShrunk: Pi's own rewrites keep every entry (the v1 -> v3
// migration with new ids, an in-place rewrite of the same lines with one appended): new
// generations, never shrunk.
func TestLegitimateRewritesAreNotShrunk(t *testing.T) {
	rng := rand.New(rand.NewPCG(63, 64))
	srv := natstest.Run(t)
	root := t.TempDir()
	v1 := sessiontest.New(rng, root, "/home/dev/old", sessiontest.CLIV1)
	if err := v1.Append(v1.HeaderLine("/home/dev/old"), v1.Entry(200), v1.Entry(200), v1.Entry(200)); err != nil {
		t.Fatal(err)
	}
	v3 := sessiontest.New(rng, root, "/home/dev/new", sessiontest.HarnessV3)
	if err := v3.Append(v3.HeaderLine("/home/dev/new"), v3.Message(200), v3.Message(200), v3.Message(200)); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 20*time.Second)

	migrateV1(t, v1.Path, rng)
	// Same entries rewritten in place with their first byte changed (another id of the
	// same length), then a new entry: Pi rewriting after a repair keeps every entry.
	lines := bytes.SplitAfter(bytes.TrimSuffix(v3.Content(), []byte("\n")), []byte("\n"))
	var rewritten [][]byte
	for _, l := range lines {
		rewritten = append(rewritten, bytes.TrimSuffix(l, []byte("\n")))
	}
	rewritten[0] = bytes.Replace(rewritten[0], []byte(`"cwd":"/home/dev/new"`), []byte(`"cwd":"/home/dev/NEW"`), 1)
	if err := sessiontest.Rewrite(v3.Path, rewritten); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, f := range []*sessiontest.File{v1, v3} {
		want, err := os.ReadFile(f.Path)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "generation 2 of "+f.Path+" mirrored and compared", func() (bool, string) {
			h, _, err := r.Head(ctx, mustConv(t, r, f.ID))
			return err == nil && h.Generation == 2 && h.Bytes == int64(len(want)) && d.pub.ShrinkChecked(f.ID, 2), fmt.Sprintf("%+v %v", h, err)
		})
		h, _, _ := r.Head(ctx, mustConv(t, r, f.ID))
		if h.Shrunk != nil {
			t.Errorf("%s: a rewrite keeping every entry marked shrunk: %+v", f.Path, h.Shrunk)
		}
	}
	if c := metricValue(t, d, "pisync_generations_shrunk_total", nil); c != 0 {
		t.Errorf("pisync_generations_shrunk_total %v", c)
	}
}

// TestEverySessionFileIsMirrored: a session file whatever its first line. One without
// its header (Pi recreated it after a delete, Pi #8939) is mirrored byte for byte under
// the id of its name, its head marked headerless, and recovered after a synthesized
// header with every line as it was; one with oh-my-pi's title record before the header
// (Pi #8880) is mirrored and recovered byte for byte; a title alone waits for its
// header; a .jsonl that is no session is counted, listed and shown skipped.
func TestEverySessionFileIsMirrored(t *testing.T) {
	rng := rand.New(rand.NewPCG(65, 66))
	srv := natstest.Run(t)
	root := t.TempDir()
	// Pi's file, then the same session's entries without the header line.
	whole := sessiontest.New(rng, root, "/home/dev/gone", sessiontest.HarnessV3)
	if err := whole.Append(whole.HeaderLine("/home/dev/gone"), whole.Message(200), whole.Message(200), whole.Message(200)); err != nil {
		t.Fatal(err)
	}
	headerless := whole.Lines[1:] // every line but the header
	if err := os.WriteFile(whole.Path, mirrortest.JoinLines(headerless), 0o600); err != nil {
		t.Fatal(err)
	}
	titled := sessiontest.New(rng, root, "/home/dev/omp", sessiontest.HarnessV3)
	title := []byte(`{"type":"title","v":1,"title":"fix the build","source":"auto","updatedAt":"2026-12-05T14:00:00.000Z","pad":"        "}`)
	if err := titled.Append(title, titled.HeaderLine("/home/dev/omp"), titled.Message(200), titled.Message(200)); err != nil {
		t.Fatal(err)
	}
	waiting := sessiontest.New(rng, root, "/home/dev/omp", sessiontest.HarnessV3)
	if err := waiting.Append(title); err != nil {
		t.Fatal(err)
	}
	notes := filepath.Join(root, "notes.jsonl")
	if err := os.WriteFile(notes, []byte(`{"event":"start"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	stopped := false
	defer func() {
		if !stopped {
			d.stop()
		}
	}()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	// The title alone, then its header and an entry: mirrored once the header is there.
	if err := waiting.Append(waiting.HeaderLine("/home/dev/omp"), waiting.Message(100)); err != nil {
		t.Fatal(err)
	}
	allMirrored(t, r, root, 20*time.Second)
	ctx := context.Background()
	for _, f := range []*sessiontest.File{whole, titled, waiting} {
		c := mustConv(t, r, f.ID)
		if g := readGen(t, r, f.ID, 0); g.Number != 1 {
			t.Errorf("%s: generation %d", f.Path, g.Number)
		}
		size := int64(len(readAll(t, f.Path)))
		waitFor(t, 20*time.Second, "the head of "+f.Path, func() (bool, string) {
			h, _, err := r.Head(ctx, c)
			return err == nil && h.Bytes == size, fmt.Sprint(err)
		})
		if h, _, _ := r.Head(ctx, c); h.Headerless != (f == whole) || h.Cwd == "" {
			t.Errorf("%s: head %+v", f.Path, h)
		}
	}
	if v := metricValue(t, d, "pisync_skipped_files_total", map[string]string{"reason": "not_entries"}); v != 1 {
		t.Errorf("pisync_skipped_files_total{reason=not_entries} %v", v)
	}
	if doc := d.status(); len(doc.SkippedFiles) != 1 || doc.SkippedFiles[0].Path != notes || doc.SkippedFiles[0].Reason != "not_entries" {
		t.Errorf("status page skipped files %+v", doc.SkippedFiles)
	}
	conn := []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice"}
	st, _ := statusJSON(t, ctx, append(append([]string{}, conn...), "--root", root, "--host", d.f.host))
	states := map[string]verify.State{}
	for _, s := range st.Sessions {
		states[s.Path] = s.State
	}
	want := map[string]verify.State{whole.Path: verify.StateSynced, titled.Path: verify.StateSynced, waiting.Path: verify.StateSynced, notes: verify.StateSkipped}
	if fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("status states %v, want %v", states, want)
	}

	// Lost, and recovered into the root.
	originals := map[string][]byte{}
	for _, f := range []*sessiontest.File{whole, titled, waiting} {
		originals[f.Path] = readAll(t, f.Path)
		if err := os.Remove(f.Path); err != nil {
			t.Fatal(err)
		}
	}
	d.stop()
	stopped = true
	doc := recoverJSON(t, exitOK, append(append([]string{}, conn...), "--all", "--root", root)...)
	if doc.Summary.Written != 3 {
		t.Fatalf("recover --all: %+v", doc.Summary)
	}
	for _, f := range []*sessiontest.File{titled, waiting} {
		if got, err := os.ReadFile(f.Path); err != nil || !bytes.Equal(got, originals[f.Path]) {
			t.Errorf("%s: not byte-identical (%v)", f.Path, err)
		}
	}
	got, err := os.ReadFile(whole.Path)
	if err != nil {
		t.Fatal(err)
	}
	first, rest, _ := bytes.Cut(got, []byte("\n"))
	hdr, err := session.ParseHeader(first)
	if err != nil || hdr.ID != whole.ID || hdr.Cwd != "/home/dev/gone" || hdr.Format != session.FormatV3 {
		t.Errorf("synthesized header %q: %+v %v", first, hdr, err)
	}
	if !bytes.Equal(rest, mirrortest.JoinLines(headerless)) {
		t.Errorf("the headerless file's lines are not kept byte for byte after the header:\n%s\nwant\n%s", rest, mirrortest.JoinLines(headerless))
	}
}

// readAll is the content of the file at path.
func readAll(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
