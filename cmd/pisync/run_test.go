package main

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m,
		// nats.go v1.55.0 leaks this goroutine now and then, on its own: each object
		// store Put (a blob) makes a JetStream context whose first async publish starts
		// it, and the Put's deferred cleanup can clear the channel it waits on before
		// it has read it; it then waits on a nil channel for ever. A connection that
		// pisync leaks is still caught, by its read and flush goroutines.
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
		goleak.Cleanup(func(int) { daemontest.Remove() }))
}

// writeSessions creates n sessions of rotating formats with a few entries each.
func writeSessions(t *testing.T, rng *rand.Rand, root string, n, entries int) []*sessiontest.File {
	t.Helper()
	var files []*sessiontest.File
	for i := range n {
		format := sessiontest.Format(i % 4)
		cwd := "/home/dev/project-" + strconv.Itoa(i%5)
		f := sessiontest.New(rng, root, cwd, format)
		lines := [][]byte{f.HeaderLine(cwd)}
		for range entries {
			lines = append(lines, f.Entry(200+rng.IntN(8000)))
		}
		if err := f.Append(lines...); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// TestMirrorsEveryLineOnce is the core guarantee: files on disk before start, files
// created while running and appends to existing ones all reach the stream exactly once,
// byte-identical, with the right headers and ordinals, and the heads follow the leaf rule.
func TestMirrorsEveryLineOnce(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	srv := natstest.Run(t)
	root := t.TempDir()
	files := writeSessions(t, rng, root, 20, 30)

	// Odd but legal content: a blank line, a malformed line, a header-only file, a
	// .jsonl that is not a session.
	if err := files[0].Append([]byte(""), []byte(`{"type":"message","id":"trunc`)); err != nil {
		t.Fatal(err)
	}
	headerOnly := sessiontest.New(rng, root, "/srv/empty", sessiontest.HarnessV3)
	if err := headerOnly.Append(headerOnly.HeaderLine("/srv/empty")); err != nil {
		t.Fatal(err)
	}
	notSession := filepath.Join(root, "notes.jsonl")
	if err := os.WriteFile(notSession, []byte("{\"hello\":1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	defer func() {
		if err := d.stop(); err != nil {
			t.Error(err)
		}
	}()
	for range 5 {
		cwd := "/srv/live"
		f := sessiontest.New(rng, root, cwd, sessiontest.HarnessV3)
		lines := [][]byte{f.HeaderLine(cwd)}
		for range 10 {
			lines = append(lines, f.Entry(300+rng.IntN(2000)))
		}
		if err := f.Append(lines...); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	for i := 0; i < len(files); i += 3 {
		if err := files[i].Append(files[i].Entry(500), files[i].Entry(700)); err != nil {
			t.Fatal(err)
		}
	}
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 60*time.Second)

	requireNoDuplicateAcks(t, d)
	msgs := readStream(t, nc)
	if dups := duplicates(msgs); len(dups) > 0 {
		t.Fatalf("duplicates in the stream: %v", dups)
	}
	total := 0
	for _, f := range append(files, headerOnly) {
		total += len(f.Lines)
	}
	if len(msgs) != total {
		t.Fatalf("stream holds %d messages, files have %d complete lines", len(msgs), total)
	}
	for _, m := range msgs {
		if m.line.Host == "" || m.line.Source == "" || m.line.Format == "" || m.line.Generation != 1 {
			t.Fatalf("message %d lacks metadata: %+v", m.seq, m.line)
		}
		switch {
		case m.line.Ordinal == 0 && (m.line.Kind != mirror.KindHeader || m.line.EntryID != "_header"):
			t.Fatalf("line 1 published as %+v", m.line)
		case m.line.Kind == mirror.KindRaw && m.line.EntryID != mirror.OrdinalID(m.line.Ordinal):
			t.Fatalf("raw line id %q", m.line.EntryID)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, f := range files {
		c, _ := r.Conv(f.ID)
		want := leafOf(t, f.Lines)
		waitFor(t, 10*time.Second, "head of "+f.ID, func() (bool, string) {
			h, _, err := r.Head(ctx, c)
			if err != nil {
				return false, err.Error()
			}
			if h.Head != want || h.Entries != int64(len(f.Lines)) {
				return false, "head " + h.Head + " want " + want + ", entries " + strconv.FormatInt(h.Entries, 10)
			}
			return true, ""
		})
	}
	for _, m := range msgs {
		if m.line.Source == "notes.jsonl" {
			t.Fatal("a file that is not a session was mirrored")
		}
	}
}

// leafOf applies Pi's leaf rule to the entries of a file.
func leafOf(t *testing.T, lines [][]byte) string {
	var l session.Leaf
	for _, line := range lines[1:] {
		if env, err := session.ScanEntry(line); err == nil {
			l.Apply(env)
		}
	}
	return l.ID()
}
