package conformance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/pitest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// The tenant and owner every test daemon publishes under.
const (
	tenant = "t"
	owner  = "o"
)

// mirrorTimeout bounds every wait for the daemon to mirror what Pi wrote.
const mirrorTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	code := m.Run()
	daemontest.Remove()
	os.Exit(code)
}

// pisyncBinary is cmd/pisync, built once per test process.
func pisyncBinary(t testing.TB) string {
	t.Helper()
	return daemontest.Binary(t)
}

// daemon is `pisync run` in a process of its own.
type daemon struct {
	*daemontest.Proc
	log *daemontest.Output
}

// startDaemon runs `pisync run` against the NATS at url, watching roots, until stop.
func startDaemon(t *testing.T, url, stateDir string, roots ...string) *daemon {
	t.Helper()
	args := []string{"run", "--nats", url, "--state-dir", stateDir, "--http-addr", "",
		"--tenant", tenant, "--owner", owner, "--log-format", "console", "--log-level", "warn"}
	for _, r := range roots {
		args = append(args, "--root", r)
	}
	d := &daemon{log: &daemontest.Output{}}
	p, err := daemontest.Start(pisyncBinary(t), args, nil, d.log)
	if err != nil {
		t.Fatal(err)
	}
	d.Proc = p
	t.Cleanup(func() {
		d.Kill()
		if log := d.log.String(); t.Failed() && log != "" {
			t.Logf("pisync run's log:\n%s", log)
		}
	})
	return d
}

// stop sends SIGTERM and requires a clean exit (code 0) within the drain timeout.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	if !d.Running() {
		t.Fatalf("pisync run exited before it was stopped: %v\n%s", d.Err(), d.log.String())
	}
	if err := d.Stop(30 * time.Second); err != nil {
		t.Fatalf("pisync run after SIGTERM: %v (want exit 0 within 30 s)\n%s", err, d.log.String())
	}
}

// pisync runs a pisync command to completion and returns stdout, stderr and exit code.
func pisync(t *testing.T, args ...string) (stdout, stderr []byte, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, pisyncBinary(t), args...)
	cmd.Env = daemontest.Env()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("pisync %s: %v", strings.Join(args, " "), err)
	}
	return out.Bytes(), errb.Bytes(), code
}

// recoverDoc is the --json output of pisync recover.
type recoverDoc struct {
	Conversations []recovery.Report `json:"conversations"`
	Summary       recovery.Summary  `json:"summary"`
}

// recoverJSON runs `pisync recover --json` with args and requires exit 0.
func recoverJSON(t *testing.T, url string, args ...string) recoverDoc {
	t.Helper()
	args = append([]string{"recover", "--nats", url, "--tenant", tenant, "--owner", owner, "--json"}, args...)
	out, errOut, code := pisync(t, args...)
	var doc recoverDoc
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("pisync %s: exit %d, output is not a report (%v):\n%s\n%s", strings.Join(args, " "), code, err, out, errOut)
	}
	if code != 0 {
		var why []string
		for _, r := range doc.Conversations {
			if !r.Result.OK() {
				why = append(why, fmt.Sprintf("%s %s: %s", r.Result, r.Conversation, r.Reason))
			}
		}
		t.Fatalf("pisync %s: exit %d, want 0:\n%s\n%s", strings.Join(args, " "), code, strings.Join(why, "\n"), errOut)
	}
	return doc
}

// rootArgs passes the daemon's roots to recover, which writes in place only under them.
func rootArgs(roots ...string) []string {
	var args []string
	for _, r := range roots {
		args = append(args, "--root", r)
	}
	return args
}

// byConversation indexes reports by conversation id.
func (d recoverDoc) byConversation() map[string]recovery.Report {
	m := map[string]recovery.Report{}
	for _, r := range d.Conversations {
		m[r.Conversation] = r
	}
	return m
}

// mirrorClient reads the mirror as the test owner, and deletes from it.
type mirrorClient struct {
	r      *mirror.Reader
	stream jetstream.Stream
}

func newMirrorClient(t *testing.T, url string) *mirrorClient {
	t.Helper()
	nc := natstest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	o, err := mirror.NewOwner(tenant, owner)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The daemon provisions the stream and buckets when it starts.
	var r *mirror.Reader
	deadline := time.Now().Add(20 * time.Second)
	for {
		if r, err = mirror.NewReader(ctx, js, mirror.DefaultNames(), o); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mirror is not provisioned: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // polling interval of a poll-with-deadline
	}
	s, err := js.Stream(ctx, mirror.DefaultNames().Stream())
	if err != nil {
		t.Fatal(err)
	}
	return &mirrorClient{r: r, stream: s}
}

// sessionFiles lists the *.jsonl files under the roots (that exist), sorted.
func sessionFiles(t *testing.T, roots ...string) []string {
	t.Helper()
	var out []string
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if errors.Is(err, os.ErrNotExist) && p == root {
				return filepath.SkipDir
			}
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".jsonl") {
				out = append(out, p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(out)
	return out
}

// conversationID is the header id of a session file's first line.
func conversationID(line []byte) (string, error) {
	var h struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	}
	if err := json.Unmarshal(line, &h); err != nil || h.Type != "session" || h.ID == "" {
		return "", fmt.Errorf("first line is not a session header: %.80s", line)
	}
	return h.ID, nil
}

// mirrored says whether the newest generation of the file's conversation holds exactly
// the file's lines, in order, and its head records all of them; if not, why.
func (c *mirrorClient) mirrored(ctx context.Context, path string) (bool, string) {
	content, err := os.ReadFile(path)
	if err != nil {
		return false, err.Error()
	}
	if len(content) == 0 || content[len(content)-1] != '\n' {
		return false, path + ": empty, or its last line is still being written"
	}
	lines := bytes.Split(content[:len(content)-1], []byte("\n"))
	lead := session.Identify(filepath.Base(path), lines[:min(len(lines), session.LeadLines)], len(lines) > session.LeadLines)
	if lead.Kind != session.LeadHeader && lead.Kind != session.LeadHeaderless {
		return false, fmt.Sprintf("%s: not a session (%s %s)", path, lead.Kind, lead.Reason)
	}
	conv, err := c.r.Conv(lead.Header.ID)
	if err != nil {
		return false, err.Error()
	}
	g, err := c.r.ReadGeneration(ctx, conv, 0)
	if err != nil {
		return false, fmt.Sprintf("%s: %v", path, err)
	}
	if len(g.Msgs) != len(lines) {
		return false, fmt.Sprintf("%s: generation %d holds %d lines, the file %d", path, g.Number, len(g.Msgs), len(lines))
	}
	for i, m := range g.Msgs {
		switch {
		case m.Ordinal != int64(i):
			return false, fmt.Sprintf("%s: ordinal %d at line %d", path, m.Ordinal, i+1)
		case m.SHA256 != sha256hex(lines[i]):
			return false, fmt.Sprintf("%s: line %d: the mirror has other bytes", path, i+1)
		case m.Kind != mirror.KindBlob && !bytes.Equal(m.Data, lines[i]):
			return false, fmt.Sprintf("%s: line %d: body differs from its digest", path, i+1)
		}
	}
	h, _, err := c.r.Head(ctx, conv)
	if err != nil {
		return false, fmt.Sprintf("%s: %v", path, err)
	}
	if h.Generation != g.Number || h.LastOrdinal != int64(len(lines)-1) {
		return false, fmt.Sprintf("%s: head at generation %d ordinal %d, stream at generation %d ordinal %d",
			path, h.Generation, h.LastOrdinal, g.Number, len(lines)-1)
	}
	return true, ""
}

// waitMirrored polls until every session file under the roots is mirrored exactly.
func (c *mirrorClient) waitMirrored(t *testing.T, roots ...string) {
	t.Helper()
	deadline := time.Now().Add(mirrorTimeout)
	for {
		why := ""
		files := sessionFiles(t, roots...)
		if len(files) == 0 {
			why = "no session files yet"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		for _, p := range files {
			if ok, w := c.mirrored(ctx, p); !ok {
				why = w
				break
			}
		}
		cancel()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not mirrored after %v: %s", mirrorTimeout, why)
		}
		time.Sleep(100 * time.Millisecond) // polling interval of a poll-with-deadline
	}
}

// deleteEntries removes the messages of the given entry ids from the newest generation
// of a conversation in the stream, and returns the ordinal each one had.
func (c *mirrorClient) deleteEntries(t *testing.T, convID string, ids []string) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conv, err := c.r.Conv(convID)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var msgs []mirror.Msg
	newest := 0
	err = c.r.Scan(ctx, conv, mirror.ScanOptions{HeadersOnly: true}, func(m mirror.Msg) error {
		msgs = append(msgs, m)
		newest = max(newest, m.Generation)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ordinals := map[string]int64{}
	for _, m := range msgs {
		if m.Generation != newest || !want[m.EntryID] {
			continue
		}
		if _, dup := ordinals[m.EntryID]; dup {
			t.Fatalf("conversation %s: entry %s mirrored twice", convID, m.EntryID)
		}
		if err := c.stream.DeleteMsg(ctx, m.Seq); err != nil {
			t.Fatalf("delete %s (stream sequence %d): %v", m.EntryID, m.Seq, err)
		}
		ordinals[m.EntryID] = m.Ordinal
	}
	for _, id := range ids {
		if _, ok := ordinals[id]; !ok {
			t.Fatalf("conversation %s: entry %s is not in the mirror", convID, id)
		}
	}
	return ordinals
}

// readLines reads a file's lines, without their newlines.
func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
}

// firstDifference names the first line at which got differs from want.
func firstDifference(want, got []byte) string {
	wl := bytes.Split(want, []byte("\n"))
	gl := bytes.Split(got, []byte("\n"))
	for i := 0; i < min(len(wl), len(gl)); i++ {
		if !bytes.Equal(wl[i], gl[i]) {
			at := 0
			for at < min(len(wl[i]), len(gl[i])) && wl[i][at] == gl[i][at] {
				at++
			}
			excerpt := func(l []byte) string {
				from, to := max(0, at-40), min(len(l), at+40)
				return fmt.Sprintf("…%s…", l[from:to])
			}
			return fmt.Sprintf("line %d differs at byte %d: want %s, got %s", i+1, at, excerpt(wl[i]), excerpt(gl[i]))
		}
	}
	return fmt.Sprintf("want %d bytes (%d lines), got %d bytes (%d lines)", len(want), len(wl), len(got), len(gl))
}

// dumpRequests are the DumpMany requests for files with their loaders.
func dumpRequests(loaders map[string]string) []pitest.DumpRequest {
	var reqs []pitest.DumpRequest
	for p, l := range loaders {
		reqs = append(reqs, pitest.DumpRequest{Path: p, Loader: l})
	}
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].Path < reqs[j].Path })
	return reqs
}

func sha256hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// stopwatch logs how long each phase of a test took (go test -v shows them).
type stopwatch struct {
	t     *testing.T
	start time.Time
	last  time.Time
}

func newStopwatch(t *testing.T) *stopwatch {
	now := time.Now()
	return &stopwatch{t: t, start: now, last: now}
}

func (s *stopwatch) lap(phase string) {
	s.t.Helper()
	now := time.Now()
	s.t.Logf("%-32s %6.2fs (total %6.2fs)", phase, now.Sub(s.last).Seconds(), now.Sub(s.start).Seconds())
	s.last = now
}
