package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/natstest"
	"github.com/pisync/pisync/internal/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// TestHeaderOnlyOverwriteIsUndoable: a mirrored session overwritten in place by a fresh
// header (Pi's SessionManager.open on a file it cannot parse, Pi #6002; oh-my-pi's resume
// on a corrupt header, oh-my-pi #9915) becomes a generation that lacks every entry.
// `pisync history` shows it shrunk; `pisync recover --all` refuses it, lists the
// generations and exits non-zero; `--generation 1` restores the session byte for byte.
func TestHeaderOnlyOverwriteIsUndoable(t *testing.T) {
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

	if err := sessiontest.Rewrite(f.Path, [][]byte{f.Lines[0]}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "generation 2 of the overwritten session", func() (bool, string) {
		g := readGen(t, r, f.ID, 0)
		return g.Number == 2 && len(g.Msgs) == 1, "not yet"
	})

	conn := []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice"}
	ctx := context.Background()
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
}
