package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// k8sObjects parses the Kubernetes manifests of deploy/kubernetes (not the Helm values),
// keyed "Kind/name".
func k8sObjects(t *testing.T) map[string]any {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]any{}
	for _, f := range files {
		if filepath.Base(f) == "nats-values.yaml" {
			continue
		}
		docs, err := parseYAML(readFile(t, f))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for i, d := range docs {
			api, kind, name := str(d, "apiVersion"), str(d, "kind"), str(d, "metadata", "name")
			if api == "" || kind == "" || name == "" {
				t.Errorf("%s document %d: apiVersion %q, kind %q, metadata.name %q", f, i+1, api, kind, name)
				continue
			}
			key := kind + "/" + name
			if _, dup := objs[key]; dup {
				t.Errorf("%s: %s defined twice", f, key)
			}
			objs[key] = d
		}
	}
	return objs
}

// TestKubernetesSidecar checks the wiring of the sidecar example: both containers share
// the sessions volume (pisync read-only), probes and metrics port agree with the daemon's
// HTTP address, every referenced ConfigMap, Secret, claim and volume exists, and every
// PISYNC_* key sets a flag the daemon has.
func TestKubernetesSidecar(t *testing.T) {
	objs := k8sObjects(t)
	flags := daemonFlags(t)
	dep, ok := objs["Deployment/pi-agent"]
	if !ok {
		t.Fatalf("no Deployment/pi-agent in %v", keys(objs))
	}
	spec, _ := path(dep, "spec", "template", "spec")
	containers := map[string]any{}
	for _, field := range []string{"initContainers", "containers"} {
		for _, c := range list(spec, field) {
			containers[str(c, "name")] = c
		}
	}
	pisync, pi := containers["pisync"], containers["pi"]
	if pisync == nil || pi == nil {
		t.Fatalf("want containers pisync and pi, have %v", keys(containers))
	}
	if !slices.ContainsFunc(list(spec, "initContainers"), func(c any) bool { return str(c, "name") == "pisync" }) ||
		str(pisync, "restartPolicy") != "Always" {
		t.Errorf("pisync should be a native sidecar (an init container with restartPolicy: Always)")
	}
	if args := list(pisync, "args"); len(args) == 0 || args[0] != "run" {
		t.Errorf("pisync args %v: want `run …`", args)
	}

	// Environment: ConfigMap and Secret keys, each a flag of the daemon.
	env := map[string]string{}
	for _, ef := range list(pisync, "envFrom") {
		var src any
		var ok bool
		if name := str(ef, "configMapRef", "name"); name != "" {
			src, ok = objs["ConfigMap/"+name]
			src, _ = path(src, "data")
		} else if name := str(ef, "secretRef", "name"); name != "" {
			src, ok = objs["Secret/"+name]
			src, _ = path(src, "stringData")
		}
		if !ok {
			t.Errorf("envFrom %v refers to an object not in deploy/kubernetes", ef)
			continue
		}
		m, _ := src.(map[string]any)
		for k, v := range m {
			env[k], _ = v.(string)
		}
	}
	for _, e := range list(pisync, "env") {
		env[str(e, "name")] = str(e, "value")
	}
	for k := range env {
		if strings.HasPrefix(k, "PISYNC_") && !flags[envToFlag(k)] {
			t.Errorf("%s sets no flag of pisync (--%s does not exist)", k, envToFlag(k))
		}
	}
	for _, k := range []string{"PISYNC_ROOT", "PISYNC_TENANT", "PISYNC_OWNER", "PISYNC_NATS", "PISYNC_HTTP_ADDR"} {
		if _, ok := env[k]; !ok {
			t.Errorf("pisync has no %s", k)
		}
	}
	if tenant := str(dep, "spec", "template", "metadata", "labels", "pisync.io/tenant"); tenant != env["PISYNC_TENANT"] {
		t.Errorf("pod label pisync.io/tenant %q differs from PISYNC_TENANT %q", tenant, env["PISYNC_TENANT"])
	}

	// Metrics port and probes.
	_, port, _ := strings.Cut(env["PISYNC_HTTP_ADDR"], ":")
	if !strings.HasPrefix(env["PISYNC_HTTP_ADDR"], "0.0.0.0:") {
		t.Errorf("PISYNC_HTTP_ADDR %q: the kubelet and Prometheus need it on the pod address", env["PISYNC_HTTP_ADDR"])
	}
	var portName string
	for _, p := range list(pisync, "ports") {
		if str(p, "containerPort") == port {
			portName = str(p, "name")
		}
	}
	if portName != "pisync-metrics" {
		t.Errorf("no container port pisync-metrics on %s (PISYNC_HTTP_ADDR)", port)
	}
	for probe, want := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if got := str(pisync, probe, "httpGet", "path"); got != want {
			t.Errorf("%s path %q, want %q", probe, got, want)
		}
		if p := str(pisync, probe, "httpGet", "port"); p != portName && p != port {
			t.Errorf("%s on port %q, not the metrics port", probe, p)
		}
	}

	// Volumes: the sessions volume is shared, read-only for pisync; every mount and
	// claim exists.
	volumes := map[string]any{}
	for _, v := range list(spec, "volumes") {
		volumes[str(v, "name")] = v
		if claim := str(v, "persistentVolumeClaim", "claimName"); claim != "" {
			if _, ok := objs["PersistentVolumeClaim/"+claim]; !ok {
				t.Errorf("volume %s: claim %s not defined", str(v, "name"), claim)
			}
		}
	}
	mounts := func(c any) map[string]any {
		out := map[string]any{}
		for _, m := range list(c, "volumeMounts") {
			if _, ok := volumes[str(m, "name")]; !ok {
				t.Errorf("mount of undefined volume %s", str(m, "name"))
			}
			out[str(m, "name")] = m
		}
		return out
	}
	pm, cm := mounts(pisync), mounts(pi)
	ps, cs := pm["sessions"], cm["sessions"]
	if ps == nil || cs == nil {
		t.Fatalf("the sessions volume must be mounted in both containers")
	}
	if str(ps, "readOnly") != "true" {
		t.Errorf("pisync must mount the sessions read-only: it never writes there")
	}
	if str(ps, "mountPath") != env["PISYNC_ROOT"] {
		t.Errorf("PISYNC_ROOT %q is not where the sessions are mounted (%q)", env["PISYNC_ROOT"], str(ps, "mountPath"))
	}
	if str(cs, "readOnly") == "true" {
		t.Errorf("the Pi container must be able to write its sessions")
	}
	state := str(pm["pisync-state"], "mountPath")
	if args := fmt.Sprint(list(pisync, "args")); state == "" || !strings.Contains(args, "--state-dir "+state) {
		t.Errorf("the state directory (%q) is not mounted where --state-dir points (%s)", state, args)
	}
	if ca := env["PISYNC_TLS_CA"]; ca != "" && !strings.HasPrefix(ca, str(pm["nats-ca"], "mountPath")+"/") {
		t.Errorf("PISYNC_TLS_CA %q is not in the mounted CA secret", ca)
	}

	// PodMonitor: selects the pods and scrapes the named port.
	pmon, ok := objs["PodMonitor/pisync"]
	if !ok {
		t.Fatal("no PodMonitor/pisync")
	}
	if str(pmon, "spec", "podMetricsEndpoints", 0, "port") != portName {
		t.Errorf("the PodMonitor does not scrape port %s", portName)
	}
	if str(pmon, "spec", "selector", "matchExpressions", 0, "key") != "pisync.io/tenant" {
		t.Errorf("the PodMonitor does not select on pisync.io/tenant")
	}
	var relabels []string
	for _, r := range list(pmon, "spec", "podMetricsEndpoints", 0, "relabelings") {
		relabels = append(relabels, str(r, "targetLabel"))
	}
	for _, l := range []string{"tenant", "instance", "job"} {
		if !slices.Contains(relabels, l) {
			t.Errorf("the PodMonitor sets no %s label (dashboard and alerts use it)", l)
		}
	}
	// pisync serve's replicas: their metrics port, as job pisync-serve (the dashboard's
	// Session store row and PisyncStoreErrors).
	serveJob := false
	for _, ep := range list(pmon, "spec", "podMetricsEndpoints") {
		if str(ep, "port") != "serve-metrics" {
			continue
		}
		for _, r := range list(ep, "relabelings") {
			serveJob = serveJob || str(r, "targetLabel") == "job" && str(r, "replacement") == "pisync-serve"
		}
	}
	if !serveJob {
		t.Errorf("the PodMonitor does not scrape pisync serve's port serve-metrics as job pisync-serve")
	}
}

// TestNATSHelmValues checks the values for the official chart: 3 replicas, JetStream on
// file storage, TLS on clients and routes, and a password for every user of the accounts
// file it includes.
func TestNATSHelmValues(t *testing.T) {
	docs, err := parseYAML(readFile(t, "kubernetes/nats-values.yaml"))
	if err != nil || len(docs) != 1 {
		t.Fatalf("nats-values.yaml: %v", err)
	}
	v := docs[0]
	for _, c := range []struct {
		path []any
		want string
	}{
		{[]any{"config", "cluster", "enabled"}, "true"},
		{[]any{"config", "cluster", "replicas"}, "3"},
		{[]any{"config", "cluster", "tls", "enabled"}, "true"},
		{[]any{"config", "cluster", "tls", "merge", "verify"}, "true"},
		{[]any{"config", "jetstream", "enabled"}, "true"},
		{[]any{"config", "jetstream", "fileStore", "enabled"}, "true"},
		{[]any{"config", "jetstream", "fileStore", "pvc", "enabled"}, "true"},
		{[]any{"config", "nats", "tls", "enabled"}, "true"},
		{[]any{"tlsCA", "enabled"}, "true"},
		{[]any{"config", "merge", "00$include"}, "accounts.conf"},
	} {
		if got := str(v, c.path...); got != c.want {
			t.Errorf("%v = %q, want %q", c.path, got, c.want)
		}
	}
	if !strings.Contains(readFile(t, "kubernetes/nats-values.yaml"), "accounts\\.conf=deploy/nats/accounts-per-tenant.conf") {
		t.Errorf("the install command no longer puts deploy/nats/accounts-per-tenant.conf into the chart")
	}
	envs, _ := path(v, "container", "env")
	m, _ := envs.(map[string]any)
	var want []string
	for _, match := range passwordVar.FindAllStringSubmatch(readFile(t, "nats/accounts-per-tenant.conf"), -1) {
		if !slices.Contains(want, match[1]) {
			want = append(want, match[1])
		}
	}
	for _, name := range want {
		if str(m[name], "valueFrom", "secretKeyRef", "key") == "" {
			t.Errorf("container.env has no secret for %s, which accounts-per-tenant.conf reads", name)
		}
	}
	if len(want) == 0 {
		t.Fatal("no password variables found in accounts-per-tenant.conf")
	}
}

// TestNoLocalPaths keeps paths of a developer's machine out of the kit, the dashboards
// and the docs.
func TestNoLocalPaths(t *testing.T) {
	bad := regexp.MustCompile(`/(home|Users)/[a-z][a-z0-9_-]*/|/work/main|/root/`)
	for _, dir := range []string{".", "../dashboards", "../docs"} {
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				// /home/pi/ is the Pi container's home in the Kubernetes example.
				if m := bad.FindString(line); m != "" && m != "/home/pi/" {
					t.Errorf("%s:%d: local path %q", p, i+1, m)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
