package deploy

import (
	"strings"
	"testing"
)

// TestDockerfile checks the image the Kubernetes examples name: built in a separate
// stage as a static binary, on a base without a shell, run as the non-root uid the
// examples' securityContext gives; and every example names the image the README's
// build command tags.
func TestDockerfile(t *testing.T) {
	var froms []string
	var user, entry string
	static := false
	for _, line := range strings.Split(readFile(t, "../Dockerfile"), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(line, "#") {
			continue
		}
		switch f[0] {
		case "FROM":
			froms = append(froms, f[1])
		case "USER":
			user = f[1]
		case "ENTRYPOINT":
			entry = strings.Join(f[1:], " ")
		case "RUN":
			static = static || strings.Contains(line, "CGO_ENABLED=0")
		}
	}
	if len(froms) < 2 || !strings.HasPrefix(froms[len(froms)-1], "gcr.io/distroless/static") {
		t.Errorf("stages %v: want a build stage and a distroless/static final one", froms)
	}
	if !static {
		t.Error("the binary is not built with CGO_ENABLED=0")
	}
	if user != "10001:10001" {
		t.Errorf("USER %q, want 10001:10001 (runAsUser of deploy/kubernetes)", user)
	}
	if entry != `["/pisync"]` {
		t.Errorf("ENTRYPOINT %s", entry)
	}
	for _, f := range []string{"kubernetes/pisync-sidecar.yaml", "kubernetes/pisync-serve.yaml"} {
		text := readFile(t, f)
		if !strings.Contains(text, "image: pisync:local") || strings.Contains(text, "registry.example.com/pisync") {
			t.Errorf("%s does not name the image pisync:local that README builds", f)
		}
		if !strings.Contains(text, "runAsUser: 10001") {
			t.Errorf("%s: no runAsUser: 10001", f)
		}
	}
	if !strings.Contains(readFile(t, "../README.md"), "docker build -t pisync:local .") {
		t.Error("README gives no build command for pisync:local")
	}
}
