package recovery

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// disasterLines is a v3 session of n entries, each the child of the one before.
func disasterLines(id string, n int) [][]byte {
	lines := [][]byte{[]byte(fmt.Sprintf(`{"type":"session","version":3,"id":%q,"timestamp":"2026-12-05T14:00:00.000Z","cwd":"/home/dev/app"}`, id))}
	parent := "null"
	for i := 1; i <= n; i++ {
		eid := fmt.Sprintf("%08x", i)
		lines = append(lines, []byte(fmt.Sprintf(`{"type":"message","id":%q,"parentId":%s,"timestamp":"2026-12-05T14:00:%02d.000Z","message":{"role":"user","content":"turn %d"}}`, eid, parent, i, i)))
		parent = `"` + eid + `"`
	}
	return lines
}

// TestRecoverRefusesShrunkNewest: a session overwritten in place by a fresh header, or cut
// back to its first lines, is a new generation that lacks entries of the one before.
// recover without --generation refuses it and lists the generations; --generation
// restores either, byte for byte.
func TestRecoverRefusesShrunkNewest(t *testing.T) {
	const id = "0192f0a4-5e1c-7a3b-9c2d-0000000000d1"
	good := disasterLines(id, 4)
	for _, tc := range []struct {
		name   string
		damage [][]byte
		cause  mirror.ShrinkCause
	}{
		{"header-only overwrite", good[:1], mirror.ShrinkHeaderOnly},
		{"truncated to a prefix", good[:3], mirror.ShrinkTruncated},
		{"a line dropped", [][]byte{good[0], good[1], good[3], good[4]}, mirror.ShrinkDropped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm := newTestMirror(t)
			m1 := mirrortest.MirrorFile(t, good, 1, 0)
			tm.Publish(t, m1, m1.Msgs, nil)
			m2 := mirrortest.MirrorFile(t, tc.damage, 2, 0)
			head := mirrortest.DaemonHead(tc.damage, m2, 2)
			tm.Publish(t, m2, m2.Msgs, &head)

			out := t.TempDir()
			rep := New(tm.Reader, Options{Out: out}).One(mirrortest.Ctx(t), id)
			if rep.Result != Refused || !strings.Contains(rep.Reason, ErrShrunk.Error()) || !strings.Contains(rep.Reason, "--generation 1") {
				t.Fatalf("newest shrunk generation: %s: %s", rep.Result, rep.Reason)
			}
			if len(rep.History) != 2 || rep.History[1].Shrunk == nil || rep.History[1].Shrunk.Reason != tc.cause ||
				rep.History[1].Shrunk.From != 1 || rep.History[1].Shrunk.Missing != int64(len(good)-len(tc.damage)) {
				t.Fatalf("history %+v", rep.History)
			}
			if entries, _ := os.ReadDir(out); len(entries) != 0 {
				t.Fatalf("a refused conversation wrote %v", entries)
			}
			for gen, want := range map[int][][]byte{1: good, 2: tc.damage} {
				out := t.TempDir()
				rep := New(tm.Reader, Options{Out: out, Generation: gen}).One(mirrortest.Ctx(t), id)
				if rep.Result != Written {
					t.Fatalf("--generation %d: %s: %s", gen, rep.Result, rep.Reason)
				}
				got, err := os.ReadFile(rep.Output)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, mirrortest.JoinLines(want)) {
					t.Errorf("--generation %d: not byte-identical to that generation", gen)
				}
			}
		})
	}
}

// TestRecoverAt: recover --at rebuilds the conversation as the mirror held it at a time:
// the generation newest then, with the lines stored by then.
func TestRecoverAt(t *testing.T) {
	const id = "0192f0a4-5e1c-7a3b-9c2d-0000000000d2"
	lines := disasterLines(id, 6)
	tm := newTestMirror(t)
	ctx := mirrortest.Ctx(t)
	m1 := mirrortest.MirrorFile(t, lines, 1, 0)
	tm.Publish(t, m1, m1.Msgs[:4], nil) // header and three entries
	stored := storedTimes(t, tm, id)
	t1 := stored[len(stored)-1] // the mirror's clock when the third entry was stored
	tm.Publish(t, m1, m1.Msgs[4:], nil)
	m2 := mirrortest.MirrorFile(t, lines[:2], 2, 0) // then cut back to one entry
	head := mirrortest.DaemonHead(lines[:2], m2, 2)
	tm.Publish(t, m2, m2.Msgs, &head)
	stored = storedTimes(t, tm, id)
	t2, t3 := stored[len(lines)-1], stored[len(stored)-1]

	for _, tc := range []struct {
		name string
		at   time.Time
		want [][]byte
	}{
		{"after the third entry", t1, lines[:4]},
		{"after the last line of generation 1", t2, lines},
		{"after the cut", t3, lines[:2]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			rep := New(tm.Reader, Options{Out: out, At: tc.at}).One(ctx, id)
			if rep.Result != Written {
				t.Fatalf("%s: %s", rep.Result, rep.Reason)
			}
			got, err := os.ReadFile(rep.Output)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, mirrortest.JoinLines(tc.want)) {
				t.Errorf("--at %s: got %d bytes, want the %d lines then", tc.at.Format(time.RFC3339Nano), len(got), len(tc.want))
			}
			if !strings.HasPrefix(rep.HeadCheck, "skipped") {
				t.Errorf("head check %q: the head describes now, not then", rep.HeadCheck)
			}
		})
	}
	rep := New(tm.Reader, Options{Out: t.TempDir(), At: stored[0].Add(-time.Hour)}).One(ctx, id)
	if rep.Result != Failed || !strings.Contains(rep.Reason, "nothing of it was mirrored by") {
		t.Fatalf("before its first line: %s: %s", rep.Result, rep.Reason)
	}
}

// storedTimes returns when each message of conversation id was stored, in stream order.
func storedTimes(t *testing.T, tm *mirrortest.Mirror, id string) []time.Time {
	t.Helper()
	c, err := tm.Reader.Conv(id)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	err = tm.Reader.Scan(mirrortest.Ctx(t), c, mirror.ScanOptions{HeadersOnly: true}, func(m mirror.Msg) error {
		out = append(out, m.Time)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestHeadlessConversationGoesHome: a conversation whose head is lost or unreadable is
// recovered, under a single --root, where its lines say it lived (or where Pi's layout
// rule puts it); with several roots nothing says which was its own, and it is refused.
func TestHeadlessConversationGoesHome(t *testing.T) {
	const id = "0192f0a4-5e1c-7a3b-9c2d-0000000000d3"
	lines := disasterLines(id, 3)
	tm := newTestMirror(t)
	m := mirrortest.MirrorFile(t, lines, 1, 0)
	tm.Publish(t, m, m.Msgs, nil)
	ctx := mirrortest.Ctx(t)

	root := t.TempDir()
	rep := New(tm.Reader, Options{Roots: []string{root}}).One(ctx, id)
	if rep.Result != Written {
		t.Fatalf("one root: %s: %s", rep.Result, rep.Reason)
	}
	want := filepath.Join(root, filepath.FromSlash(m.Source))
	if rep.Output != want {
		t.Fatalf("written to %s, want %s", rep.Output, want)
	}
	if got, err := os.ReadFile(want); err != nil || !bytes.Equal(got, mirrortest.JoinLines(lines)) {
		t.Fatalf("not byte-identical (%v)", err)
	}

	rep = New(tm.Reader, Options{Roots: []string{t.TempDir(), t.TempDir()}}).One(ctx, id)
	if rep.Result != Refused || !strings.Contains(rep.Reason, "single --root") {
		t.Fatalf("two roots: %s: %s", rep.Result, rep.Reason)
	}
}

// TestHomeForLayoutRule: without a recorded source path, Pi's layout rule places the
// file from its header; without a cwd it cannot, and says so.
func TestHomeForLayoutRule(t *testing.T) {
	root := t.TempDir()
	p := &Plan{}
	p.Header.ID, p.Header.Timestamp, p.Header.Cwd = "abc", "2026-12-05T14:00:00.000Z", "/home/dev/app"
	got, err := homeFor(p, []string{root})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "--home-dev-app--", "2026-12-05T14-00-00-000Z_abc.jsonl"); got.path() != want {
		t.Errorf("placed at %s, want %s", got.path(), want)
	}
	p.Header.Cwd = ""
	if _, err := homeFor(p, []string{root}); !errors.Is(err, ErrUnsafePath) || !strings.Contains(err.Error(), "layout rule cannot place it") {
		t.Errorf("without a cwd: %v", err)
	}
	p.Source = "../escape.jsonl"
	p.Header.Cwd = "/x"
	got, err = homeFor(p, []string{root})
	if err != nil || !strings.HasPrefix(got.path(), root+string(filepath.Separator)) || strings.Contains(got.path(), "escape") {
		t.Errorf("a source path leaving the root: %v %v", got, err)
	}
}

// TestIncompleteForkNotRestored: a fork the session store has not finished copying
// (its header's Pisync-Fork mark counts more entries than the stream holds) is refused,
// as open and list refuse it; complete, it is restored byte for byte.
func TestIncompleteForkNotRestored(t *testing.T) {
	const id = "0192f0a4-5e1c-7a3b-9c2d-0000000000d4"
	lines := disasterLines(id, 3)
	tm := newTestMirror(t)
	ctx := mirrortest.Ctx(t)
	m := mirrortest.MirrorFile(t, lines, 1, 0)
	conv, err := tm.Reader.Conv(id)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(msgs []mirror.Msg) {
		for _, msg := range msgs {
			nm := tm.Names.NewMsg(conv, msg.Line, msg.Data)
			if msg.Kind == mirror.KindHeader {
				nm.Header.Set(mirror.HdrFork, `{"entries":3,"source":"src","generation":1,"lastSeq":9}`)
			}
			if _, err := tm.JS.PublishMsg(ctx, nm); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(m.Msgs[:2]) // the header and one entry of three
	rep := New(tm.Reader, Options{Out: t.TempDir()}).One(ctx, id)
	if rep.Result != Refused || !strings.Contains(rep.Reason, ErrIncompleteFork.Error()) || !strings.Contains(rep.Reason, "1 of its 3 entries") {
		t.Fatalf("incomplete fork: %s: %s", rep.Result, rep.Reason)
	}
	publish(m.Msgs[2:])
	out := t.TempDir()
	rep = New(tm.Reader, Options{Out: out}).One(ctx, id)
	if rep.Result != Written {
		t.Fatalf("complete fork: %s: %s", rep.Result, rep.Reason)
	}
	if got, err := os.ReadFile(rep.Output); err != nil || !bytes.Equal(got, mirrortest.JoinLines(lines)) {
		t.Fatalf("complete fork not byte-identical (%v)", err)
	}
}
