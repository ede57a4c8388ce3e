package deploy

import (
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/testutil/promcheck"
)

// The alerts issue 5 asks for; each must exist, be tested and have a runbook section.
var wantAlerts = []string{
	"PisyncDown", "PisyncNATSDisconnected", "PisyncBacklogNotShrinking",
	"PisyncPublishFailures", "PisyncTornTailStuck", "PisyncVerifyMismatch",
	"PisyncStoreErrors", "PisyncSessionShrunk",
}

// TestPromtool runs Prometheus' own checks on the configuration, the rules and the rule
// unit tests.
func TestPromtool(t *testing.T) {
	promtool := requireTool(t, "promtool", "apt-get install -y prometheus")
	for _, args := range [][]string{
		{"check", "config", "prometheus.yml"},
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			cmd := exec.Command(promtool, args...)
			cmd.Dir = "prometheus"
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		})
	}
}

// alertRule is one rule of alerts.yml.
type alertRule struct{ name, expr, runbook string }

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	docs, err := parseYAML(readFile(t, "prometheus/alerts.yml"))
	if err != nil || len(docs) != 1 {
		t.Fatalf("alerts.yml: %v", err)
	}
	var rules []alertRule
	for _, g := range list(docs[0], "groups") {
		for _, r := range list(g, "rules") {
			rules = append(rules, alertRule{name: str(r, "alert"), expr: str(r, "expr"), runbook: str(r, "annotations", "runbook")})
		}
	}
	if len(rules) == 0 {
		t.Fatal("alerts.yml: no rules")
	}
	return rules
}

// TestAlertRules checks, without promtool, that every alert rule names only metrics and
// labels the daemon exports, that the alerts of issue 5 are all there, and that each
// points at a runbook section that exists.
func TestAlertRules(t *testing.T) {
	exported, err := promcheck.LoadExported("../dashboards/testdata/exported-metrics.txt")
	if err != nil {
		t.Fatalf("%v (written by: go test ./cmd/pisync -run TestExportedMetrics -update)", err)
	}
	runbook := readFile(t, "../docs/runbook-migration.md")
	anchors := markdownAnchors(runbook)
	var names []string
	for _, r := range alertRules(t) {
		names = append(names, r.name)
		pending, problems := promcheck.Check(r.expr, exported, promcheck.TargetLabels, promcheck.Synthetic, promcheck.Pending)
		for _, p := range problems {
			t.Errorf("alert %s: %s\n\t%s", r.name, p, r.expr)
		}
		for _, m := range pending {
			t.Logf("alert %s uses %s, which the daemon does not export yet (promcheck.Pending)", r.name, m)
		}
		file, anchor, ok := strings.Cut(r.runbook, "#")
		if !ok || file != "docs/runbook-migration.md" || !anchors[anchor] {
			t.Errorf("alert %s: runbook %q is not a section of docs/runbook-migration.md", r.name, r.runbook)
		}
	}
	for _, a := range wantAlerts {
		if !slices.Contains(names, a) {
			t.Errorf("alert %s is missing", a)
		}
	}
}

// TestAlertTestsCoverEveryRule checks that alerts_test.yml has, for every alert, a case
// where it fires and one where it must not.
func TestAlertTestsCoverEveryRule(t *testing.T) {
	docs, err := parseYAML(readFile(t, "prometheus/alerts_test.yml"))
	if err != nil || len(docs) != 1 {
		t.Fatalf("alerts_test.yml: %v", err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range list(docs[0], "tests") {
		for _, a := range list(tc, "alert_rule_test") {
			name := str(a, "alertname")
			if len(list(a, "exp_alerts")) > 0 {
				fires[name] = true
			} else {
				silent[name] = true
			}
		}
	}
	for _, r := range alertRules(t) {
		if !fires[r.name] {
			t.Errorf("alerts_test.yml: no case where %s fires", r.name)
		}
		if !silent[r.name] {
			t.Errorf("alerts_test.yml: no case where %s stays silent", r.name)
		}
	}
}

// TestPrometheusScrapeConfig checks what the dashboard and the alerts rely on: a pisync
// job whose targets all carry a tenant label, and the rule file loaded.
func TestPrometheusScrapeConfig(t *testing.T) {
	docs, err := parseYAML(readFile(t, "prometheus/prometheus.yml"))
	if err != nil || len(docs) != 1 {
		t.Fatalf("prometheus.yml: %v", err)
	}
	cfg := docs[0]
	if rf := list(cfg, "rule_files"); len(rf) != 1 || rf[0] != "alerts.yml" {
		t.Errorf("rule_files %v, want [alerts.yml]", rf)
	}
	var jobs []string
	for _, sc := range list(cfg, "scrape_configs") {
		job := str(sc, "job_name")
		jobs = append(jobs, job)
		if !regexp.MustCompile(`^pisync`).MatchString(job) {
			continue // the alerts select job=~"pisync.*"
		}
		groups := list(sc, "static_configs")
		if len(groups) == 0 {
			t.Errorf("job %s: no static_configs", job)
		}
		for i, g := range groups {
			if str(g, "labels", "tenant") == "" {
				t.Errorf("job %s: target group %d has no tenant label (the dashboard's Tenant selector needs it)", job, i)
			}
			port := ":9470" // pisync run's default --http-addr
			switch job {
			case "pisync-serve":
				port = ":9471" // pisync serve's
			case "pisync-follow":
				port = ":9478" // the follower's in the README (it has no default)
			}
			for _, target := range list(g, "targets") {
				if s, _ := target.(string); !strings.HasSuffix(s, port) {
					t.Errorf("job %s: target %v is not on the default port %s", job, target, port)
				}
			}
		}
	}
	sort.Strings(jobs)
	if !slices.Contains(jobs, "pisync") {
		t.Errorf("no pisync job in %v", jobs)
	}
}

// markdownAnchors lists the GitHub anchors of a Markdown file's headings.
func markdownAnchors(md string) map[string]bool {
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")
		out[a] = true
	}
	return out
}
