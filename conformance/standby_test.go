package conformance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/pitest"
	"github.com/pisync/pisync/mirror"
)

// proc is a pisync command running in a process of its own.
type proc struct {
	*daemontest.Proc
	name string
	log  *daemontest.Output
}

// startProc runs `pisync args...` with the environment of the test's host (env added).
func startProc(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, log: &daemontest.Output{}}
	dp, err := daemontest.Start(pisyncBinary(t), args, append(daemontest.Env(), env...), p.log)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p.Proc = dp
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, p.log.String())
		}
	})
	return p
}

// term stops it with SIGTERM and requires exit 0.
func (p *proc) term(t *testing.T) {
	t.Helper()
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("%s after SIGTERM: %v\n%s", p.name, err, p.log.String())
	}
}

// TestWarmStandby is a failover with real Pi: Pi writes a session on host A, a follower
// on host B keeps B's copy current line by line; A is killed, B's daemon starts on the
// followed root, and Pi continues the session in B's file. The mirror then holds one
// conversation, A's lines then B's, each once, and Pi opens B's file with every entry.
func TestWarmStandby(t *testing.T) {
	t.Parallel()
	pi := pitest.New(t)
	srv := natstest.Run(t)
	base := t.TempDir()
	rootA, rootB := filepath.Join(base, "a", "sessions"), filepath.Join(base, "b", "sessions")
	for _, d := range []string{rootA, rootB} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PISYNC_LOCK_DIR=" + filepath.Join(base, "locks")}
	conn := []string{"--nats", srv.URL(), "--tenant", tenant, "--owner", owner}
	run := func(name, root, host string) *proc {
		return startProc(t, name, env, append([]string{"run", "--root", root, "--host", host,
			"--state-dir", filepath.Join(base, "state-"+host), "--http-addr", "", "--log-format", "console", "--log-level", "warn"}, conn...)...)
	}
	a := run("pisync run on host A", rootA, "host-a")
	follower := startProc(t, "pisync recover --follow on host B", env,
		append([]string{"recover", "--follow", "--all", "--out", rootB}, conn...)...)

	// Pi writes on A; each entry reaches B's file, in order, complete lines only.
	live := pi.StartLive(t, rootA, pitest.LiveOptions{Count: 6, IntervalMs: 150, Cwd: "/home/dev/standby"})
	start, ok := live.Next(t, time.Minute)
	if !ok || start.Event != "session" {
		t.Fatalf("pihelper live: %+v", start)
	}
	rel, err := filepath.Rel(rootA, start.Path)
	if err != nil {
		t.Fatal(err)
	}
	pathB := filepath.Join(rootB, rel)
	seen := 0
	for {
		e, ok := live.Next(t, time.Minute)
		if !ok {
			break
		}
		seen++
		waitUntil(t, fmt.Sprintf("entry %d (%s) on host B", e.N, e.ID), func() (bool, string) {
			b, _ := os.ReadFile(pathB)
			a, _ := os.ReadFile(start.Path)
			ok := bytes.Contains(b, []byte(`"id":"`+e.ID+`"`)) && bytes.HasPrefix(a, b) && (len(b) == 0 || b[len(b)-1] == '\n')
			return ok, fmt.Sprintf("B has %d bytes, A %d", len(b), len(a))
		})
	}
	live.Wait(t)
	if seen != 6 {
		t.Fatalf("%d entries written by Pi, want 6", seen)
	}
	waitUntil(t, "B equal to A", func() (bool, string) {
		b, _ := os.ReadFile(pathB)
		a, _ := os.ReadFile(start.Path)
		return bytes.Equal(a, b), fmt.Sprintf("B has %d bytes, A %d", len(b), len(a))
	})
	linesA := mustRead(t, start.Path)

	// A is lost; B becomes the primary: the follower stops, B's daemon takes the root.
	a.Kill()
	follower.term(t)
	b := run("pisync run on host B", rootB, "host-b")
	pi.StartLive(t, pathB, pitest.LiveOptions{Count: 3}).Wait(t)
	mc := newMirrorClient(t, srv.URL())
	mc.waitMirrored(t, rootB)
	b.term(t)

	final := mustRead(t, pathB)
	if !bytes.HasPrefix(final, linesA) || len(final) == len(linesA) {
		t.Fatalf("B's file does not continue A's: %d bytes after %d", len(final), len(linesA))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	heads, err := mc.r.Heads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(heads) != 1 || heads[0].ConvKey() != start.ConversationID || heads[0].Generation != 1 || heads[0].Host != "host-b" {
		t.Fatalf("heads after the failover: %+v (want one, %s, generation 1, written by host-b)", heads, start.ConversationID)
	}
	conv, err := mc.r.Conv(start.ConversationID)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []mirror.Msg
	if err := mc.r.Scan(ctx, conv, mirror.ScanOptions{}, func(m mirror.Msg) error {
		msgs = append(msgs, m)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	nA := bytes.Count(linesA, []byte("\n"))
	lines := bytes.Split(bytes.TrimSuffix(final, []byte("\n")), []byte("\n"))
	if len(msgs) != len(lines) {
		t.Fatalf("the mirror holds %d lines of the conversation, B's file %d", len(msgs), len(lines))
	}
	for i, m := range msgs {
		host := "host-a"
		if i >= nA {
			host = "host-b"
		}
		switch {
		case ids[m.MsgID]:
			t.Errorf("message %s stored twice", m.MsgID)
		case m.Ordinal != int64(i) || m.Generation != 1:
			t.Errorf("message %d: ordinal %d, generation %d", i, m.Ordinal, m.Generation)
		case !bytes.Equal(m.Data, lines[i]):
			t.Errorf("ordinal %d differs from B's line %d", i, i+1)
		case m.Host != host:
			t.Errorf("ordinal %d mirrored by %s, want %s", i, m.Host, host)
		}
		ids[m.MsgID] = true
	}
	dump := pi.DumpFile(t, pathB, "harness")
	messages := 0
	for _, e := range dump.Entries {
		if e.Type == "message" {
			messages++
		}
	}
	if messages != 9 || dump.LeafID == nil || !strings.Contains(string(final), *dump.LeafID) {
		t.Errorf("Pi reads %d messages from B's file (want 9), leaf %v", messages, dump.LeafID)
	}
}

// waitUntil polls cond until it holds, failing the test after mirrorTimeout.
func waitUntil(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(mirrorTimeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, why)
		}
		time.Sleep(20 * time.Millisecond) // polling interval of a poll-with-deadline
	}
}
