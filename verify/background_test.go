package verify

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pisync/pisync/internal/mirrortest"
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

// TestBackgroundRereadsOnlyWhatChanged: a pass reads every file; the next ones read only
// a file that changed, a file whose conversation gained or lost messages in the mirror,
// and any file last read longer than Recheck ago, and still count every file verified. A
// file found drifted is read again on every pass.
func TestBackgroundRereadsOnlyWhatChanged(t *testing.T) {
	tm := mirrortest.New(t)
	ctx := mirrortest.Ctx(t)
	dir := t.TempDir()
	golden := filepath.Join("testdata", "sessions")
	type file struct {
		path  string
		lines [][]byte
		m     mirrortest.Mirrored
	}
	var files []file
	var targets []Target
	for _, name := range []string{"complete", "missing_middle", "two_children_missing_parent"} {
		lines := mirrortest.ReadLines(t, filepath.Join(golden, name, "input.jsonl"))
		m := mirrortest.MirrorFile(t, lines, 1, 0)
		head := mirrortest.DaemonHead(lines, m, 1)
		tm.Publish(t, m, m.Msgs, &head)
		path := filepath.Join(dir, name+".jsonl")
		mirrortest.WriteFile(t, path, mirrortest.JoinLines(lines))
		files = append(files, file{path, lines, m})
		targets = append(targets, Target{Root: dir, Path: path, Key: m.Conv})
	}
	sc := &scanCounter{BackgroundMirror: tm.Reader}
	metrics := NewVerifyMetrics()
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg); err != nil {
		t.Fatal(err)
	}
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
		b.pass(ctx, time.Millisecond)
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
	newLine := []byte(`{"type":"message","id":"e00000aa","parentId":"e0000007","timestamp":"2026-11-01T09:00:09.000Z","message":{"role":"user","content":[]}}`)
	mirrortest.WriteFile(t, files[0].path, mirrortest.JoinLines(append(append([][]byte(nil), files[0].lines...), newLine)))
	pass(1, 3, 0)
	pass(0, 3, 0)

	// A message more in the mirror (a line the file lacks) has it read again: a drift,
	// found again on every pass.
	more := mirrortest.MirrorFile(t, append(append([][]byte(nil), files[1].lines...), newLine), 1, 0)
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
