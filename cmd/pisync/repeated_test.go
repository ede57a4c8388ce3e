package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// TestRepeatedEntryIDKeptAndRecovered: two lines of one generation with the same entry id
// shared a message id, and the server dropped the second as a duplicate (guarantee 1).
// A file repeating ids (the same line twice, another line under an earlier id, a blob
// line twice, before start and while running) is mirrored whole, the repeats under their
// ordinal, counted, not counted as duplicates, and recovered byte for byte.
func TestRepeatedEntryIDKeptAndRecovered(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(61, 62))
	srv := natstest.Run(t)
	root := t.TempDir()
	f := sessiontest.New(rng, root, "/home/dev/p", sessiontest.CLIV3)
	e1, e2, e3 := f.Entry(300), f.Entry(400), f.Entry(500)
	idOf := func(line []byte) string {
		env, err := session.ScanEntry(line)
		if err != nil || env.ID == "" {
			t.Fatalf("no entry id in %.60s: %v", line, err)
		}
		return env.ID
	}
	e4 := append(bytes.TrimSuffix(append([]byte(nil), e2...), []byte("}")), []byte(`,"edited":true}`)...) // e2's id, other bytes
	idOf(e4)
	big := f.ImageEntry(700 << 10) // above the blob threshold
	if err := f.Append(f.HeaderLine("/home/dev/p"), e1, e2, e3, e1, e4, big, big); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir())
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 30*time.Second)
	if err := f.Append(f.Entry(300), e3); err != nil { // once more while running
		t.Fatal(err)
	}
	allMirrored(t, r, root, 30*time.Second)
	if n := metricValue(t, d, "pisync_repeated_entry_ids_total", nil); n != 4 {
		t.Errorf("repeated entry ids counted %v, want 4", n)
	}
	if n := metricValue(t, d, "pisync_publish_duplicates_total", nil); n != 0 {
		t.Errorf("duplicates counted %v, want 0", n)
	}
	msgs := readStream(t, nc)
	if dups := duplicates(msgs); len(dups) > 0 {
		t.Errorf("a (conversation, generation, entry) twice in the stream: %v", dups)
	}
	for _, m := range msgs {
		switch m.line.Ordinal {
		case 4, 5, 10:
			if m.line.Kind != mirror.KindRaw || m.line.EntryID != mirror.OrdinalID(m.line.Ordinal) {
				t.Errorf("repeat at ordinal %d mirrored as %s %s, want raw %s", m.line.Ordinal, m.line.Kind, m.line.EntryID, mirror.OrdinalID(m.line.Ordinal))
			}
		case 7:
			if m.line.Kind != mirror.KindBlob || m.line.EntryID != mirror.OrdinalID(7) {
				t.Errorf("repeated blob mirrored as %s %s, want blob L7", m.line.Kind, m.line.EntryID)
			}
		}
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}

	// Pi moves its leaf to a repeated id as to any entry: so does the head.
	c, err := r.Conv(f.ID)
	if err != nil {
		t.Fatal(err)
	}
	head, _, err := r.Head(context.Background(), c)
	if err != nil || head.Head != idOf(e3) {
		t.Errorf("head %q, %v; want the leaf Pi computes, %s (the repeated id last appended)", head.Head, err, idOf(e3))
	}

	want := f.Content()
	if err := os.Remove(f.Path); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	args := []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice", "--root", root, "--conversation", f.ID}
	if err := RecoverCommand(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("recover: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	got, err := os.ReadFile(f.Path)
	if err != nil {
		t.Fatalf("recovered file: %v\n%s", err, stdout.String())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("recovered file differs: %d bytes, want %d\n%s", len(got), len(want), stdout.String())
	}
	if strings.Contains(stdout.String(), "malformed") {
		t.Errorf("recover calls repeated entries malformed:\n%s", stdout.String())
	}
}
