// Package pitest runs real Pi from Go tests: it drives the Node helper in
// conformance/pihelper (pihelper.mjs), which writes and reads session files with Pi's
// own code.
//
// New finds node, installs the helper's pinned packages with `npm ci` on first use (once
// per machine at a time: a lock file in os.TempDir serializes test processes), and skips
// the test when node is missing or the install fails — unless CI=true, where either
// fails the test instead, so that CI never passes by skipping the conformance suite.
package pitest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// MinNodeMajor is the oldest Node.js the helper runs on (Pi's harness modules work on
// Node 20; the packages declare 22.19, see the helper's README).
const MinNodeMajor = 20

// CallTimeout bounds one helper process.
const CallTimeout = 2 * time.Minute

// Helper runs pihelper.mjs with node.
type Helper struct {
	Node   string // the node binary
	Dir    string // conformance/pihelper
	Script string // conformance/pihelper/pihelper.mjs
}

var (
	setupOnce   sync.Once
	setupHelper *Helper
	setupErr    error
	setupSkip   bool // setupErr means "not available here" rather than "broken"
)

// InCI reports whether the CI variable says this is a CI run (CI=true, or 1).
func InCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// New returns the helper, ready to run. It skips t when node (at least MinNodeMajor) is
// not installed or `npm ci` fails; under CI=true both fail t instead. The lookup and the
// install happen once per test process.
func New(t testing.TB) *Helper {
	t.Helper()
	setupOnce.Do(func() { setupHelper, setupSkip, setupErr = setup() })
	return checkSetup(t, setupHelper, setupSkip, setupErr)
}

// checkSetup turns the outcome of setup into the helper, a skip, or (under CI) a failure.
func checkSetup(t testing.TB, h *Helper, skip bool, err error) *Helper {
	t.Helper()
	if err != nil {
		switch {
		case InCI():
			t.Fatalf("real-Pi conformance cannot run, and CI=true forbids skipping it: %v", err)
		case skip:
			t.Skipf("real-Pi conformance skipped: %v", err)
		default:
			t.Skipf("real-Pi conformance skipped (under CI=true this fails): %v", err)
		}
		return nil
	}
	return h
}

func setup() (h *Helper, skip bool, err error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, true, errors.New("node is not installed (.ci/install-deps installs it)")
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		return nil, true, fmt.Errorf("%s --version: %v", node, err)
	}
	version := strings.TrimSpace(string(out))
	major, _ := strconv.Atoi(strings.SplitN(strings.TrimPrefix(version, "v"), ".", 2)[0])
	if major < MinNodeMajor {
		return nil, true, fmt.Errorf("node %s is older than %d", version, MinNodeMajor)
	}
	dir, err := helperDir()
	if err != nil {
		return nil, false, err
	}
	if err := Install(dir); err != nil {
		return nil, false, err
	}
	return &Helper{Node: node, Dir: dir, Script: filepath.Join(dir, "pihelper.mjs")}, false, nil
}

// helperDir finds conformance/pihelper from the working directory (a package directory
// under `go test`) by walking up to the module root.
func helperDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			h := filepath.Join(dir, "conformance", "pihelper")
			if _, err := os.Stat(filepath.Join(h, "pihelper.mjs")); err != nil {
				return "", fmt.Errorf("module root %s has no conformance/pihelper/pihelper.mjs", dir)
			}
			return h, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no go.mod above %s", wd)
		}
	}
}

// Install runs `npm ci` in dir unless the packages that package-lock.json pins are
// already installed at those versions. Test processes of several packages may call it at
// once: an exclusive lock on a file in os.TempDir (named after dir) serializes them, and
// whoever comes second finds the packages in place.
func Install(dir string) error {
	unlock, err := lockFile(filepath.Join(os.TempDir(), "pisync-pihelper-"+pathTag(dir)+".lock"))
	if err != nil {
		return fmt.Errorf("lock for npm ci: %w", err)
	}
	defer unlock()
	stale, err := staleModules(dir)
	if err != nil {
		return err
	}
	if len(stale) == 0 {
		return nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("npm is not installed, and %s needs `npm ci` (%s)", dir, strings.Join(stale, "; "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in %s: %v\n%s", dir, err, out)
	}
	if stale, err := staleModules(dir); err != nil || len(stale) > 0 {
		return fmt.Errorf("npm ci in %s succeeded, yet: %s %v", dir, strings.Join(stale, "; "), err)
	}
	return nil
}

// staleModules lists the direct dependencies (dev ones included: a package's tests and
// build need them) of package.json that node_modules lacks, or
// holds at another version than package-lock.json pins.
func staleModules(dir string) ([]string, error) {
	var pkg struct {
		Dependencies    map[string]string `json:"dependencies"`
		DevDependencies map[string]string `json:"devDependencies"`
	}
	var lock struct {
		Packages map[string]struct {
			Version string `json:"version"`
		} `json:"packages"`
	}
	if err := readJSON(filepath.Join(dir, "package.json"), &pkg); err != nil {
		return nil, err
	}
	if err := readJSON(filepath.Join(dir, "package-lock.json"), &lock); err != nil {
		return nil, err
	}
	var stale []string
	names := maps.Clone(pkg.Dependencies)
	if names == nil {
		names = map[string]string{}
	}
	maps.Copy(names, pkg.DevDependencies)
	for name := range names {
		want := lock.Packages["node_modules/"+name].Version
		var got struct {
			Version string `json:"version"`
		}
		if err := readJSON(filepath.Join(dir, "node_modules", filepath.FromSlash(name), "package.json"), &got); err != nil {
			stale = append(stale, name+" not installed")
		} else if got.Version != want {
			stale = append(stale, fmt.Sprintf("%s %s installed, lock pins %s", name, got.Version, want))
		}
	}
	return stale, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// pathTag is a short file-name-safe tag of a directory path.
func pathTag(p string) string {
	var h uint32 = 2166136261 // FNV-1a
	for i := 0; i < len(p); i++ {
		h = (h ^ uint32(p[i])) * 16777619
	}
	return strconv.FormatUint(uint64(h), 16)
}

// Error is a helper run that exited non-zero.
type Error struct {
	Args   []string
	Code   int
	Stderr string
}

func (e *Error) Error() string {
	return fmt.Sprintf("pihelper %s: exit %d: %s", strings.Join(e.Args, " "), e.Code, strings.TrimSpace(e.Stderr))
}

// Output runs the helper with args and returns its stdout. A non-zero exit returns the
// stdout printed so far and an *Error that carries Pi's message.
func (h *Helper) Output(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, h.Node, append([]string{h.Script}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return stdout.Bytes(), &Error{Args: args, Code: exit.ExitCode(), Stderr: stderr.String()}
	}
	if err != nil {
		return nil, fmt.Errorf("pihelper %s: %w", strings.Join(args, " "), err)
	}
	return stdout.Bytes(), nil
}

// JSON runs the helper with args and decodes its stdout into v; any failure fails t.
func (h *Helper) JSON(t testing.TB, v any, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	out, err := h.Output(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("pihelper %s: decode output: %v", strings.Join(args, " "), err)
	}
}

// Scenario is one item of write-scenarios' manifest.
type Scenario struct {
	Name               string `json:"name"`
	API                string `json:"api"`    // harness or cli: the loader to dump it with
	Format             string `json:"format"` // harness-v3, cli-v3, cli-v1
	Path               string `json:"path"`
	SessionsRoot       string `json:"sessionsRoot"`
	RelPath            string `json:"relPath"`
	ConversationID     string `json:"conversationId"`
	ForkOf             string `json:"forkOf,omitempty"`
	ExpectedLeafID     string `json:"expectedLeafId,omitempty"`
	FirstMessageID     string `json:"firstMessageId,omitempty"`
	FirstReplyID       string `json:"firstReplyId,omitempty"`
	DanglingRootParent bool   `json:"danglingRootParent,omitempty"`
}

// Loader is the dump loader for the file: Pi's CLI SessionManager misreads harness files
// that hold `leaf` entries, so harness files are read with the harness loader.
func (s Scenario) Loader() string { return LoaderFor(s.API) }

// LoaderFor maps a scenario's api to its dump loader: "cli" (the current coding-agent),
// "cli-0.73" (@mariozechner/pi-coding-agent 0.73.1), else "harness".
func LoaderFor(api string) string {
	switch api {
	case "cli", Cli073:
		return api
	}
	return "harness"
}

// Cli073 is the api and loader of sessions written and read by
// @mariozechner/pi-coding-agent 0.73.1, the most-installed CLI release.
const Cli073 = "cli-0.73"

// WriteCli073 has pi-coding-agent 0.73.1 write its scenarios under agentDir/sessions (Pi's
// layout: one directory per cwd).
func (h *Helper) WriteCli073(t testing.TB, agentDir string) []Scenario {
	t.Helper()
	var items []Scenario
	h.JSON(t, &items, "write-cli073", agentDir)
	return items
}

// AppendCli073 opens the session at path with pi-coding-agent 0.73.1's SessionManager, as
// `pi --continue` does, and appends count exchanges (a user message and a reply each).
func (h *Helper) AppendCli073(t testing.TB, path string, count int) {
	t.Helper()
	var out struct {
		Path string `json:"path"`
	}
	h.JSON(t, &out, "append-cli073", path, "--count", strconv.Itoa(count))
	if out.Path != path {
		t.Fatalf("append-cli073 appended to %s, not %s", out.Path, path)
	}
}

// WriteScenarios has Pi write the scenario tree under dir (see the helper's README).
func (h *Helper) WriteScenarios(t testing.TB, dir string) []Scenario {
	t.Helper()
	var items []Scenario
	h.JSON(t, &items, "write-scenarios", dir)
	return items
}

// V1File is what write-v1 reports.
type V1File struct {
	Path           string `json:"path"`
	ConversationID string `json:"conversationId"`
	Format         string `json:"format"`
	Lines          int    `json:"lines"`
}

// WriteV1 writes a legacy version-1 file: at path if it ends in .jsonl, else in Pi's
// layout under the sessions root path.
func (h *Helper) WriteV1(t testing.TB, path string) V1File {
	t.Helper()
	var f V1File
	h.JSON(t, &f, "write-v1", path)
	return f
}

// Migration is what migrate reports.
type Migration struct {
	Path           string `json:"path"`
	ConversationID string `json:"conversationId"`
	FromVersion    int    `json:"fromVersion"`
	ToVersion      int    `json:"toVersion"`
	Rewritten      bool   `json:"rewritten"`
	Entries        int    `json:"entries"`
}

// Migrate opens path with Pi's CLI SessionManager, which migrates an old file in place.
func (h *Helper) Migrate(t testing.TB, path string) Migration {
	t.Helper()
	var m Migration
	h.JSON(t, &m, "migrate", path)
	return m
}

// LiveOptions are the flags of live (zero: the helper's default).
type LiveOptions struct {
	Count      int
	IntervalMs int
	Cwd        string
	Bytes      int
}

// LiveEvent is one line of live's output.
type LiveEvent struct {
	Event          string `json:"event"` // session or entry
	Path           string `json:"path,omitempty"`
	ConversationID string `json:"conversationId,omitempty"`
	Created        bool   `json:"created,omitempty"`
	ID             string `json:"id,omitempty"`
	N              int    `json:"n,omitempty"`
}

// Live is a running `live` process: Pi appending messages to a harness session.
type Live struct {
	cmd    *exec.Cmd
	args   []string
	stderr bytes.Buffer
	events chan LiveEvent
	done   chan struct{}
	all    []LiveEvent
}

// StartLive starts `live path` in the background; Wait collects it.
func (h *Helper) StartLive(t testing.TB, path string, o LiveOptions) *Live {
	t.Helper()
	args := []string{"live", path}
	if o.Count > 0 {
		args = append(args, "--count", strconv.Itoa(o.Count))
	}
	if o.IntervalMs > 0 {
		args = append(args, "--interval-ms", strconv.Itoa(o.IntervalMs))
	}
	if o.Cwd != "" {
		args = append(args, "--cwd", o.Cwd)
	}
	if o.Bytes > 0 {
		args = append(args, "--bytes", strconv.Itoa(o.Bytes))
	}
	l := &Live{args: args, events: make(chan LiveEvent, 1024), done: make(chan struct{})}
	l.cmd = exec.Command(h.Node, append([]string{h.Script}, args...)...)
	l.cmd.Stderr = &l.stderr
	stdout, err := l.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.cmd.Start(); err != nil {
		t.Fatalf("pihelper %s: %v", strings.Join(args, " "), err)
	}
	go l.read(stdout)
	t.Cleanup(func() {
		select {
		case <-l.done:
		default:
			_ = l.cmd.Process.Kill()
			<-l.done
		}
	})
	return l
}

func (l *Live) read(r io.Reader) {
	defer close(l.done)
	defer close(l.events)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var e LiveEvent
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			l.all = append(l.all, e)
			l.events <- e
		}
	}
	_ = l.cmd.Wait()
}

// Next waits for the next event; ok is false when the process ended first.
func (l *Live) Next(t testing.TB, timeout time.Duration) (e LiveEvent, ok bool) {
	t.Helper()
	select {
	case e, ok = <-l.events:
		return e, ok
	case <-time.After(timeout):
		t.Fatalf("pihelper %s: no event within %v", strings.Join(l.args, " "), timeout)
		return LiveEvent{}, false
	}
}

// Wait waits for the process to end, requires exit 0, and returns every event it printed.
func (l *Live) Wait(t testing.TB) []LiveEvent {
	t.Helper()
	for range l.events {
		// drain what Next has not taken
	}
	<-l.done
	if code := l.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("pihelper %s: exit %d: %s", strings.Join(l.args, " "), code, strings.TrimSpace(l.stderr.String()))
	}
	return l.all
}
