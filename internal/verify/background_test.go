package verify

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// scanCounter counts the conversations background verification reads from the mirror.
type scanCounter struct {
	BackgroundMirror
	scans atomic.Int32
}

func (s *scanCounter) Scan(ctx context.Context, c mirror.Conv, opts mirror.ScanOptions, fn func(mirror.Msg) error) error {
	s.scans.Add(1)
	return s.BackgroundMirror.Scan(ctx, c, opts, fn)
}

// extraLine is a line appended to a golden session by the tests.
var extraLine = []byte(`{"type":"message","id":"e00000aa","parentId":"e0000007","timestamp":"2026-11-01T09:00:09.000Z","message":{"role":"user","content":[]}}`)

// goldenFile is a session file of testdata written to a test's root and mirrored.
type goldenFile struct {
	path  string
	lines [][]byte
	m     mirrortest.Mirrored
}

// mirroredGolden writes three golden sessions to a new root, mirrors them on a new server
// and returns them as background verification's targets.
func mirroredGolden(t *testing.T) (*mirrortest.Mirror, string, []goldenFile, []Target) {
	t.Helper()
	return mirroredGoldenOn(t, mirrortest.New(t))
}

// mirroredGoldenOn is mirroredGolden on the mirror tm.
func mirroredGoldenOn(t *testing.T, tm *mirrortest.Mirror) (*mirrortest.Mirror, string, []goldenFile, []Target) {
	t.Helper()
	dir := t.TempDir()
	var files []goldenFile
	var targets []Target
	for _, name := range []string{"complete", "missing_middle", "two_children_missing_parent"} {
		lines := mirrortest.ReadLines(t, filepath.Join("testdata", "sessions", name, "input.jsonl"))
		m := mirrortest.MirrorFile(t, lines, 1, 0)
		head := mirrortest.DaemonHead(lines, m, 1)
		tm.Publish(t, m, m.Msgs, &head)
		path := filepath.Join(dir, name+".jsonl")
		mirrortest.WriteFile(t, path, mirrortest.JoinLines(lines))
		files = append(files, goldenFile{path, lines, m})
		targets = append(targets, Target{Root: dir, Path: path, Key: m.Conv})
	}
	return tm, dir, files, targets
}

// TestBackgroundRereadsOnlyWhatChanged: a pass reads every file; the next ones read only
// a file that changed, a file whose conversation gained or lost messages in the mirror,
// and any file last read longer than Recheck ago, and still count every file verified. A
// file found drifted is read again on every pass.
func TestBackgroundRereadsOnlyWhatChanged(t *testing.T) {
	tm, dir, files, targets := mirroredGolden(t)
	ctx := mirrortest.Ctx(t)
	sc := &scanCounter{BackgroundMirror: tm.Reader}
	metrics := NewVerifyMetrics(prometheus.NewRegistry())
	metrics.Init([]string{dir})
	clock := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	b := &Background{Mirror: sc, List: func() []Target { return targets }, Rate: 1000, Recheck: time.Hour,
		Metrics: metrics, now: func() time.Time { return clock }}
	var drifted []string // OnDrift calls: the daemon reopens these files as rewritten
	b.OnDrift = func(t Target, d Drift) {
		if d.Drifted() {
			drifted = append(drifted, t.Path)
		}
	}
	pass := func(wantScans int32, identical, drifted float64) {
		t.Helper()
		sc.scans.Store(0)
		b.pass(ctx)
		if got := sc.scans.Load(); got != wantScans {
			t.Errorf("%d files read, want %d", got, wantScans)
		}
		for result, want := range map[string]float64{"identical": identical, "drifted": drifted} {
			if got := testutil.ToFloat64(metrics.sessions.WithLabelValues(dir, result)); got != want {
				t.Errorf("%s: %v, want %v", result, got, want)
			}
		}
	}

	pass(3, 3, 0) // the first pass reads every file
	pass(0, 3, 0) // nothing changed: nothing read, every file still verified

	// A line appended to a file (pending, not drift) has it read again.
	mirrortest.WriteFile(t, files[0].path, mirrortest.JoinLines(append(append([][]byte(nil), files[0].lines...), extraLine)))
	pass(1, 3, 0)
	pass(0, 3, 0)

	// A message more in the mirror (a line the file lacks) has it read again: a drift,
	// found again on every pass.
	more := mirrortest.MirrorFile(t, append(append([][]byte(nil), files[1].lines...), extraLine), 1, 0)
	tm.Publish(t, more, more.Msgs[len(more.Msgs)-1:], nil)
	pass(1, 2, 1)
	pass(1, 2, 1)
	if len(drifted) != 2 || drifted[0] != files[1].path || drifted[1] != files[1].path {
		t.Fatalf("OnDrift for %q, want %s twice", drifted, files[1].path)
	}

	// A file changed behind the daemon's back: a drift too.
	lines := append([][]byte(nil), files[2].lines...)
	lines = lines[:len(lines)-1]
	mirrortest.WriteFile(t, files[2].path, mirrortest.JoinLines(lines))
	pass(2, 1, 2)
	pass(2, 1, 2)

	// After Recheck, the identical file is read again although nothing changed.
	clock = clock.Add(time.Hour)
	pass(3, 1, 2)
	pass(2, 1, 2)
}

// TestBackgroundVerdictsOutliveRestart (issue 15): the verdicts were kept in memory only,
// so the first pass after every start — one interval after a reboot or an upgrade of the
// fleet — read every file from the mirror again. A Background restarted on the same state
// file reads only what changed while it was down; a state file it cannot use costs one
// read of every file, and a warning, never a wrong verdict.
func TestBackgroundVerdictsOutliveRestart(t *testing.T) {
	type env struct {
		tm    *mirrortest.Mirror
		files []goldenFile
		state string
	}
	cases := []struct {
		name      string
		down      func(t *testing.T, e env) // what happens while the daemon is stopped
		later     time.Duration             // how long it stays stopped
		wantReads int32
		wantWarn  bool
	}{
		{name: "nothing changed", down: func(*testing.T, env) {}, wantReads: 0},
		{name: "a file appended to", wantReads: 1, down: func(t *testing.T, e env) {
			f := e.files[0]
			mirrortest.WriteFile(t, f.path, mirrortest.JoinLines(append(append([][]byte(nil), f.lines...), extraLine)))
		}},
		{name: "a message more in the mirror", wantReads: 1, down: func(t *testing.T, e env) {
			more := mirrortest.MirrorFile(t, append(append([][]byte(nil), e.files[1].lines...), extraLine), 1, 0)
			e.tm.Publish(t, more, more.Msgs[len(more.Msgs)-1:], nil)
		}},
		{name: "verdicts older than Recheck", down: func(*testing.T, env) {}, later: time.Hour, wantReads: 3},
		{name: "state file missing", wantReads: 3, down: func(t *testing.T, e env) {
			if err := os.Remove(e.state); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "state file corrupt", wantReads: 3, wantWarn: true, down: func(t *testing.T, e env) {
			writeState(t, e.state, `{"version":1,"verdicts":{"/a":`)
		}},
		{name: "state file of another version", wantReads: 3, wantWarn: true, down: func(t *testing.T, e env) {
			writeState(t, e.state, `{"version":99,"verdicts":{}}`)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tm, _, files, targets := mirroredGolden(t)
			ctx := mirrortest.Ctx(t)
			state := filepath.Join(t.TempDir(), "verified.json")
			clock := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
			start := func(log *zap.Logger) (*Background, *scanCounter) {
				sc := &scanCounter{BackgroundMirror: tm.Reader}
				return &Background{Mirror: sc, List: func() []Target { return targets }, Rate: 1000, Recheck: time.Hour,
					StateFile: state, Logger: log, now: func() time.Time { return clock }}, sc
			}
			b, sc := start(nil)
			b.pass(ctx)
			if got := sc.scans.Load(); got != 3 {
				t.Fatalf("first pass read %d files, want 3", got)
			}

			tc.down(t, env{tm, files, state})
			clock = clock.Add(tc.later)
			core, logs := observer.New(zap.WarnLevel)
			b, sc = start(zap.New(core))
			b.pass(ctx)
			if got := sc.scans.Load(); got != tc.wantReads {
				t.Errorf("first pass after the restart read %d files, want %d", got, tc.wantReads)
			}
			// The restarted daemon saved what it found (over an unreadable file too): after
			// another restart it reads nothing but a drifted file, read on every pass.
			unproven := 3 - int32(len(b.known))
			b, sc = start(nil)
			b.pass(ctx)
			if got := sc.scans.Load(); got != unproven {
				t.Errorf("first pass after a second restart read %d files, want the %d without a verdict", got, unproven)
			}
			warns := logs.FilterMessageSnippet("saved verification verdicts").Len()
			if tc.wantWarn && warns != 1 || !tc.wantWarn && warns != 0 {
				t.Errorf("%d warnings about the state file, want one if and only if it is unreadable", warns)
			}
		})
	}
}

func writeState(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBackgroundSpreadsRecheck: files found identical in one pass (every file of a host
// after its first start, of a fleet after an upgrade) come due again over the last
// quarter of Recheck, not all in one pass a day later.
func TestBackgroundSpreadsRecheck(t *testing.T) {
	const copies = 40
	tm, dir, files, _ := mirroredGolden(t)
	ctx := mirrortest.Ctx(t)
	var targets []Target // copies of one mirrored file: each is identical to the conversation
	for i := range copies {
		path := filepath.Join(dir, fmt.Sprintf("copy-%02d.jsonl", i))
		mirrortest.WriteFile(t, path, mirrortest.JoinLines(files[0].lines))
		targets = append(targets, Target{Root: dir, Path: path, Key: files[0].m.Conv})
	}
	sc := &scanCounter{BackgroundMirror: tm.Reader}
	start := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	clock := start
	b := &Background{Mirror: sc, List: func() []Target { return targets }, Rate: 1000, Recheck: 24 * time.Hour,
		now: func() time.Time { return clock }}
	b.pass(ctx)
	if got := sc.scans.Load(); got != copies {
		t.Fatalf("first pass read %d files, want %d", got, copies)
	}
	// Passes every hour through the day after: nothing before 18 h, everything by 24 h,
	// no pass reading more than a third of the files.
	var most int32
	for h := 1; h <= 24; h++ {
		clock = start.Add(time.Duration(h) * time.Hour)
		sc.scans.Store(0)
		b.pass(ctx)
		n := sc.scans.Load()
		if h < 18 && n > 0 {
			t.Errorf("after %d h: %d files read again, want none before three quarters of Recheck", h, n)
		}
		most = max(most, n)
	}
	for _, tg := range targets {
		if v := b.known[tg.Path]; !v.at.After(start) {
			t.Errorf("%s not read again within Recheck", tg.Path)
		}
	}
	if most > copies/3 {
		t.Errorf("one pass read %d of the %d files again, want the re-reads spread", most, copies)
	}
}

// TestBackgroundKeepsVerdictsOfUnlistedFiles: right after a start a file may not be
// listed yet (its publisher not synced), and a restart may find the temporary file of a
// save cut by a crash. The verdict of an unlisted file is kept until it expires, and the
// temporary file is removed.
func TestBackgroundKeepsVerdictsOfUnlistedFiles(t *testing.T) {
	tm, _, _, targets := mirroredGolden(t)
	ctx := mirrortest.Ctx(t)
	state := filepath.Join(t.TempDir(), "verified.json")
	clock := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	listed := targets
	start := func() (*Background, *scanCounter) {
		sc := &scanCounter{BackgroundMirror: tm.Reader}
		return &Background{Mirror: sc, List: func() []Target { return listed }, Rate: 1000, Recheck: time.Hour,
			StateFile: state, now: func() time.Time { return clock }}, sc
	}
	pass := func(b *Background, sc *scanCounter, want int32, when string) {
		t.Helper()
		sc.scans.Store(0)
		b.pass(ctx)
		if got := sc.scans.Load(); got != want {
			t.Errorf("%s: %d files read, want %d", when, got, want)
		}
	}
	b, sc := start()
	pass(b, sc, 3, "first start")
	torn := state + ".tmp-123"
	writeState(t, torn, `{"version":1,"verd`)

	listed = targets[:1]
	b, sc = start()
	pass(b, sc, 0, "restart, one file listed")
	if _, err := os.Stat(torn); !os.IsNotExist(err) {
		t.Errorf("the temporary file of a save cut short is still there: %v", err)
	}
	listed = targets
	b, sc = start()
	pass(b, sc, 0, "restart, every file listed")

	// Expired, an unlisted file's verdict is dropped: read again once listed.
	listed = targets[:1]
	clock = clock.Add(time.Hour)
	pass(b, sc, 1, "an hour later, one file listed")
	listed = targets
	pass(b, sc, 2, "every file listed again")
}
