//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package pitest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeHelperDir lays out a helper directory pinning one package, and puts a fake npm
// first on PATH: it counts its runs in <dir>/npm-runs and installs the package at the
// version in <dir>/npm-installs (or fails when that file says "fail").
func fakeHelperDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("package.json", `{"dependencies":{"@pi/core":"1.2.3"}}`, 0o644)
	write("package-lock.json", `{"packages":{"":{},"node_modules/@pi/core":{"version":"1.2.3"}}}`, 0o644)
	write("npm-installs", "1.2.3", 0o644)
	bin := t.TempDir()
	script := `#!/bin/sh
echo "$@" >> npm-runs
v=$(cat npm-installs)
if [ "$v" = fail ]; then echo "npm ERR! network unreachable" >&2; exit 1; fi
sleep 0.2
rm -rf node_modules && mkdir -p node_modules/@pi/core
printf '{"name":"@pi/core","version":"%s"}' "$v" > node_modules/@pi/core/package.json
`
	if err := os.WriteFile(filepath.Join(bin, "npm"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return dir
}

func npmRuns(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "npm-runs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestInstallRunsNpmCiOnceForConcurrentCallers(t *testing.T) {
	dir := fakeHelperDir(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = Install(dir) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	if runs := npmRuns(t, dir); len(runs) != 1 || !strings.HasPrefix(runs[0], "ci ") {
		t.Errorf("npm ran %q, want one `npm ci`", runs)
	}
	if err := Install(dir); err != nil || len(npmRuns(t, dir)) != 1 {
		t.Errorf("installed already: err %v, npm runs %d, want nil and still 1", err, len(npmRuns(t, dir)))
	}
}

func TestInstallReplacesOtherVersions(t *testing.T) {
	dir := fakeHelperDir(t)
	if err := os.MkdirAll(filepath.Join(dir, "node_modules", "@pi", "core"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "node_modules", "@pi", "core", "package.json"), []byte(`{"version":"1.0.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if stale, err := staleModules(dir); err != nil || len(stale) != 1 || !strings.Contains(stale[0], "1.0.0 installed, lock pins 1.2.3") {
		t.Fatalf("staleModules: %q, %v", stale, err)
	}
	if err := Install(dir); err != nil {
		t.Fatal(err)
	}
	if runs := npmRuns(t, dir); len(runs) != 1 {
		t.Errorf("npm ran %d times, want 1", len(runs))
	}
}

func TestInstallFailures(t *testing.T) {
	t.Run("npm fails", func(t *testing.T) {
		dir := fakeHelperDir(t)
		if err := os.WriteFile(filepath.Join(dir, "npm-installs"), []byte("fail"), 0o644); err != nil {
			t.Fatal(err)
		}
		err := Install(dir)
		if err == nil || !strings.Contains(err.Error(), "network unreachable") {
			t.Errorf("Install: %v, want npm's error", err)
		}
	})
	t.Run("npm installs something else", func(t *testing.T) {
		dir := fakeHelperDir(t)
		if err := os.WriteFile(filepath.Join(dir, "npm-installs"), []byte("9.9.9"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := Install(dir); err == nil || !strings.Contains(err.Error(), "9.9.9 installed") {
			t.Errorf("Install: %v, want the version mismatch", err)
		}
	})
	t.Run("no npm", func(t *testing.T) {
		dir := fakeHelperDir(t)
		t.Setenv("PATH", t.TempDir())
		if err := Install(dir); err == nil || !strings.Contains(err.Error(), "npm is not installed") {
			t.Errorf("Install: %v, want npm missing", err)
		}
	})
}
