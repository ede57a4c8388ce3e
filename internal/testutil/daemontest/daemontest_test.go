package daemontest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sh runs script and, when it prints "up" (after setting its traps), returns.
func sh(t *testing.T, script string) *Proc {
	t.Helper()
	out := &Output{}
	p, err := Start("/bin/sh", []string{"-c", script}, nil, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "up"); {
		if time.Now().After(deadline) || !p.Running() {
			t.Fatalf("the script did not start: %v, output %q", p.Running(), out.String())
		}
		time.Sleep(5 * time.Millisecond) // polling interval of a poll-with-deadline
	}
	return p
}

func TestStopCleanExit(t *testing.T) {
	p := sh(t, `trap 'exit 0' TERM; echo up; while :; do sleep 0.05; done`)
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if p.Running() {
		t.Fatal("still running after Stop")
	}
}

func TestStopTimeoutKills(t *testing.T) {
	p := sh(t, `trap '' TERM; echo up; while :; do sleep 0.05; done`)
	if err := p.Stop(300 * time.Millisecond); !errors.Is(err, ErrStopTimeout) {
		t.Fatalf("stop: %v, want ErrStopTimeout", err)
	}
	if p.Running() {
		t.Fatal("still running after Stop timed out")
	}
}

func TestExitSeen(t *testing.T) {
	p, err := Start("/bin/sh", []string{"-c", "exit 3"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("no exit seen")
	}
	if err := p.Err(); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Err: %v, want exit status 3", err)
	}
	p.Kill() // a process already gone
	if err := p.Signal(os.Interrupt); err != nil {
		t.Fatalf("signal after exit: %v", err)
	}
}

func TestEnvDropsPisyncVariables(t *testing.T) {
	t.Setenv("PISYNC_NATS", "nats://elsewhere:4222")
	for _, kv := range Env() {
		if strings.HasPrefix(kv, "PISYNC_") {
			t.Fatalf("Env keeps %s", kv)
		}
	}
}

func TestBuildTakesBinEnv(t *testing.T) {
	t.Cleanup(Remove) // forget what this test made Build return
	Remove()
	bin := filepath.Join(t.TempDir(), "pisync")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(BinEnv, bin)
	if got, err := Build(false); err != nil || got != bin {
		t.Fatalf("Build(false) = %q, %v; want %s", got, err, bin)
	}
	Remove()
	t.Setenv(BinEnv, filepath.Join(t.TempDir(), "missing"))
	if _, err := Build(false); err == nil || !strings.Contains(err.Error(), BinEnv) {
		t.Fatalf("Build(false) of a missing %s: %v, want an error naming it", BinEnv, err)
	}
}
