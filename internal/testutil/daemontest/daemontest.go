// Package daemontest builds the pisync command once per test process and runs it as a
// child process: for the tests that need the daemon in a process of its own (SIGKILL,
// its own memory and CPU, a -race build, several replicas).
package daemontest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Package is the import path of the command built.
const Package = "github.com/pisync/pisync/cmd/pisync"

var (
	buildMu sync.Mutex
	dir     string           // this process's build directory, made by the first build
	built   = map[bool]bin{} // by race
)

type bin struct {
	path string
	err  error
}

// BinEnv names a pisync binary (built without -race) for Build to return instead of
// building one: make test builds it once for every package's tests and the TypeScript
// client's (whose harness reads the same variable), instead of once per test process.
const BinEnv = "PISYNC_BIN"

// Build builds cmd/pisync, with the race detector if race, once per process and flavour,
// and returns the binary's path; a failed build is not tried again. The binaries live in
// a directory of this process that Remove deletes. The go command's build cache makes
// every build after the first one of a machine mostly a link. Without race, the binary
// BinEnv names, if it is set, is used as it is.
func Build(race bool) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, ok := built[race]; ok {
		return b.path, b.err
	}
	var b bin
	if p := os.Getenv(BinEnv); p != "" && !race {
		b.path = p
		if !fileExists(p) {
			b.err = fmt.Errorf("%s=%s: no such file", BinEnv, p)
		}
	} else {
		b.path, b.err = build(race)
	}
	built[race] = b
	return b.path, b.err
}

func build(race bool) (string, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", "pisync-daemontest-")
		if err != nil {
			return "", err
		}
		dir = d
	}
	name := "pisync"
	args := []string{"build"}
	if race {
		name += "-race"
		args = append(args, "-race")
	}
	p := filepath.Join(dir, name)
	// The import path builds from any directory inside the module, which a test's is.
	out, err := exec.Command(GoTool(), append(args, "-o", p, Package)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return p, nil
}

// GoTool is the go command of the toolchain running the tests, when it says which.
func GoTool() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Binary is Build(false) for a test, which it fails if the build does.
func Binary(tb testing.TB) string {
	tb.Helper()
	return binary(tb, false)
}

// RaceBinary is Build(true) for a test, which it fails if the build does.
func RaceBinary(tb testing.TB) string {
	tb.Helper()
	return binary(tb, true)
}

func binary(tb testing.TB, race bool) string {
	tb.Helper()
	p, err := Build(race)
	if err != nil {
		tb.Fatalf("build pisync: %v", err)
	}
	return p
}

// Remove deletes what Build built; TestMain calls it once the tests have run.
func Remove() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if dir != "" {
		os.RemoveAll(dir)
	}
	dir, built = "", map[bool]bin{}
}

// Env is this process's environment without the PISYNC_* variables, which every pisync
// flag reads: with it only the command line configures the child.
func Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PISYNC_") {
			env = append(env, kv)
		}
	}
	return env
}

// Proc is a pisync process started by Start.
type Proc struct {
	Cmd    *exec.Cmd
	exited chan struct{}
	err    error // Cmd.Wait's, once exited is closed
}

// Start starts bin with args, its environment env (nil: Env()), its standard output and
// error to out (nil: discarded).
func Start(bin string, args []string, env []string, out io.Writer) (*Proc, error) {
	if env == nil {
		env = Env()
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start pisync %s: %w", firstArg(args), err)
	}
	p := &Proc{Cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func firstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

// Exited is closed once the process has exited and its output is copied.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err is the process's exit (Cmd.Wait's error); valid once Exited is closed.
func (p *Proc) Err() error {
	<-p.exited
	return p.err
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Running says whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig; a process that has exited already is not an error.
func (p *Proc) Signal(sig os.Signal) error {
	if err := p.Cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// Kill sends SIGKILL and waits for the process to go.
func (p *Proc) Kill() {
	_ = p.Signal(syscall.SIGKILL) // it fails only for a process already reaped
	<-p.exited
}

// ErrStopTimeout is Stop's error when the process outlived its timeout (it is killed).
var ErrStopTimeout = errors.New("pisync still running after SIGTERM")

// Stop sends SIGTERM and waits up to timeout for the process to exit, then kills it. It
// returns the exit's error (nil for exit code 0), or ErrStopTimeout.
func (p *Proc) Stop(timeout time.Duration) error {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		p.Kill()
		return err
	}
	select {
	case <-p.exited:
		return p.err
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%w (%v)", ErrStopTimeout, timeout)
	}
}

// Output collects a process's output (across restarts, if given to each), safe to read
// while the process writes.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String is everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Tail is the last n bytes written.
func (o *Output) Tail(n int) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.b.Bytes()
	return string(b[max(0, len(b)-n):])
}
