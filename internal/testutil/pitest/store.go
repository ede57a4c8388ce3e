package pitest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var (
	storeOnce   sync.Once
	storeScript *Helper
	storeErr    error
	storeSkip   bool
)

// NewStoreScript returns a Helper that runs clients/pi-session-store/conformance/pistore.mjs
// (Pi's own Session on Pi's JSONL repository and on the package's NatsSessionRepo; see
// that script) instead of pihelper.mjs, ready to run: node found, the package's pinned
// packages installed (`npm ci`, as New does for the helper) and the package built with
// its own TypeScript compiler into dist/. It skips t, or fails it under CI=true, when
// that cannot be done; once per test process.
func NewStoreScript(t testing.TB) *Helper {
	t.Helper()
	storeOnce.Do(func() { storeScript, storeSkip, storeErr = setupStore() })
	if storeErr != nil {
		checkSetup(t, nil, storeSkip, storeErr)
		return nil
	}
	return storeScript
}

func setupStore() (*Helper, bool, error) {
	h, skip, err := setup()
	if err != nil {
		return nil, skip, err
	}
	dir := filepath.Join(filepath.Dir(filepath.Dir(h.Dir)), "clients", "pi-session-store")
	if err := Install(dir); err != nil {
		return nil, false, err
	}
	// Built under the install lock: two test processes must not write dist/ at once.
	unlock, err := lockFile(filepath.Join(os.TempDir(), "pisync-pihelper-"+pathTag(dir)+".lock"))
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.Node, filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, false, fmt.Errorf("tsc in %s: %v\n%s", dir, err, out)
	}
	return &Helper{Node: h.Node, Dir: dir, Script: filepath.Join(dir, "conformance", "pistore.mjs")}, false, nil
}
