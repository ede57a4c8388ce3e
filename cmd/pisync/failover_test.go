package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/internal/verify"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// standbyCase is one session of the primary and what its standby copy must become.
type standbyCase struct {
	name string
	file *sessiontest.File
	// what `pisync recover` makes of it on the standby
	synthesized  bool // a header recovery made (the file has none)
	placeholders int  // entries recovery made for missing parents
	// what the standby's daemon then does with it
	generation int // the generation its lines after the failover go to
}

// TestFailoverToStandby: host a mirrors its sessions; the standby's copy is rebuilt from
// the mirror by `pisync recover`; a stops and `pisync run` starts on the copy as host b,
// with a state directory of its own. A copy that is exactly the mirror's lines continues
// its conversation: the lines appended after the failover go to the same key and the
// same generation, each once, and the head then names host b. A copy recovery had to
// make up lines for (a synthesized header, a placeholder for a line the mirror lacks) is
// not the mirror's lines: it is mirrored as a new generation of its conversation. No
// copy gets a key of its own.
func TestFailoverToStandby(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 2))
	srv := natstest.Run(t)
	base := t.TempDir()
	rootA, rootB := filepath.Join(base, "a", "sessions"), filepath.Join(base, "b", "sessions")

	plain := sessiontest.New(rng, rootA, "/home/dev/app", sessiontest.CLIV3)
	mustAppend(t, plain, plain.HeaderLine("/home/dev/app"), plain.Message(300), plain.Message(300), plain.Message(300))
	harness := sessiontest.New(rng, rootA, "/home/dev/harness", sessiontest.HarnessV3)
	mustAppend(t, harness, harness.HeaderLine("/home/dev/harness"), harness.Entry(300), harness.Entry(300), harness.Entry(300))
	headerless := sessiontest.New(rng, rootA, "/home/dev/tool", sessiontest.CLIV3) // Pi #8939: no header line
	mustAppend(t, headerless, headerless.Message(300), headerless.Message(300))
	gap := sessiontest.New(rng, rootA, "/home/dev/gap", sessiontest.CLIV3) // a line over --max-line-bytes
	mustAppend(t, gap, gap.HeaderLine("/home/dev/gap"), gap.Message(300), gap.Message(8<<10), gap.Message(300))
	cases := []standbyCase{
		{name: "cli v3", file: plain, generation: 1},
		{name: "harness v3", file: harness, generation: 1},
		{name: "headerless", file: headerless, synthesized: true, generation: 2},
		{name: "a line the mirror lacks", file: gap, placeholders: 1, generation: 2},
	}

	a := startTestDaemon(t, "--nats", srv.URL(), "--root", rootA, "--state-dir", filepath.Join(base, "a", "state"),
		"--host", "host-a", "--max-line-bytes", "4096")
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	waitFor(t, 30*time.Second, "host a's sessions mirrored", func() (bool, string) {
		for _, tc := range cases {
			if h, err := headOf(r, tc.file.ID); err != nil || h.LastOrdinal != int64(len(tc.file.Lines)-1) {
				return false, fmt.Sprintf("%s: %+v %v", tc.name, h, err)
			}
		}
		return true, ""
	})
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}

	conn := []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice"}
	doc := recoverJSON(t, 0, append(conn, "--all", "--out", rootB)...)
	copies := map[string]*sessiontest.File{}
	for _, tc := range cases {
		var rep *recovery.Report
		for i := range doc.Conversations {
			if doc.Conversations[i].Key == tc.file.ID {
				rep = &doc.Conversations[i]
			}
		}
		if rep == nil || rep.HeaderSynthesized != tc.synthesized || len(rep.Placeholders) != tc.placeholders {
			t.Fatalf("%s: recovered %+v, want header synthesized %v, %d placeholders", tc.name, rep, tc.synthesized, tc.placeholders)
		}
		copies[tc.file.ID] = standbyCopy(t, rng, tc.file, rootA, rootB)
	}

	b := startTestDaemon(t, "--nats", srv.URL(), "--root", rootB, "--state-dir", filepath.Join(base, "b", "state"), "--host", "host-b")
	defer b.stop()
	for _, tc := range cases {
		c := copies[tc.file.ID]
		mustAppend(t, c, c.Message(200), c.Message(200))
	}
	allMirrored(t, r, rootB, 30*time.Second)
	waitFor(t, 30*time.Second, "host b's heads", func() (bool, string) {
		for _, tc := range cases {
			h, err := headOf(r, tc.file.ID)
			if err != nil || h.Host != "host-b" || h.Entries != int64(len(copies[tc.file.ID].Lines)) {
				return false, fmt.Sprintf("%s: %+v %v", tc.name, h, err)
			}
		}
		return true, ""
	})

	msgs := readStream(t, nc)
	if dups := duplicates(msgs); len(dups) > 0 {
		t.Errorf("messages stored twice: %v", dups)
	}
	requireNoDuplicateAcks(t, b)
	byKey := messagesByKey(msgs)
	var keys []string
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.Contains(k, "~") {
			t.Errorf("conversation key %s: a failover gives no copy a key of its own", k)
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := copies[tc.file.ID]
			gens := byKey[tc.file.ID]
			top := 0
			for g := range gens {
				top = max(top, g)
			}
			if top != tc.generation {
				t.Fatalf("newest generation %d, want %d", top, tc.generation)
			}
			for g, ms := range gens {
				seen := map[int64]int{}
				for _, m := range ms {
					if seen[m.line.Ordinal]++; seen[m.line.Ordinal] > 1 {
						t.Errorf("generation %d: ordinal %d stored twice", g, m.line.Ordinal)
					}
				}
			}
			newest := gens[top]
			if len(newest) != len(c.Lines) {
				t.Fatalf("generation %d holds %d lines, the copy %d", top, len(newest), len(c.Lines))
			}
			hosts := map[string]int{}
			for _, m := range newest {
				hosts[m.line.Host]++
			}
			want := map[string]int{"host-a": len(c.Lines) - 2, "host-b": 2}
			if tc.generation > 1 {
				want = map[string]int{"host-b": len(c.Lines)}
			}
			if fmt.Sprint(hosts) != fmt.Sprint(want) {
				t.Errorf("lines by host %v, want %v", hosts, want)
			}
		})
	}
}

func mustAppend(t *testing.T, f *sessiontest.File, lines ...[]byte) {
	t.Helper()
	if err := f.Append(lines...); err != nil {
		t.Fatal(err)
	}
}

// headOf reads the head of conversation key.
func headOf(r *mirror.Reader, key string) (mirror.Head, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := r.Conv(key)
	if err != nil {
		return mirror.Head{}, err
	}
	h, _, err := r.Head(ctx, c)
	return h, err
}

// standbyCopy is the generator of the copy of f that recovery wrote under rootB (at the
// path f has under rootA), continuing from the copy's own lines.
func standbyCopy(t *testing.T, rng *rand.Rand, f *sessiontest.File, rootA, rootB string) *sessiontest.File {
	t.Helper()
	rel, err := filepath.Rel(rootA, f.Path)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(rootB, rel)
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c := f.Clone(rand.New(rand.NewPCG(rng.Uint64(), 1)), path)
	c.Reset(c.Format, session.SplitLines(content))
	return c
}

// messagesByKey groups the stream's messages by conversation key and generation.
func messagesByKey(msgs []streamMsg) map[string]map[int][]streamMsg {
	out := map[string]map[int][]streamMsg{}
	for _, m := range msgs {
		key, err := mirror.DecodeToken(m.subject[strings.LastIndexByte(m.subject, '.')+1:])
		if err != nil {
			continue
		}
		if out[key] == nil {
			out[key] = map[int][]streamMsg{}
		}
		out[key][m.line.Generation] = append(out[key][m.line.Generation], m)
	}
	return out
}

// TestFailoverPrimaryComesBack: after host b took over from its recovered copies, host a
// comes back with its state directory. Its file of one conversation was appended to
// while b appended to its copy: both histories are kept, neither in the other: the
// conversation's key holds b's copy (recovered byte for byte), a key of a's own the whole
// of a's file; status on either host says diverged, naming both; history lists both. A's
// file of the other conversation, which it did not append to, changes nothing in the
// mirror.
func TestFailoverPrimaryComesBack(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 4))
	srv := natstest.Run(t)
	base := t.TempDir()
	rootA, rootB := filepath.Join(base, "a", "sessions"), filepath.Join(base, "b", "sessions")
	stateA := filepath.Join(base, "a", "state")
	var files []*sessiontest.File
	for _, cwd := range []string{"/home/dev/diverges", "/home/dev/quiet"} {
		f := sessiontest.New(rng, rootA, cwd, sessiontest.CLIV3)
		mustAppend(t, f, f.HeaderLine(cwd), f.Message(300), f.Message(300))
		files = append(files, f)
	}
	diverging, quiet := files[0], files[1]
	shared := len(diverging.Lines)
	runA := func() *daemon {
		return startTestDaemon(t, "--nats", srv.URL(), "--root", rootA, "--state-dir", stateA, "--host", "host-a")
	}
	a := runA()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, rootA, 30*time.Second)
	waitHeads(t, r, "host-a", files...)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}

	conn := []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice"}
	recoverJSON(t, 0, append(conn, "--all", "--out", rootB)...)
	copies := map[string]*sessiontest.File{}
	for _, f := range files {
		copies[f.ID] = standbyCopy(t, rng, f, rootA, rootB)
	}
	b := startTestDaemon(t, "--nats", srv.URL(), "--root", rootB, "--state-dir", filepath.Join(base, "b", "state"), "--host", "host-b")
	for _, f := range files {
		c := copies[f.ID]
		mustAppend(t, c, c.Message(200))
	}
	allMirrored(t, r, rootB, 30*time.Second)
	waitHeads(t, r, "host-b", copies[diverging.ID], copies[quiet.ID])
	before := headsText(t, r)

	// Host a's Pi wrote to one session while it was cut off; its daemon comes back.
	mustAppend(t, diverging, diverging.Message(250), diverging.Message(250))
	a = runA()
	dkey := ""
	waitFor(t, 30*time.Second, "host a's copy mirrored apart", func() (bool, string) {
		heads, err := r.Heads(context.Background())
		if err != nil {
			return false, err.Error()
		}
		for _, h := range heads {
			if h.DivergedFrom != nil && h.Host == "host-a" && h.Entries == int64(len(diverging.Lines)) {
				dkey = h.ConvKey()
				return true, ""
			}
		}
		return false, "no diverged head yet"
	})
	requireNoDuplicateAcks(t, a)
	requireNoDuplicateAcks(t, b)
	if n := metricValue(t, a, "pisync_conversation_divergences_total", nil); n != 1 {
		t.Errorf("pisync_conversation_divergences_total %v, want 1", n)
	}
	doc := a.status() // the status page says it too
	if len(doc.Diverged) != 1 || doc.Diverged[0].Path != diverging.Path || doc.Diverged[0].Key != dkey || doc.Diverged[0].From.Host != "host-b" {
		t.Errorf("status page: diverged %+v", doc.Diverged)
	}
	var page bytes.Buffer
	if err := statusPage.Execute(&page, statusView{statusDoc: doc, Now: doc.Time, Refresh: 5}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "Sessions mirrored apart") || !strings.Contains(page.String(), "pisync recover --conversation "+dkey) {
		t.Errorf("the status page does not show the diverged copy")
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}

	msgs := readStream(t, nc)
	if dups := duplicates(msgs); len(dups) > 0 {
		t.Errorf("messages stored twice: %v", dups)
	}
	byKey := messagesByKey(msgs)
	if len(byKey) != 3 {
		t.Errorf("conversation keys %v, want the two conversations and one diverged copy", keysText(byKey))
	}
	for key, want := range map[string]*sessiontest.File{diverging.ID: copies[diverging.ID], quiet.ID: copies[quiet.ID], dkey: diverging} {
		if gens := byKey[key]; len(gens) != 1 || len(gens[1]) != len(want.Lines) {
			t.Errorf("%s: generations %v, want generation 1 with %d lines", key, keysText(map[string]map[int][]streamMsg{key: gens}), len(want.Lines))
		}
	}
	// The quiet conversation's head is b's still; the diverged one's too.
	after := headsText(t, r)
	for _, key := range []string{diverging.ID, quiet.ID} {
		if !strings.Contains(after, headLine(before, key)) {
			t.Errorf("head of %s changed:\nbefore %s\nafter  %s", key, before, after)
		}
	}

	ctx := context.Background()
	t.Run("status", func(t *testing.T) {
		for _, tc := range []struct {
			host, root string
			want       map[string]verify.State
		}{
			{"host-a", rootA, map[string]verify.State{diverging.Path: verify.StateDiverged, quiet.Path: verify.StateBehind}},
			{"host-b", rootB, map[string]verify.State{copies[diverging.ID].Path: verify.StateDiverged, copies[quiet.ID].Path: verify.StateSynced}},
		} {
			rep, _ := statusJSON(t, ctx, append(append([]string{}, conn...), "--root", tc.root, "--host", tc.host))
			if len(rep.Sessions) != len(tc.want) {
				t.Errorf("on %s: %d sessions, want %d", tc.host, len(rep.Sessions), len(tc.want))
			}
			for _, s := range rep.Sessions {
				if want, ok := tc.want[s.Path]; !ok || s.State != want {
					t.Errorf("on %s: %s is %s (%s), want %s", tc.host, s.Path, s.State, s.Detail, want)
				}
				if s.State == verify.StateDiverged && (!strings.Contains(s.Detail, "host-a's") || !strings.Contains(s.Detail, "host-b's") || !strings.Contains(s.Detail, dkey)) {
					t.Errorf("on %s: %s: detail %q names not both hosts and the copy's key", tc.host, s.Path, s.Detail)
				}
			}
			if rep.Mirror.Diverged != 1 {
				t.Errorf("on %s: mirror totals %+v", tc.host, rep.Mirror)
			}
		}
	})
	t.Run("history", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if err := HistoryCommand(ctx, append([]string{diverging.ID}, conn...), &stdout, &stderr); err != nil {
			t.Fatalf("history: %v\n%s", err, stderr.String())
		}
		want := fmt.Sprintf("diverged: host host-a's copy, mirrored apart after line %d of conversation %s (generation 1), which host host-b continues", shared, diverging.ID)
		if !strings.Contains(stdout.String(), want) || !strings.Contains(stdout.String(), "conversation "+dkey) {
			t.Errorf("history lacks %q:\n%s", want, stdout.String())
		}
	})
	t.Run("recover", func(t *testing.T) {
		// b's copy, rebuilt where it was; a's, which is where it was, left alone.
		bPath := copies[diverging.ID].Path
		bBytes := copies[diverging.ID].Content()
		if err := os.Remove(bPath); err != nil {
			t.Fatal(err)
		}
		doc := recoverJSON(t, 0, append(conn, "--conversation", diverging.ID, "--root", rootA, "--root", rootB)...)
		results := map[string]recovery.Result{}
		for _, rep := range doc.Conversations {
			results[rep.Key] = rep.Result
		}
		if len(results) != 2 || results[diverging.ID] != recovery.Written || results[dkey] != recovery.Unchanged {
			t.Errorf("recover: %v", results)
		}
		if got, err := os.ReadFile(bPath); err != nil || !bytes.Equal(got, bBytes) {
			t.Errorf("host b's copy recovered as %d bytes (%v), want its %d bytes", len(got), err, len(bBytes))
		}
		out := t.TempDir()
		recoverJSON(t, 0, append(conn, "--conversation", dkey, "--out", out)...)
		rel, _ := filepath.Rel(rootA, diverging.Path)
		if got, err := os.ReadFile(filepath.Join(out, rel)); err != nil || !bytes.Equal(got, diverging.Content()) {
			t.Errorf("host a's copy recovered as %d bytes (%v), want its %d bytes", len(got), err, len(diverging.Content()))
		}
	})
}

// waitHeads waits until the head of each file's conversation names host and holds all
// of its lines.
func waitHeads(t *testing.T, r *mirror.Reader, host string, files ...*sessiontest.File) {
	t.Helper()
	waitFor(t, 30*time.Second, "heads naming "+host, func() (bool, string) {
		for _, f := range files {
			if h, err := headOf(r, f.ID); err != nil || h.Host != host || h.Entries != int64(len(f.Lines)) {
				return false, fmt.Sprintf("%s: %+v %v", f.ID, h, err)
			}
		}
		return true, ""
	})
}

// headsText is one line per head: key, host, generation, last sequence, entries.
func headsText(t *testing.T, r *mirror.Reader) string {
	t.Helper()
	heads, err := r.Heads(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, h := range heads {
		lines = append(lines, fmt.Sprintf("%s %s gen %d seq %d entries %d", h.ConvKey(), h.Host, h.Generation, h.LastSeq, h.Entries))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// headLine is the line of headsText for key.
func headLine(text, key string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, key+" ") {
			return l
		}
	}
	return "(no head of " + key + ")"
}

func keysText(byKey map[string]map[int][]streamMsg) string {
	var out []string
	for k, gens := range byKey {
		for g, ms := range gens {
			out = append(out, fmt.Sprintf("%s gen %d: %d", k, g, len(ms)))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}
