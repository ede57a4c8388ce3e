package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// readFile reads a file of the kit, relative to this directory.
func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// requireTool returns the path of an external checker. Missing, the test is skipped on
// a developer's machine but fails in CI (CI=true), where .ci/install-deps installs it.
func requireTool(t *testing.T, name, install string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not found; CI must install it (%s)", name, install)
	}
	t.Skipf("%s not found; install it to run this check (%s)", name, install)
	return ""
}
