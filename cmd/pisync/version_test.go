package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionCommand: `pisync version` prints the version, commit and build time.
func TestVersionCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Main([]string{"version"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "pisync ") || !strings.HasPrefix(lines[1], "commit ") || !strings.HasPrefix(lines[2], "built ") {
		t.Fatalf("output %q", out.String())
	}
}

// TestDescribeBuild: linker flags win; without them the module version of `go install
// …@v1.2.3` and the VCS settings of a checkout build are used; nothing known is
// "unknown", never empty.
func TestDescribeBuild(t *testing.T) {
	installed := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/pisync/pisync", Version: "v1.2.3"}}
	checkout := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	for _, tc := range []struct {
		name           string
		ver, com, when string
		info           *debug.BuildInfo
		want           buildVersion
	}{
		{"release", "v1.3.0", "def456", "2026-12-01T12:00:00Z", checkout, buildVersion{"v1.3.0", "def456", "2026-12-01T12:00:00Z", "go1.26.8"}},
		{"go install", "dev", "", "", installed, buildVersion{"v1.2.3", "unknown", "unknown", "go1.26.8"}},
		{"checkout", "dev", "", "", checkout, buildVersion{"dev", "abc123-dirty", "2026-12-01T10:00:00Z", "go1.26.8"}},
		{"nothing", "", "", "", nil, buildVersion{"unknown", "unknown", "unknown", ""}},
	} {
		got := describeBuild(tc.ver, tc.com, tc.when, tc.info, tc.info != nil)
		if tc.want.Go == "" {
			tc.want.Go = got.Go // the running toolchain's
		}
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestGoInstall: `go install` of this package works from the module as published (the
// module path of go.mod, which README's install command names), offline, and the
// binary it installs answers `version` with the module's path known to it.
func TestGoInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	gobin := t.TempDir()
	cmd := exec.Command("go", "install", ".")
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOPROXY=off", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install: %v\n%s", err, out)
	}
	bin := filepath.Join(gobin, "pisync")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	out, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "\tpath\tgithub.com/pisync/pisync/cmd/pisync") {
		t.Fatalf("go version -m: %v\n%s", err, out)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil || !strings.Contains(string(readme), "go install github.com/pisync/pisync/cmd/pisync@latest") {
		t.Errorf("README's install command is not the module path's: %v", err)
	}
	if out, err := exec.Command(bin, "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "pisync ") {
		t.Errorf("installed pisync version: %v\n%s", err, out)
	}
}
