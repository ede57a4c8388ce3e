package deploy

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestServeSystemdUnit checks the unit of pisync serve: known directives, the command,
// hardening, and nothing writable.
func TestServeSystemdUnit(t *testing.T) {
	entries := parseUnit(t, readFile(t, "systemd/pisync-serve.service"))
	got := map[string][]string{}
	for _, e := range entries {
		if !slices.Contains(knownDirectives[e.section], e.key) {
			t.Errorf("line %d: [%s] %s is not a known directive", e.line, e.section, e.key)
		}
		got[e.section+"."+e.key] = append(got[e.section+"."+e.key], e.value)
	}
	if exec := got["Service.ExecStart"]; len(exec) != 1 || !regexp.MustCompile(`^/\S+/pisync serve( |$)`).MatchString(exec[0]) {
		t.Errorf("ExecStart %q does not run `pisync serve`", exec)
	}
	for key, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
		"PrivateTmp": "yes", "CapabilityBoundingSet": "", "Restart": "on-failure", "KillSignal": "SIGTERM"} {
		if v := got["Service."+key]; len(v) != 1 || v[0] != want {
			t.Errorf("%s=%q, want %q", key, v, want)
		}
	}
	if rw := got["Service.ReadWritePaths"]; len(rw) > 0 {
		t.Errorf("ReadWritePaths %q: serve writes no file", rw)
	}
	if len(got["Service.EnvironmentFile"]) != 1 {
		t.Errorf("no EnvironmentFile")
	}
}

// TestServeKubernetes checks the serve Deployment: two or more replicas spread over
// nodes, every key of its ConfigMap and Secret a flag of serve, probes on the HTTP port
// the configuration names, every referenced object present.
func TestServeKubernetes(t *testing.T) {
	objs := k8sObjects(t)
	dep, ok := objs["Deployment/pisync-serve"]
	if !ok {
		t.Fatal("no Deployment/pisync-serve")
	}
	if n, err := strconv.Atoi(str(dep, "spec", "replicas")); err != nil || n < 2 {
		t.Errorf("replicas %q: want 2 or more", str(dep, "spec", "replicas"))
	}
	if str(dep, "spec", "template", "spec", "topologySpreadConstraints", 0, "topologyKey") != "kubernetes.io/hostname" {
		t.Errorf("the replicas are not spread over nodes")
	}
	c := list(dep, "spec", "template", "spec", "containers")
	if len(c) != 1 || str(c[0], "args", 0) != "serve" {
		t.Fatalf("containers %v: want one running `pisync serve`", c)
	}
	flags := serveFlags(t)
	env := map[string]string{}
	for _, ef := range list(c[0], "envFrom") {
		var src any
		if name := str(ef, "configMapRef", "name"); name != "" {
			src, ok = objs["ConfigMap/"+name]
		} else if name := str(ef, "secretRef", "name"); name != "" {
			src, ok = objs["Secret/"+name]
		}
		if !ok {
			t.Fatalf("envFrom %v: no such object", ef)
		}
		data, _ := path(src, "data")
		if data == nil {
			data, _ = path(src, "stringData")
		}
		m, _ := data.(map[string]any)
		for k, v := range m {
			env[k] = str(v)
		}
	}
	for k := range env {
		if !slices.Contains(flags, k) {
			t.Errorf("%s sets no flag of pisync serve", k)
		}
	}
	for _, k := range []string{"PISYNC_NATS", "PISYNC_NATS_USER", "PISYNC_NATS_PASSWORD", "PISYNC_HTTP_ADDR", "PISYNC_PROVISION"} {
		if env[k] == "" {
			t.Errorf("%s not set", k)
		}
	}
	_, port, _ := strings.Cut(env["PISYNC_HTTP_ADDR"], ":")
	if p := str(c[0], "ports", 0, "containerPort"); p != port {
		t.Errorf("containerPort %s, PISYNC_HTTP_ADDR port %s", p, port)
	}
	for probe, want := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if got := str(c[0], probe, "httpGet", "path"); got != want {
			t.Errorf("%s path %q, want %q", probe, got, want)
		}
	}
}

// serveFlags are the PISYNC_* variables of pisync serve's flags, read from its source.
func serveFlags(t *testing.T) []string {
	t.Helper()
	var out []string
	re := regexp.MustCompile(`fs\.\w+\(&[\w.]+, "([a-z-]+)"`)
	for _, f := range []string{"../cmd/pisync/serve.go", "../cmd/pisync/config.go"} {
		for _, m := range re.FindAllStringSubmatch(readFile(t, f), -1) {
			out = append(out, "PISYNC_"+strings.ToUpper(strings.ReplaceAll(m[1], "-", "_")))
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d flags of pisync serve", len(out))
	}
	return out
}
