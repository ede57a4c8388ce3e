package recovery

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// following is a Follower running in the background of a test.
type following struct {
	f      *Follower
	cancel context.CancelFunc
	done   chan error

	mu      sync.Mutex
	reports []Report
}

func follow(t *testing.T, tm *mirrortest.Mirror, opts FollowOptions) *following {
	t.Helper()
	fl := &following{done: make(chan error, 1)}
	opts.OnReport = func(r Report) {
		fl.mu.Lock()
		fl.reports = append(fl.reports, r)
		fl.mu.Unlock()
	}
	fl.f = NewFollower(tm.Reader, opts)
	ctx, cancel := context.WithCancel(context.Background())
	fl.cancel = cancel
	go func() { fl.done <- fl.f.Run(ctx) }()
	t.Cleanup(fl.stop)
	waitFor(t, "the first recovery", func() bool { return fl.f.Status().Started })
	return fl
}

func (fl *following) stop() {
	fl.cancel()
	<-fl.done
	fl.done <- context.Canceled // a second stop returns at once
}

func (fl *following) reportsOf(key string) []Report {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	var out []Report
	for _, r := range fl.reports {
		if r.Key == key {
			out = append(out, r)
		}
	}
	return out
}

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitFile waits until the file at path holds exactly want.
func waitFile(t *testing.T, path string, want []byte) {
	t.Helper()
	var got []byte
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, _ = os.ReadFile(path)
		if bytes.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s:\n--- got\n%s--- want\n%s", path, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// publishUpTo stores the lines of m from ordinal from through to, then the head as the
// daemon writes it once they are acknowledged.
func publishUpTo(t *testing.T, tm *mirrortest.Mirror, lines [][]byte, m mirrortest.Mirrored, gen, from, to int) {
	t.Helper()
	publishFrom(t, tm, "testhost", lines, m, gen, from, to)
}

// publishFrom is publishUpTo for a daemon of the given host.
func publishFrom(t *testing.T, tm *mirrortest.Mirror, host string, lines [][]byte, m mirrortest.Mirrored, gen, from, to int) {
	t.Helper()
	msgs := append([]mirror.Msg(nil), m.Msgs[from:to+1]...)
	for i := range msgs {
		msgs[i].Host = host
	}
	tm.Publish(t, m, msgs, nil)
	conv, err := mirror.NewConv(tm.Owner, m.Conv)
	if err != nil {
		t.Fatal(err)
	}
	head := mirrortest.DaemonHead(lines[:to+1], m, gen)
	head.Host = host
	if head.LastSeq, err = tm.Reader.LastSeq(mirrortest.Ctx(t), conv); err != nil {
		t.Fatal(err)
	}
	if err := tm.Writer.PutHead(mirrortest.Ctx(t), conv, head); err != nil {
		t.Fatal(err)
	}
}

func TestFollowKeepsFilesCurrent(t *testing.T) {
	tm := newTestMirror(t)
	const id = "0192f0a4-5e1c-7a3b-9c2d-00000000f011"
	lines := disasterLines(id, 8)
	m := mirrortest.MirrorFile(t, lines, 1, 0)
	publishUpTo(t, tm, lines, m, 1, 0, 3)

	out := t.TempDir()
	fl := follow(t, tm, FollowOptions{Options: Options{Out: out}, All: true})
	path := filepath.Join(out, m.Source)
	waitFile(t, path, mirrortest.JoinLines(lines[:4]))

	// Lines appended one at a time, as Pi writes them, each followed by its head.
	for i := 4; i < len(lines); i++ {
		publishUpTo(t, tm, lines, m, 1, i, i)
		waitFile(t, path, mirrortest.JoinLines(lines[:i+1]))
	}
	waitFor(t, "the appends counted", func() bool { return fl.f.Status().Appended == uint64(len(lines)-4) })
	if st := fl.f.Status(); st.Written != 1 || st.Current != 1 || len(st.Left) != 0 || st.Behind != 0 {
		t.Fatalf("status %+v", st)
	}

	// A conversation made after the start is written whole.
	const id2 = "0192f0a4-5e1c-7a3b-9c2d-00000000f012"
	lines2 := disasterLines(id2, 3)
	m2 := mirrortest.MirrorFile(t, lines2, 1, 0)
	publishUpTo(t, tm, lines2, m2, 1, 0, 3)
	waitFile(t, filepath.Join(out, m2.Source), mirrortest.JoinLines(lines2))

	// A new generation (a line rewritten in place) replaces the file, atomically.
	rewritten := append([][]byte(nil), lines...)
	rewritten[2] = bytes.Replace(rewritten[2], []byte("turn 2"), []byte("turn two"), 1)
	m3 := mirrortest.MirrorFile(t, rewritten, 2, 0)
	publishUpTo(t, tm, rewritten, m3, 2, 0, len(rewritten)-1)
	waitFile(t, path, mirrortest.JoinLines(rewritten))
	// …and is appended to like the first.
	more := disasterLines(id, 9)
	copy(more, rewritten)
	m4 := mirrortest.MirrorFile(t, more, 2, 0)
	publishUpTo(t, tm, more, m4, 2, 9, 9)
	waitFile(t, path, mirrortest.JoinLines(more))
}

// TestFollowOutOfOrder: a line the stream stores before the one it follows (a resend)
// waits for it; the file never holds them out of order.
func TestFollowOutOfOrder(t *testing.T) {
	tm := newTestMirror(t)
	const id = "0192f0a4-5e1c-7a3b-9c2d-00000000f021"
	lines := disasterLines(id, 6)
	m := mirrortest.MirrorFile(t, lines, 1, 0)
	publishUpTo(t, tm, lines, m, 1, 0, 2)
	out := t.TempDir()
	fl := follow(t, tm, FollowOptions{Options: Options{Out: out}, All: true, Hold: time.Minute})
	path := filepath.Join(out, m.Source)
	waitFile(t, path, mirrortest.JoinLines(lines[:3]))

	tm.Publish(t, m, []mirror.Msg{m.Msgs[4], m.Msgs[5]}, nil)
	waitFor(t, "the lines past the hole held", func() bool { return fl.f.Status().Position > 0 && fl.f.Status().Waiting == 1 })
	if got, _ := os.ReadFile(path); !bytes.Equal(got, mirrortest.JoinLines(lines[:3])) {
		t.Fatalf("lines past a hole were written:\n%s", got)
	}
	publishUpTo(t, tm, lines, m, 1, 3, 3)
	waitFile(t, path, mirrortest.JoinLines(lines[:6]))
	publishUpTo(t, tm, lines, m, 1, 6, 6)
	waitFile(t, path, mirrortest.JoinLines(lines))
	if st := fl.f.Status(); st.Written != 1 {
		t.Fatalf("the file was rebuilt instead of appended to: %+v", st)
	}
}

// TestFollowLeavesLocalChanges: a followed file written by something else is never
// written again by the follower, which says so; the lines it would have appended stay
// in the mirror.
func TestFollowLeavesLocalChanges(t *testing.T) {
	tm := newTestMirror(t)
	const id = "0192f0a4-5e1c-7a3b-9c2d-00000000f031"
	lines := disasterLines(id, 5)
	m := mirrortest.MirrorFile(t, lines, 1, 0)
	publishUpTo(t, tm, lines, m, 1, 0, 3)
	out := t.TempDir()
	fl := follow(t, tm, FollowOptions{Options: Options{Out: out}, All: true, Retry: 50 * time.Millisecond})
	path := filepath.Join(out, m.Source)
	waitFile(t, path, mirrortest.JoinLines(lines[:4]))

	local := []byte(`{"type":"message","id":"10ca1000","parentId":"00000003","timestamp":"2026-12-05T15:00:00.000Z","message":{"role":"user","content":"written here"}}` + "\n")
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.Write(local); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	publishUpTo(t, tm, lines, m, 1, 4, 4)
	refused := func(why string) func() bool {
		return func() bool {
			for _, r := range fl.reportsOf(id) {
				if r.Result == Refused && strings.Contains(r.Reason, why) {
					return true
				}
			}
			return false
		}
	}
	waitFor(t, "the append refused", refused("changed locally"))
	waitFor(t, "the file shown left in place", func() bool { return len(fl.f.Status().Left) == 1 })
	// The next head change tries again through recovery, whose rule holds: the file
	// holds what the mirror lacks, so it stays, reported.
	publishUpTo(t, tm, lines, m, 1, 5, 5)
	waitFor(t, "the rebuild refused", refused("holds what the mirror lacks"))
	want := append(mirrortest.JoinLines(lines[:4]), local...)
	if got, _ := os.ReadFile(path); !bytes.Equal(got, want) {
		t.Fatalf("a file changed locally was written:\n%s", got)
	}
	if left := fl.f.Status().Left; len(left) != 1 || left[0].Key != id || left[0].Path != path {
		t.Fatalf("left %+v", left)
	}
}

// TestFollowDeletedAndShrunk: a conversation deleted at its source stays in place and is
// reported; a shrunk newest generation is not followed into the file.
func TestFollowDeletedAndShrunk(t *testing.T) {
	tm := newTestMirror(t)
	const gone, cut = "0192f0a4-5e1c-7a3b-9c2d-00000000f041", "0192f0a4-5e1c-7a3b-9c2d-00000000f042"
	goneLines, cutLines := disasterLines(gone, 3), disasterLines(cut, 4)
	mg, mc := mirrortest.MirrorFile(t, goneLines, 1, 0), mirrortest.MirrorFile(t, cutLines, 1, 0)
	publishUpTo(t, tm, goneLines, mg, 1, 0, 3)
	publishUpTo(t, tm, cutLines, mc, 1, 0, 4)
	out := t.TempDir()
	fl := follow(t, tm, FollowOptions{Options: Options{Out: out}, All: true})
	gonePath, cutPath := filepath.Join(out, mg.Source), filepath.Join(out, mc.Source)
	waitFile(t, gonePath, mirrortest.JoinLines(goneLines))
	waitFile(t, cutPath, mirrortest.JoinLines(cutLines))

	conv, _ := mirror.NewConv(tm.Owner, gone)
	h := mirrortest.DaemonHead(goneLines, mg, 1)
	h.LocalDeleted = true
	h.LastSeq = 0
	if err := tm.Writer.PutHead(mirrortest.Ctx(t), conv, h); err != nil {
		t.Fatal(err)
	}
	m2 := mirrortest.MirrorFile(t, cutLines[:2], 2, 0)
	publishUpTo(t, tm, cutLines[:2], m2, 2, 0, 1)
	waitFor(t, "both left in place", func() bool { return len(fl.f.Status().Left) == 2 })
	for _, l := range fl.f.Status().Left {
		switch {
		case l.Key == gone && l.Deleted && strings.Contains(l.Reason, "deleted at its source"):
		case l.Key == cut && strings.Contains(l.Reason, ErrShrunk.Error()):
		default:
			t.Fatalf("left %+v", l)
		}
	}
	if got, _ := os.ReadFile(gonePath); !bytes.Equal(got, mirrortest.JoinLines(goneLines)) {
		t.Fatal("the file of a deleted conversation changed")
	}
	if got, _ := os.ReadFile(cutPath); !bytes.Equal(got, mirrortest.JoinLines(cutLines)) {
		t.Fatal("a shrunk generation was followed")
	}
}

// TestFollowRestart: a follower stopped and started again brings the files that fell
// behind up to date and leaves the current ones alone (not rewritten).
func TestFollowRestart(t *testing.T) {
	tm := newTestMirror(t)
	const a, b = "0192f0a4-5e1c-7a3b-9c2d-00000000f051", "0192f0a4-5e1c-7a3b-9c2d-00000000f052"
	la, lb := disasterLines(a, 6), disasterLines(b, 3)
	ma, mb := mirrortest.MirrorFile(t, la, 1, 0), mirrortest.MirrorFile(t, lb, 1, 0)
	publishUpTo(t, tm, la, ma, 1, 0, 3)
	publishUpTo(t, tm, lb, mb, 1, 0, 3)
	out := t.TempDir()
	fl := follow(t, tm, FollowOptions{Options: Options{Out: out}, All: true})
	pa, pb := filepath.Join(out, ma.Source), filepath.Join(out, mb.Source)
	waitFile(t, pa, mirrortest.JoinLines(la[:4]))
	waitFile(t, pb, mirrortest.JoinLines(lb))
	fl.stop()
	before, err := os.Stat(pb)
	if err != nil {
		t.Fatal(err)
	}

	publishUpTo(t, tm, la, ma, 1, 4, 6)
	fl2 := follow(t, tm, FollowOptions{Options: Options{Out: out}, All: true})
	waitFile(t, pa, mirrortest.JoinLines(la))
	after, err := os.Stat(pb)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Fatal("a current file was rewritten at restart")
	}
	if reps := fl2.reportsOf(b); len(reps) != 1 || reps[0].Result != Unchanged {
		t.Fatalf("reports of the current file: %+v", reps)
	}
}

// TestFollowHost: --host follows the conversations one host mirrors.
func TestFollowHost(t *testing.T) {
	tm := newTestMirror(t)
	const mine, theirs = "0192f0a4-5e1c-7a3b-9c2d-00000000f061", "0192f0a4-5e1c-7a3b-9c2d-00000000f062"
	lm, lt := disasterLines(mine, 2), disasterLines(theirs, 2)
	mm, mt := mirrortest.MirrorFile(t, lm, 1, 0), mirrortest.MirrorFile(t, lt, 1, 0)
	out := t.TempDir()
	fl := follow(t, tm, FollowOptions{Options: Options{Out: out}, All: true, Host: "testhost"})
	publishFrom(t, tm, "laptop", lt, mt, 1, 0, 2)
	publishUpTo(t, tm, lm, mm, 1, 0, 2)
	waitFile(t, filepath.Join(out, mm.Source), mirrortest.JoinLines(lm))
	if _, err := os.Stat(filepath.Join(out, mt.Source)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("another host's conversation was followed: %v", err)
	}
	waitFor(t, "the file counted as current", func() bool { st := fl.f.Status(); return st.Current == 1 && st.Written == 1 })
}

// TestFollowMovedFile: a session file renamed on its host is renamed on the standby too,
// and followed on at its new place: the standby never holds it twice.
func TestFollowMovedFile(t *testing.T) {
	tm := newTestMirror(t)
	const id = "0192f0a4-5e1c-7a3b-9c2d-00000000f071"
	lines := disasterLines(id, 4)
	m := mirrortest.MirrorFile(t, lines, 1, 0)
	publishUpTo(t, tm, lines, m, 1, 0, 3)
	out := t.TempDir()
	fl := follow(t, tm, FollowOptions{Options: Options{Out: out}, All: true})
	old := filepath.Join(out, m.Source)
	waitFile(t, old, mirrortest.JoinLines(lines[:4]))

	// Renamed on the host (the daemon keeps the key and generation, its head names the
	// new path), then appended to.
	moved := m
	moved.Source = filepath.ToSlash(filepath.Join(filepath.Dir(m.Source), "renamed_"+id+".jsonl"))
	for i := range moved.Msgs {
		moved.Msgs[i].Source = moved.Source
	}
	conv, _ := mirror.NewConv(tm.Owner, id)
	head := mirrortest.DaemonHead(lines[:4], moved, 1)
	head.Source = moved.Source
	if head.LastSeq, _ = tm.Reader.LastSeq(mirrortest.Ctx(t), conv); head.LastSeq == 0 {
		t.Fatal("no last sequence")
	}
	if err := tm.Writer.PutHead(mirrortest.Ctx(t), conv, head); err != nil {
		t.Fatal(err)
	}
	now := filepath.Join(out, moved.Source)
	waitFile(t, now, mirrortest.JoinLines(lines[:4]))
	publishUpTo(t, tm, lines, moved, 1, 4, 4)
	waitFile(t, now, mirrortest.JoinLines(lines))
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the old path still holds a copy: %v", err)
	}
	if st := fl.f.Status(); st.Written != 1 || len(st.Left) != 0 {
		t.Fatalf("status %+v", st)
	}
}
