package deploy

import (
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSystemdUserUnit checks the per-user unit: started with the user's session
// (WantedBy=default.target), no system user or group, pisync run with its defaults,
// room for the drain; and systemd-analyze verify where installed.
func TestSystemdUserUnit(t *testing.T) {
	text := readFile(t, "systemd/pisync-user.service")
	got := map[string]string{}
	for _, e := range parseUnit(t, text) {
		got[e.section+"."+e.key] = e.value
	}
	for k, want := range map[string]string{
		"Install.WantedBy":   "default.target",
		"Service.ExecStart":  "%h/go/bin/pisync run",
		"Service.KillSignal": "SIGTERM",
		"Service.Restart":    "on-failure",
	} {
		if got[k] != want {
			t.Errorf("%s=%q, want %q", k, got[k], want)
		}
	}
	for _, k := range []string{"Service.User", "Service.Group", "Service.EnvironmentFile", "Service.StateDirectory"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s is set: a user unit runs as its user with pisync's own defaults", k)
		}
	}
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed; the directive checks above still ran")
		return
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "pisync.service")
	body := regexp.MustCompile(`(?m)^ExecStart=\S+`).ReplaceAllString(text, "ExecStart="+self)
	if err := os.WriteFile(unit, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "--user", "verify", unit).CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "pisync.service") {
			t.Errorf("systemd-analyze --user verify: %s", l)
		}
	}
	if err != nil {
		t.Logf("systemd-analyze --user verify: %v (no user manager here?)\n%s", err, out)
	}
}

// plistValue is one value of a property list, kept as its element name and content.
type plistValue struct {
	XMLName xml.Name
	Text    string       `xml:",chardata"`
	Items   []plistValue `xml:",any"`
}

// TestLaunchdAgent parses the agent's plist with encoding/xml (no plutil here) and checks
// what launchd needs: the label, pisync run as the program, started at login, restarted
// when it fails, and the logs in the user's Library/Logs.
func TestLaunchdAgent(t *testing.T) {
	b, err := os.ReadFile("launchd/io.pisync.pisync.plist")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		XMLName xml.Name   `xml:"plist"`
		Dict    plistValue `xml:"dict"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("plist: %v", err)
	}
	keys := map[string]plistValue{}
	items := doc.Dict.Items
	for i := 0; i+1 < len(items); i += 2 {
		if items[i].XMLName.Local != "key" {
			t.Fatalf("dict item %d is a <%s>, want <key>", i, items[i].XMLName.Local)
		}
		keys[items[i].Text] = items[i+1]
	}
	if l := keys["Label"]; l.Text != "io.pisync.pisync" {
		t.Errorf("Label %q", l.Text)
	}
	var args []string
	for _, a := range keys["ProgramArguments"].Items {
		args = append(args, a.Text)
	}
	if len(args) != 2 || !strings.HasSuffix(args[0], "/go/bin/pisync") || args[1] != "run" {
		t.Errorf("ProgramArguments %q", args)
	}
	if keys["RunAtLoad"].XMLName.Local != "true" {
		t.Error("RunAtLoad is not true")
	}
	ka := keys["KeepAlive"]
	if ka.XMLName.Local != "dict" || len(ka.Items) != 2 || ka.Items[0].Text != "SuccessfulExit" || ka.Items[1].XMLName.Local != "false" {
		t.Errorf("KeepAlive %+v: want restart on failure only (SuccessfulExit false)", ka)
	}
	for _, k := range []string{"StandardOutPath", "StandardErrorPath"} {
		if p := keys[k].Text; !strings.HasPrefix(p, "/Users/") || !strings.HasSuffix(p, "/Library/Logs/pisync.log") {
			t.Errorf("%s %q", k, p)
		}
	}
}
