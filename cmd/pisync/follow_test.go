package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

// followCmd is `pisync recover --follow` running in this process.
type followCmd struct {
	cancel         context.CancelFunc
	done           chan error
	stdout, stderr *daemontest.Output
}

func startFollow(t *testing.T, args ...string) *followCmd {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &followCmd{cancel: cancel, done: make(chan error, 1), stdout: &daemontest.Output{}, stderr: &daemontest.Output{}}
	go func() {
		c.done <- RecoverCommand(ctx, append([]string{"--tenant", "t1", "--owner", "alice", "--follow"}, args...), c.stdout, c.stderr)
	}()
	t.Cleanup(func() { c.stop(t) })
	return c
}

func (c *followCmd) stop(t *testing.T) {
	t.Helper()
	if c.cancel == nil {
		return
	}
	c.cancel()
	c.cancel = nil
	if err := <-c.done; err != nil {
		t.Errorf("recover --follow: %v\n%s", err, c.stderr.String())
	}
}

var statusAddr = regexp.MustCompile(`status page\s+\{"http": "([^"]+)"\}`)

// httpAddr is the address the follower's status page listens on, once it says.
func (c *followCmd) httpAddr(t *testing.T) string {
	t.Helper()
	var addr string
	waitFor(t, 10*time.Second, "the status page address", func() (bool, string) {
		m := statusAddr.FindStringSubmatch(c.stderr.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil, c.stderr.String()
	})
	return addr
}

// httpBody fetches url and returns its body, failing the test unless it is 200 OK.
func httpBody(t *testing.T, url string) string {
	t.Helper()
	code, body, _ := httpGet(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	return body
}

// TestFollowStandby: a follower keeps a second root current with what a daemon mirrors
// from the first, line by line, and neither it nor a daemon shares its root.
func TestFollowStandby(t *testing.T) {
	t.Setenv("PISYNC_LOCK_DIR", t.TempDir())
	rng := rand.New(rand.NewPCG(71, 72))
	srv := natstest.Run(t)
	primary, standby := t.TempDir(), t.TempDir()
	f := sessiontest.New(rng, primary, "/home/dev/app", sessiontest.HarnessV3)
	if err := f.Append(f.HeaderLine("/home/dev/app"), f.Message(200)); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", primary, "--host", "laptop", "--state-dir", t.TempDir())
	defer d.stop()

	c := startFollow(t, "--nats", srv.URL(), "--all", "--out", standby, "--http-addr", "127.0.0.1:0")
	rel, err := filepath.Rel(primary, f.Path)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(standby, rel)
	same := func(what string) {
		t.Helper()
		want := f.Content()
		waitFor(t, 20*time.Second, what, func() (bool, string) {
			got, err := os.ReadFile(copyPath)
			return bytes.Equal(got, want), fmt.Sprintf("%d of %d bytes (%v)", len(got), len(want), err)
		})
	}
	same("the session recovered on the standby")
	for i := range 5 {
		if err := f.Append(f.Message(100 + 50*i)); err != nil {
			t.Fatal(err)
		}
		same(fmt.Sprintf("line %d on the standby", i+3))
	}
	g := sessiontest.New(rng, primary, "/home/dev/other", sessiontest.HarnessV3)
	if err := g.Append(g.HeaderLine("/home/dev/other"), g.Message(300)); err != nil {
		t.Fatal(err)
	}
	relG, _ := filepath.Rel(primary, g.Path)
	waitFor(t, 20*time.Second, "a new session on the standby", func() (bool, string) {
		got, err := os.ReadFile(filepath.Join(standby, relG))
		return bytes.Equal(got, g.Content()), fmt.Sprint(err, c.stdout.String())
	})

	// Status: the page, its JSON and the metrics say where the follower is.
	addr := c.httpAddr(t)
	var doc followDoc
	waitFor(t, 10*time.Second, "the status caught up", func() (bool, string) {
		if err := json.Unmarshal([]byte(httpBody(t, "http://"+addr+"/status.json")), &doc); err != nil {
			return false, err.Error()
		}
		return doc.Started && doc.Current == 2 && doc.Behind == 0 && doc.Appended >= 5, fmt.Sprintf("%+v", doc)
	})
	if page := httpBody(t, "http://"+addr+"/"); !strings.Contains(page, "Conversations current</th><td>2<") {
		t.Errorf("status page:\n%s", page)
	}
	metrics := httpBody(t, "http://"+addr+"/metrics")
	for _, want := range []string{`pisync_follow_conversations{state="current"} 2`, "pisync_follow_behind_entries 0",
		"pisync_follow_lag_seconds_count", "pisync_follow_appended_lines_total"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// The README's table of the follower's metrics is what it exports.
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(pisync_follow_[a-z_]+)").FindAllStringSubmatch(string(readme), -1) {
		documented[m[1]] = true
	}
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (pisync_follow_[a-z_]+) `).FindAllStringSubmatch(metrics, -1) {
		exported[m[1]] = true
		if !documented[m[1]] {
			t.Errorf("%s is exported but not in the README", m[1])
		}
	}
	for name := range documented {
		if !exported[name] {
			t.Errorf("%s is in the README but not exported", name)
		}
	}
	if len(exported) < 8 {
		t.Errorf("only %d follower metrics exported", len(exported))
	}
	if !strings.Contains(c.stdout.String(), "written") {
		t.Errorf("the follower reported nothing:\n%s", c.stdout.String())
	}

	// One root, one writer: a daemon is refused the followed root, and a second
	// follower the daemon's.
	var runErr bytes.Buffer
	err = RunCommand(context.Background(), []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice",
		"--root", filepath.Join(standby, "--home-dev-app--"), "--state-dir", t.TempDir(), "--http-addr", ""}, io.Discard, &runErr)
	if err == nil || !strings.Contains(err.Error(), "pisync recover --follow (pid") || !strings.Contains(err.Error(), "never share a root") {
		t.Fatalf("pisync run on the followed root: %v", err)
	}
	var out, errOut bytes.Buffer
	err = RecoverCommand(context.Background(), []string{"--nats", srv.URL(), "--tenant", "t1", "--owner", "alice",
		"--all", "--follow", "--root", primary}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "pisync run (pid") {
		t.Fatalf("recover --follow on the daemon's root: %v", err)
	}

	// Stopped, the follower lets the daemon take the root (the failover).
	c.stop(t)
	d2 := startTestDaemon(t, "--nats", srv.URL(), "--root", standby, "--host", "desktop", "--state-dir", t.TempDir())
	d2.stop()
}
