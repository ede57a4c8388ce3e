package deploy

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// accountFiles are the two account layouts of deploy/nats.
var accountFiles = []string{"nats/accounts-per-tenant.conf", "nats/accounts-shared.conf"}

// mayCreateStreams reports whether user of the accounts file conf may publish to
// $JS.API.STREAM.CREATE.<stream>, i.e. whether `pisync run --provision create` can make a
// missing stream or bucket as that user. found is false when the file has no such user.
func mayCreateStreams(t *testing.T, conf, user string) (may, found bool) {
	t.Helper()
	setPasswords(t)
	opts := loadOptions(t, conf)
	for _, u := range opts.Users {
		if u.Username != user {
			continue
		}
		p := u.Permissions
		if p == nil || p.Publish == nil {
			return true, true
		}
		allowed := len(p.Publish.Allow) == 0
		for _, s := range []string{"PISYNC_ENTRIES", "KV_PISYNC_HEADS", "OBJ_PISYNC_BLOBS"} {
			subj := "$JS.API.STREAM.CREATE." + s
			ok := allowed
			for _, a := range p.Publish.Allow {
				ok = ok || server.SubjectMatchesFilter(subj, a)
			}
			for _, d := range p.Publish.Deny {
				ok = ok && !server.SubjectMatchesFilter(subj, d)
			}
			if !ok {
				return false, true
			}
		}
		return true, true
	}
	return false, false
}

// checkConnSettings checks the connection settings of a pisync deployment (where names
// it in messages): credentials are not in the NATS URL, secrets do not come from a
// plain-text source (secret says whether a variable does), files the daemon reads are
// where inside says, and the provisioning mode fits the rights of the NATS user.
func checkConnSettings(t *testing.T, where string, env map[string]string, secret func(string) bool, inside func(path string) bool) {
	t.Helper()
	for _, u := range strings.Split(env["PISYNC_NATS"], ",") {
		if regexp.MustCompile(`^[a-z]+://[^/]*@`).MatchString(strings.TrimSpace(u)) {
			t.Errorf("%s: PISYNC_NATS %q carries credentials: use PISYNC_NATS_USER and PISYNC_NATS_PASSWORD", where, u)
		}
	}
	if _, ok := env["SSL_CERT_FILE"]; ok {
		t.Errorf("%s: SSL_CERT_FILE: give the cluster's CA with PISYNC_TLS_CA", where)
	}
	if env["PISYNC_NATS"] != "" && env["PISYNC_NATS_USER"] == "" && env["PISYNC_NATS_CREDS"] == "" &&
		env["PISYNC_NATS_NKEY"] == "" && env["PISYNC_NATS_TOKEN"] == "" {
		t.Errorf("%s: no NATS credentials (PISYNC_NATS_USER and PISYNC_NATS_PASSWORD)", where)
	}
	if (env["PISYNC_NATS_USER"] == "") != (env["PISYNC_NATS_PASSWORD"] == "") {
		t.Errorf("%s: PISYNC_NATS_USER and PISYNC_NATS_PASSWORD go together", where)
	}
	if (env["PISYNC_TLS_CERT"] == "") != (env["PISYNC_TLS_KEY"] == "") {
		t.Errorf("%s: PISYNC_TLS_CERT and PISYNC_TLS_KEY go together", where)
	}
	for _, k := range []string{"PISYNC_NATS_PASSWORD", "PISYNC_NATS_TOKEN"} {
		if _, ok := env[k]; ok && !secret(k) {
			t.Errorf("%s: %s must come from a secret", where, k)
		}
	}
	for _, k := range []string{"PISYNC_TLS_CA", "PISYNC_TLS_CERT", "PISYNC_TLS_KEY", "PISYNC_NATS_CREDS", "PISYNC_NATS_NKEY"} {
		if p := env[k]; p != "" && !inside(p) {
			t.Errorf("%s: %s %q is not where the file is installed or mounted", where, k, p)
		}
	}
	if env["PISYNC_NATS"] != "" && env["PISYNC_TLS_CA"] == "" {
		t.Errorf("%s: no PISYNC_TLS_CA: the cluster of deploy/nats has its own CA", where)
	}

	// The owners' users may not create streams: the daemon must not try (--provision off).
	user := env["PISYNC_NATS_USER"]
	if user == "" {
		return
	}
	var in []string
	for _, f := range accountFiles {
		may, found := mayCreateStreams(t, f, user)
		if !found {
			continue
		}
		in = append(in, f)
		if mode := env["PISYNC_PROVISION"]; !may && mode != "off" {
			t.Errorf("%s: user %s may not create streams in %s, but PISYNC_PROVISION is %q (want off)", where, user, f, mode)
		}
	}
	if len(in) == 0 {
		t.Errorf("%s: PISYNC_NATS_USER %q is in none of %v", where, user, accountFiles)
	}
}

// TestConnSettings checks the connection settings of the systemd environment example
// and of the Kubernetes sidecar.
func TestConnSettings(t *testing.T) {
	t.Run("systemd", func(t *testing.T) {
		env := map[string]string{}
		assign := regexp.MustCompile(`^([A-Z][A-Z0-9_]*)=(.*)$`)
		for _, line := range strings.Split(readFile(t, "systemd/pisync.env.example"), "\n") {
			if m := assign.FindStringSubmatch(line); m != nil {
				env[m[1]] = strings.Trim(m[2], `'"`)
			}
		}
		// The file is mode 0640 root:pisync: a secret may be in it; files under /etc/pisync.
		checkConnSettings(t, "pisync.env.example", env,
			func(string) bool { return true },
			func(p string) bool { return strings.HasPrefix(p, "/etc/pisync/") })
	})

	t.Run("kubernetes", func(t *testing.T) {
		objs := k8sObjects(t)
		dep := objs["Deployment/pi-agent"]
		spec, _ := path(dep, "spec", "template", "spec")
		var pisync any
		for _, c := range list(spec, "initContainers") {
			if str(c, "name") == "pisync" {
				pisync = c
			}
		}
		if pisync == nil {
			t.Fatal("no pisync sidecar")
		}
		env, fromSecret := map[string]string{}, map[string]bool{}
		for _, ef := range list(pisync, "envFrom") {
			if name := str(ef, "configMapRef", "name"); name != "" {
				m, _ := path(objs["ConfigMap/"+name], "data")
				for k, v := range m.(map[string]any) {
					env[k], fromSecret[k] = fmt.Sprint(v), false
				}
			} else if name := str(ef, "secretRef", "name"); name != "" {
				m, _ := path(objs["Secret/"+name], "stringData")
				for k, v := range m.(map[string]any) {
					env[k], fromSecret[k] = fmt.Sprint(v), true
				}
			}
		}
		for _, e := range list(pisync, "env") {
			k := str(e, "name")
			env[k], fromSecret[k] = str(e, "value"), str(e, "valueFrom", "secretKeyRef", "name") != ""
		}
		var mounts []string
		for _, m := range list(pisync, "volumeMounts") {
			mounts = append(mounts, str(m, "mountPath"))
		}
		checkConnSettings(t, "pisync-sidecar.yaml", env,
			func(k string) bool { return fromSecret[k] },
			func(p string) bool {
				for _, m := range mounts {
					if strings.HasPrefix(p, m+"/") {
						return true
					}
				}
				return false
			})
	})
}
