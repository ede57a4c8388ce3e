package deploy

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// unitEntry is one Key=Value line of a unit file.
type unitEntry struct {
	section, key, value string
	line                int
}

// parseUnit reads a systemd unit: sections, Key=Value lines, comments. It fails on any
// other line.
func parseUnit(t *testing.T, text string) []unitEntry {
	t.Helper()
	var out []unitEntry
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
		case strings.HasSuffix(line, "\\"):
			t.Fatalf("line %d: continuation lines are not used in this unit; keep one directive per line", n)
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || !regexp.MustCompile(`^[A-Z][A-Za-z0-9]+$`).MatchString(k) {
				t.Fatalf("line %d: not a directive: %q", n, line)
			}
			out = append(out, unitEntry{section, k, v, n})
		}
	}
	return out
}

// knownDirectives are the directives this unit may use. systemd-analyze verify checks
// against systemd's own list where it is installed; this list catches a typo where not.
var knownDirectives = map[string][]string{
	"Unit": {"Description", "Documentation", "Wants", "After", "Requires", "Before", "StartLimitIntervalSec", "StartLimitBurst"},
	"Service": {"Type", "User", "Group", "SupplementaryGroups", "EnvironmentFile", "Environment", "StateDirectory",
		"StateDirectoryMode", "ExecStart", "ExecReload", "KillSignal", "KillMode", "TimeoutStopSec", "TimeoutStartSec",
		"Restart", "RestartSec", "LimitNOFILE", "NoNewPrivileges", "ProtectSystem", "ProtectHome", "ReadOnlyPaths",
		"ReadWritePaths", "PrivateTmp", "PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules",
		"ProtectKernelLogs", "ProtectControlGroups", "ProtectClock", "ProtectHostname", "ProtectProc",
		"RestrictNamespaces", "RestrictRealtime", "RestrictSUIDSGID", "RestrictAddressFamilies", "LockPersonality",
		"MemoryDenyWriteExecute", "RemoveIPC", "CapabilityBoundingSet", "AmbientCapabilities",
		"SystemCallArchitectures", "SystemCallFilter", "SystemCallErrorNumber", "UMask"},
	"Install": {"WantedBy"},
}

// TestSystemdUnit checks the unit's hardening and wiring, and has systemd-analyze verify
// it where systemd is installed.
func TestSystemdUnit(t *testing.T) {
	text := readFile(t, "systemd/pisync.service")
	entries := parseUnit(t, text)
	get := func(section, key string) []string {
		var vs []string
		for _, e := range entries {
			if e.section == section && e.key == key {
				vs = append(vs, e.value)
			}
		}
		return vs
	}
	one := func(section, key string) string {
		vs := get(section, key)
		if len(vs) != 1 {
			t.Errorf("[%s] %s: %d values %q, want one", section, key, len(vs), vs)
			return ""
		}
		return vs[0]
	}
	for _, e := range entries {
		if !slices.Contains(knownDirectives[e.section], e.key) {
			t.Errorf("line %d: [%s] %s is not a known directive (typo? else add it to knownDirectives)", e.line, e.section, e.key)
		}
	}
	if exec := one("Service", "ExecStart"); !regexp.MustCompile(`^/\S+/pisync run( |$)`).MatchString(exec) {
		t.Errorf("ExecStart %q does not run `pisync run`", exec)
	}
	for key, want := range map[string]string{
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "read-only", "PrivateTmp": "yes",
		"PrivateDevices": "yes", "CapabilityBoundingSet": "", "AmbientCapabilities": "", "StateDirectory": "pisync",
		"MemoryDenyWriteExecute": "yes", "RestrictSUIDSGID": "yes", "Restart": "on-failure",
	} {
		if got := one("Service", key); got != want {
			t.Errorf("%s=%q, want %q", key, got, want)
		}
	}
	// Writable: the state directory and nothing else.
	if rw := get("Service", "ReadWritePaths"); !slices.Equal(rw, []string{"/var/lib/pisync"}) {
		t.Errorf("ReadWritePaths %q: only the state directory /var/lib/pisync may be writable", rw)
	}
	if !strings.Contains(one("Service", "ExecStart"), "--state-dir ${STATE_DIRECTORY}") {
		t.Errorf("ExecStart must put the state in the unit's StateDirectory")
	}
	if one("Service", "EnvironmentFile") == "" {
		t.Errorf("no EnvironmentFile")
	}
	// systemd must wait for the graceful drain (15 s by default) before SIGKILL.
	if d, err := time.ParseDuration(one("Service", "TimeoutStopSec")); err != nil || d < 30*time.Second {
		t.Errorf("TimeoutStopSec %v (%v): leave room for --drain-timeout", d, err)
	}

	t.Run("systemd-analyze", func(t *testing.T) {
		sa, err := exec.LookPath("systemd-analyze")
		if err != nil {
			t.Skip("systemd-analyze not installed; the directive checks above still ran")
		}
		// verify insists that ExecStart exists: point it at an executable that does.
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		unit := filepath.Join(t.TempDir(), "pisync.service")
		body := regexp.MustCompile(`(?m)^ExecStart=\S+`).ReplaceAllString(text, "ExecStart="+self)
		if err := os.WriteFile(unit, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(sa, "verify", unit).CombinedOutput()
		// verify exits 0 on unknown keys and bad values and only prints them: any output
		// about the unit is a failure.
		var problems []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "pisync.service") {
				problems = append(problems, l)
			}
		}
		if err != nil || len(problems) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, strings.Join(problems, "\n"))
		}
	})
}

// daemonFlags lists the flags of the pisync commands, read from their sources.
func daemonFlags(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("../cmd/pisync/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no sources in ../cmd/pisync: %v", err)
	}
	re := regexp.MustCompile(`fs\.[A-Za-z0-9]+\(&?[^,]+,\s*"([a-z0-9-]+)"`)
	flags := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			flags[m[1]] = true
		}
	}
	if !flags["root"] || !flags["nats"] {
		t.Fatalf("flag scan of cmd/pisync found %v: the pattern no longer matches how flags are declared", flags)
	}
	return flags
}

// envToFlag is the flag a PISYNC_* variable sets.
func envToFlag(v string) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(v, "PISYNC_"), "_", "-"))
}

// TestSystemdEnvExample checks that every PISYNC_* variable of the example sets a flag the
// daemon has, and that the file is valid for EnvironmentFile= (no inline comments).
func TestSystemdEnvExample(t *testing.T) {
	flags := daemonFlags(t)
	text := readFile(t, "systemd/pisync.env.example")
	assign := regexp.MustCompile(`^#?([A-Z][A-Z0-9_]*)=(.*)$`)
	seen := map[string]bool{}
	for n, line := range strings.Split(text, "\n") {
		if line == "" || (strings.HasPrefix(line, "# ") || line == "#") {
			continue
		}
		m := assign.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("line %d: neither a comment nor VAR=value: %q", n+1, line)
			continue
		}
		if !strings.HasPrefix(line, "#") && strings.Contains(m[2], " #") {
			t.Errorf("line %d: systemd takes an inline comment as part of the value: %q", n+1, line)
		}
		if strings.HasPrefix(m[1], "PISYNC_") {
			seen[m[1]] = true
			if !flags[envToFlag(m[1])] {
				t.Errorf("line %d: %s sets no flag of pisync (flag --%s does not exist)", n+1, m[1], envToFlag(m[1]))
			}
		}
	}
	for _, v := range []string{"PISYNC_ROOT", "PISYNC_TENANT", "PISYNC_OWNER", "PISYNC_NATS", "PISYNC_HTTP_ADDR"} {
		if !seen[v] {
			t.Errorf("%s is missing from the example", v)
		}
	}
}
