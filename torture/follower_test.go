package torture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/recovery"
)

// A warm standby runs beside the daemon: `pisync recover --follow --all --out DIR`, killed
// with the daemon and started again at once. At each quiet point every conversation that
// `recover --all` writes must be in the follower's directory exactly as recover writes
// it, or be reported by the follower as left in place; a conversation recover refuses as
// shrunk must be reported.

// startFollower starts the follower process of the run.
func (r *run) startFollower(t testing.TB) {
	r.followDir = filepath.Join(r.dir, "standby")
	r.f = &daemon{bin: r.cfg.Bin, logPath: filepath.Join(r.dir, "follower.log"),
		http: fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))}
	r.f.args = []string{"recover", "--follow", "--all", "--out", r.followDir, "--json", "--http-addr", r.f.http,
		"--nats", r.nats.url(), "--tenant", tenant, "--owner", owner, "--connect-timeout", "60s"}
	if err := r.f.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.f.kill() })
}

// followerUp fails when the follower exited: it runs until stopped, whatever the mirror
// does.
func (r *run) followerUp() *Failure {
	if err := r.f.running(); err != nil {
		return &Failure{Guarantee: "the follower stays up", Detail: fmt.Sprintf("%v: %s", err, tail(r.f.logPath))}
	}
	if p := logProblems(r.f.logPath); len(p) > 0 {
		return &Failure{Guarantee: "the follower does not race or panic", Detail: strings.Join(p, "\n")}
	}
	return nil
}

// restartFollower kills the follower and starts it again.
func (r *run) restartFollower() error {
	r.f.kill()
	return r.f.start()
}

// followedStatus is the part of the follower's /status.json the harness reads.
type followedStatus struct {
	Started bool            `json:"started"`
	Behind  uint64          `json:"behind_entries"`
	Left    []recovery.Left `json:"left"`
}

func (r *run) followerStatus() (followedStatus, error) {
	var st followedStatus
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + r.f.http + "/status.json")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// followFaults compares the follower's directory with what `recover --all --out out`
// wrote (rep), polling until they agree or the deadline passes.
func (r *run) followFaults(rep recoverReport, out string) []string {
	deadline := time.Now().Add(r.deadline(60 * time.Second))
	pause := 50 * time.Millisecond
	for {
		bad := r.followDiff(rep, out)
		if len(bad) == 0 || time.Now().After(deadline) {
			return bad
		}
		time.Sleep(pause) // poll with a deadline: the follower catches up on its own
		pause = min(2*pause, time.Second)
	}
}

func (r *run) followDiff(rep recoverReport, out string) []string {
	st, err := r.followerStatus()
	if err != nil {
		return []string{"follower status: " + err.Error()}
	}
	if !st.Started {
		return []string{"the follower has not finished its first recovery"}
	}
	left := map[string]string{}
	for _, l := range st.Left {
		left[l.Key] = l.Reason
	}
	var bad []string
	for _, c := range rep.Conversations {
		if _, ok := left[c.Key]; ok {
			continue // reported
		}
		switch {
		case c.Result == string(recovery.Refused) && strings.Contains(c.Reason, recovery.ErrShrunk.Error()):
			bad = append(bad, fmt.Sprintf("key %s: its newest generation is shrunk and the follower does not report it", c.Key))
			continue
		case c.Result != string(recovery.Written) && c.Result != string(recovery.Unchanged):
			continue
		}
		rel, err := filepath.Rel(out, c.Output)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		want, err := os.ReadFile(c.Output)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		got, err := os.ReadFile(filepath.Join(r.followDir, rel))
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("key %s: not followed (%v)", c.Key, err))
		case !bytes.Equal(got, want):
			bad = append(bad, fmt.Sprintf("key %s (%s): the follower's file has %d bytes, recover writes %d (generation %d), behind %d",
				c.Key, rel, len(got), len(want), c.Generation, st.Behind))
		}
	}
	sort.Strings(bad)
	return bad
}

// tail is the end of a log file, for a failure's detail.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	return string(b[max(0, len(b)-2000):])
}
