package publisher

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/watcher"
)

// lateLine is torture T25's conversation: a session file of 100 lines mirrored as
// generation 2, its line 6 stored after lines 7-100 (a repeated entry id sent again under
// its ordinal), after a generation 1 of 30 lines. The stream's duplicate window is
// 100 ms (the server's least), so that a line sent again is stored again, as it is past
// the torture run's 2 s window.
type lateLine struct {
	ctx      context.Context
	url      string
	js       jetstream.JetStream
	names    mirror.Names
	reader   *mirror.Reader
	conv     mirror.Conv
	f        *sessiontest.File
	root     string
	stateDir string
	late     uint64 // the stream sequence of line 6
}

func newLateLine(t *testing.T, seed uint64) *lateLine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	l := &lateLine{ctx: ctx, url: natstest.Run(t).URL(), names: mirror.DefaultNames(), root: t.TempDir(), stateDir: t.TempDir()}
	l.mirror(t, mirror.Config{DuplicateWindow: 100 * time.Millisecond})
	l.f = sessiontest.New(rand.New(rand.NewPCG(25, seed)), l.root, "/home/dev/p", sessiontest.CLIV3)
	lines := [][]byte{l.f.HeaderLine("/home/dev/p")}
	for range 99 {
		lines = append(lines, l.f.Entry(200))
	}
	old := append([][]byte(nil), lines[:30]...)
	old[10] = l.f.Entry(300)
	l.publish(t, mirrortest.MirrorFile(t, old, 1, 0).Msgs)
	gen2 := mirrortest.MirrorFile(t, lines, 2, 0).Msgs
	l.publish(t, append(append(gen2[:5:5], gen2[6:]...), gen2[5]))
	l.appendLines(t, lines...)
	return l
}

// mirror provisions the mirror with cfg and binds a reader of owner acme/dev.
func (l *lateLine) mirror(t *testing.T, cfg mirror.Config) {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, l.url))
	if err != nil {
		t.Fatal(err)
	}
	mirrortest.Provision(t, l.ctx, js, l.names, cfg)
	owner, err := mirror.NewOwner("acme", "dev")
	if err != nil {
		t.Fatal(err)
	}
	if l.reader, err = mirror.NewReader(l.ctx, js, l.names, owner); err != nil {
		t.Fatal(err)
	}
	l.js = js
}

// publish stores msgs in the file's conversation, in order.
func (l *lateLine) publish(t *testing.T, msgs []mirror.Msg) {
	t.Helper()
	if l.conv.Key == "" {
		c, err := l.reader.Conv(l.f.ID)
		if err != nil {
			t.Fatal(err)
		}
		l.conv = c
	}
	for _, m := range msgs {
		ack, err := l.js.PublishMsg(l.ctx, l.names.NewMsg(l.conv, m.Line, m.Data))
		if err != nil {
			t.Fatal(err)
		}
		if m.Generation == 2 && m.Ordinal == 5 {
			l.late = ack.Sequence
		}
	}
}

// appendLines appends lines to the file; appendEntries n new entries.
func (l *lateLine) appendLines(t *testing.T, lines ...[]byte) {
	t.Helper()
	if err := l.f.Append(lines...); err != nil {
		t.Fatal(err)
	}
}

func (l *lateLine) appendEntries(t *testing.T, n int) {
	t.Helper()
	for range n {
		l.appendLines(t, l.f.Entry(200))
	}
}

// run runs a daemon on the state directory until the head names the file's last line,
// then checks that the newest generation holds each line of the file once.
func (l *lateLine) run(t *testing.T, what string) {
	t.Helper()
	runDaemon(t, l.ctx, l.url, l.stateDir, watcher.Options{Roots: []string{l.root}, MoveGrace: 50 * time.Millisecond},
		l.f.ID, what, nil, func(p *Publisher, c mirror.Conv) bool {
			h, _, err := p.reader.Head(l.ctx, c)
			return err == nil && h.LastOrdinal == int64(len(l.f.Lines)-1)
		})
	l.checkOnce(t, what)
}

// checkOnce fails t unless the newest generation holds each line of the file once, at
// its ordinal.
func (l *lateLine) checkOnce(t *testing.T, what string) {
	t.Helper()
	nw := newest{}
	byGen := map[int]map[int64][]mirror.Msg{}
	if err := l.reader.Scan(l.ctx, l.conv, mirror.ScanOptions{HeadersOnly: true}, func(m mirror.Msg) error {
		if byGen[m.Generation] == nil {
			byGen[m.Generation] = map[int64][]mirror.Msg{}
		}
		byGen[m.Generation][m.Ordinal] = append(byGen[m.Generation][m.Ordinal], m)
		return nw.add(m)
	}); err != nil {
		t.Fatal(err)
	}
	copies := byGen[nw.gen]
	var twice []string
	for o, ms := range copies {
		if len(ms) > 1 {
			s := fmt.Sprintf("ordinal %d at", o)
			for _, m := range ms {
				s += fmt.Sprintf(" %d (%s)", m.Seq, m.MsgID)
			}
			twice = append(twice, s)
		}
	}
	if len(twice) > 0 || len(copies) != len(l.f.Lines) {
		t.Fatalf("%s: generation %d holds %d ordinals for a file of %d lines, %d twice: %v",
			what, nw.gen, len(copies), len(l.f.Lines), len(twice), twice)
	}
	for o, ms := range copies {
		if ms[0].SHA256 != session.Digest(l.f.Lines[o]) {
			t.Fatalf("%s: ordinal %d is not the file's line", what, o)
		}
	}
}

// withHeldLimits runs fn with the mirror's lines kept whole by a resume's first pass, and
// read again through a window of a few lines.
func withHeldLimits(t *testing.T, fn func(t *testing.T)) {
	for _, limit := range []int{0, 8} {
		name := "lines kept whole"
		if limit > 0 {
			name = "lines read through a window"
		}
		t.Run(name, func(t *testing.T) {
			if limit > 0 {
				saved, savedAhead := heldLimitMin, fillAhead
				heldLimitMin, fillAhead = limit, 4
				t.Cleanup(func() { heldLimitMin, fillAhead = saved, savedAhead })
			}
			fn(t)
		})
	}
}

// TestResumeAfterStateLossStoresNoLineTwice (torture T25, what it is not): the state
// directory lost and the daemon restarted over a file with more lines than the
// generation (a resume from a whole-subject read), then killed after a checkpoint that
// misses lines it published (a resume from that checkpoint, lines held past it), over a
// file with one more line. No line is stored twice.
func TestResumeAfterStateLossStoresNoLineTwice(t *testing.T) {
	withHeldLimits(t, func(t *testing.T) {
		l := newLateLine(t, 25)
		l.appendEntries(t, 6)
		l.run(t, "resumed without state")
		// The checkpoint the daemon commits now is the one the next start finds: what it
		// commits after it is lost with its SIGKILL.
		saved := copyDir(t, l.stateDir)
		l.appendEntries(t, 15)
		l.run(t, "the appended lines mirrored")
		restoreDir(t, saved, l.stateDir)
		l.appendEntries(t, 1)
		l.run(t, "resumed from a checkpoint behind the mirror")
	})
}

// TestResumeFromCheckpointBelowALateLine (torture T25): resumed without state (every line
// held, the file's 22 new lines published), the daemon was killed after a checkpoint
// committed while the held lines were being passed: its frontier past line 6, not yet at
// line 100, so its stream sequence is line 6's, above those of lines 85-100 past it. The
// next start read what the mirror holds past the checkpoint from that sequence on, missed
// lines 85-100, found no difference (a line missing is none), and sent them again: 16
// lines stored twice, fenced on the subject's newest sequence, so that no refusal said so.
func TestResumeFromCheckpointBelowALateLine(t *testing.T) {
	withHeldLimits(t, func(t *testing.T) {
		l := newLateLine(t, 27)
		l.appendEntries(t, 22)
		l.run(t, "resumed without state")

		const ord = 84 // the frontier: line 85
		store, rec, ok := checkpointOf(t, l.stateDir, l.f.Path)
		if !ok || rec.Generation != 2 || rec.Ordinal != int64(len(l.f.Lines)) {
			t.Fatalf("checkpoint %+v (found %v), want generation 2 at ordinal %d", rec, ok, len(l.f.Lines))
		}
		var off int64
		for _, line := range l.f.Lines[:ord] {
			off += int64(len(line)) + 1
		}
		rec.Ordinal, rec.Offset, rec.Bytes, rec.Entries, rec.StreamSeq = ord, off, off, ord, l.late
		rec.LastSHA, rec.LastLen = session.Digest(l.f.Lines[ord-1]), int64(len(l.f.Lines[ord-1]))
		rec.MTime, rec.HeadSeq = 0, 0
		store.Put(rec)
		if err := store.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}
		l.appendEntries(t, 1)
		l.run(t, "resumed from the checkpoint")
	})
}

// TestReopenDoubledGenerationStartsNew: a newest generation that holds a line twice
// (torture T25: 16 lines stored twice, however they came to be) is not kept by a resume
// that compares the whole file with it (no state, or a reopen after a change): the
// comparison reads the first copy of each ordinal and would find the file equal, and the
// doubled generation would stay the newest for good. The file starts a new generation,
// each line once; a generation without a line twice is kept, as before, and so is one the
// session store writes (one writer at a time: it is the store's).
func TestReopenDoubledGenerationStartsNew(t *testing.T) {
	cases := []struct {
		name    string
		doubled bool
		longer  bool // the file holds lines past the generation's
		limit   int  // heldLimitMin (0: the default, lines kept whole)
		store   bool // the session store writes the generation
	}{
		{"doubled, same length", true, false, 0, false},
		{"doubled, file longer", true, true, 0, false},
		{"doubled, read through a window", true, true, 8, false},
		{"not doubled, same length", false, false, 0, false},
		{"not doubled, file longer, window", false, true, 8, false},
		{"doubled, the store's", true, false, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.limit > 0 {
				saved, savedAhead := heldLimitMin, fillAhead
				heldLimitMin, fillAhead = tc.limit, 4
				t.Cleanup(func() { heldLimitMin, fillAhead = saved, savedAhead })
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			l := &lateLine{ctx: ctx, url: natstest.Run(t).URL(), names: mirror.DefaultNames(), root: t.TempDir(), stateDir: t.TempDir()}
			l.mirror(t, mirror.Config{})
			l.f = sessiontest.New(rand.New(rand.NewPCG(25, 26)), l.root, "/home/dev/p", sessiontest.CLIV3)
			lines := [][]byte{l.f.HeaderLine("/home/dev/p")}
			for range 39 {
				lines = append(lines, l.f.Entry(200))
			}
			msgs := mirrortest.MirrorFile(t, lines, 1, 0).Msgs
			if tc.doubled {
				// Lines 21-36 stored again after the others, under their ordinals (another
				// message id, as a repeated entry id is sent again): the same bytes.
				for _, m := range msgs[20:36] {
					m.Kind, m.EntryID, m.EntryType, m.ParentID = mirror.KindRaw, mirror.OrdinalID(m.Ordinal), "", ""
					msgs = append(msgs, m)
				}
			}
			l.publish(t, msgs)
			l.appendLines(t, lines...)
			if tc.longer {
				l.appendEntries(t, 2)
			}
			if tc.store {
				l.storeHead(t, lines)
				return
			}
			l.run(t, "resumed without state")
			want := 1
			if tc.doubled {
				want = 2
			}
			if h, _, err := l.reader.Head(ctx, l.conv); err != nil || h.Generation != want {
				t.Fatalf("head %+v (%v), want generation %d", h, err, want)
			}
		})
	}
}

// storeHead makes the session store the writer of generation 1, which holds lines (and a
// line twice), then runs a daemon without state until the file is mirrored: it must not
// start a generation of its own.
func (l *lateLine) storeHead(t *testing.T, lines [][]byte) {
	t.Helper()
	w, err := mirror.NewWriter(l.ctx, l.js, l.names, l.reader.Owner())
	if err != nil {
		t.Fatal(err)
	}
	h := mirrortest.DaemonHead(lines, mirrortest.MirrorFile(t, lines, 1, 0), 1)
	h.Key, h.Writer = l.conv.Key, mirror.WriterStore
	if err := w.PutHead(l.ctx, l.conv, h); err != nil {
		t.Fatal(err)
	}
	runDaemon(t, l.ctx, l.url, l.stateDir, watcher.Options{Roots: []string{l.root}}, l.f.ID, "the file mirrored", nil,
		func(p *Publisher, _ mirror.Conv) bool {
			pr := p.Progress().Roots[l.root]
			return pr != nil && pr.Mirrored == 1
		})
	nw := newest{}
	if err := l.reader.Scan(l.ctx, l.conv, mirror.ScanOptions{HeadersOnly: true}, nw.add); err != nil {
		t.Fatal(err)
	}
	if nw.gen != 1 || nw.genMsgs != uint64(len(lines)+16) {
		t.Fatalf("newest generation %d with %d messages, want the store's, 1, with %d", nw.gen, nw.genMsgs, len(lines)+16)
	}
}
