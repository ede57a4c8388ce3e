package conformance

import (
	"path/filepath"
	"testing"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/pitest"
)

// TestPi073RoundTrip: the most-installed CLI release, @mariozechner/pi-coding-agent
// 0.73.1, writes sessions with its own SessionManager (messages, tool calls, model and
// thinking changes, a label, a session name, custom entries, a branch, a branch summary,
// a compaction, a branched session and a fork into another project) before the daemon
// starts and again into a root that appears while it runs, and continues a mirrored
// session as `pi --continue` does. `pisync run` mirrors it all; the tree is deleted and
// `pisync recover --all` rebuilds it: every file byte-identical, and 0.73.1's
// SessionManager opens each with the same entries, leaf, branch and context
// (buildSessionContext) as the original.
func TestPi073RoundTrip(t *testing.T) {
	t.Parallel()
	sw := newStopwatch(t)
	pi := pitest.New(t)
	pisyncBinary(t)
	srv := natstest.Run(t)
	base := t.TempDir()
	before, during := filepath.Join(base, "before"), filepath.Join(base, "during")
	roots := []string{filepath.Join(before, "sessions"), filepath.Join(during, "sessions")}

	var files []piFile
	written := pi.WriteCli073(t, before)
	for _, s := range written {
		if s.Loader() != pitest.Cli073 {
			t.Fatalf("%s: loader %s, want %s", s.Name, s.Loader(), pitest.Cli073)
		}
		files = append(files, scenarioFile("before", s))
	}
	sw.lap("Pi 0.73.1 wrote the first tree")
	d := startDaemon(t, srv.URL(), filepath.Join(base, "state"), roots...)
	mc := newMirrorClient(t, srv.URL())
	mc.waitMirrored(t, roots[0])
	pi.AppendCli073(t, written[0].Path, 3) // a file already back-filled grows
	for _, s := range pi.WriteCli073(t, during) {
		files = append(files, scenarioFile("during", s))
	}
	mc.waitMirrored(t, roots...)
	sw.lap("mirrored")
	d.stop(t)

	recoverAndCompare(t, sw, pi, srv.URL(), []string{before, during}, roots, files)
}
