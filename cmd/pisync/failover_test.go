package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
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
	c.Reset(c.Format, completeLines(content))
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
