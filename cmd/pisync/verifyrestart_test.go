package main

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pisync/pisync/internal/testutil/natstest"
)

// TestRestartVerifiesOnlyChangedFiles (issue 15): background verification kept its
// verdicts in memory, so one --verify-interval after every start the daemon read every
// file's conversation from the mirror again — O(all files) per host, a storm after a
// restart of the fleet. A restarted daemon must read again only the files that changed
// while it was down: the consumers created from the restart until a verification pass has
// found every file identical are those of the changed files, not one per file.
func TestRestartVerifiesOnlyChangedFiles(t *testing.T) {
	const files, changed = 40, 3
	rng := rand.New(rand.NewPCG(151, 152))
	srv := natstest.Run(t)
	root, state := t.TempDir(), t.TempDir()
	sessions := writeSessions(t, rng, root, files, 4)
	args := []string{"--nats", srv.URL(), "--root", root, "--state-dir", state,
		"--verify-interval", "300ms", "--verify-rate", "1000", "--verify-first-rate", "1000"}
	allVerified := func(d *daemon) {
		t.Helper()
		waitFor(t, 60*time.Second, "a verification pass finding every file identical", func() (bool, string) {
			n := metricValue(t, d, "pisync_verified_sessions", map[string]string{"root": root, "result": "identical"})
			return n == files, ""
		})
	}
	d := startTestDaemon(t, args...)
	allVerified(d)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	for _, f := range sessions[:changed] { // while the daemon is down
		if err := f.Append(f.Entry(300)); err != nil {
			t.Fatal(err)
		}
	}

	// Every JetStream API request the restarted daemon makes, by kind, as the server
	// receives it.
	var mu sync.Mutex
	byOp := map[string]int{}
	nc := natstest.Connect(t, srv.URL())
	if _, err := nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		parts := strings.SplitN(strings.TrimPrefix(m.Subject, "$JS.API."), ".", 3)
		mu.Lock()
		byOp[strings.Join(parts[:min(2, len(parts))], ".")]++
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	d = startTestDaemon(t, args...)
	defer d.stop()
	allVerified(d)
	if err := nc.Flush(); err != nil { // every request sent before now has reached us
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("restart with %d of %d files changed, until verified: %v", changed, files, byOp)
	// A changed file: one consumer to read what follows its checkpoint (the publisher's
	// resume), one to verify it. An unchanged one: none.
	if got := byOp["CONSUMER.CREATE"]; got > 2*changed {
		t.Errorf("%d consumers created after a restart with %d of %d files changed; want at most %d, none for an unchanged file",
			got, changed, files, 2*changed)
	}
}
