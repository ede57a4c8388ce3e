package dashboards

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/testutil/promcheck"
)

const exportedFile = "testdata/exported-metrics.txt"

func loadExported(t *testing.T) map[string]promcheck.Family {
	t.Helper()
	ex, err := promcheck.LoadExported(exportedFile)
	if err != nil {
		t.Fatalf("%v (written by: go test ./cmd/pisync -run TestExportedMetrics -update)", err)
	}
	if len(ex) < 10 {
		t.Fatalf("%s lists %d families: not a real export", exportedFile, len(ex))
	}
	return ex
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type gridPos struct{ X, Y, W, H int }

type panel struct {
	ID         int      `json:"id"`
	Type       string   `json:"type"`
	Title      string   `json:"title"`
	GridPos    gridPos  `json:"gridPos"`
	Datasource *dsRef   `json:"datasource"`
	Targets    []target `json:"targets"`
	Panels     []panel  `json:"panels"`
}

type target struct {
	RefID      string `json:"refId"`
	Expr       string `json:"expr"`
	Datasource *dsRef `json:"datasource"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *dsRef          `json:"datasource"`
}

type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

// query is one PromQL expression of a dashboard and where it is.
type query struct{ where, expr string }

func loadDashboards(t *testing.T) map[string]dashboard {
	t.Helper()
	files, err := filepath.Glob("*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	out := map[string]dashboard{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[f] = d
	}
	return out
}

// flatten lists the panels, those inside collapsed rows included.
func flatten(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flatten(p.Panels)...)
	}
	return out
}

var grafanaVar = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}?`)

// substitute replaces Grafana's variables with values that keep the expression valid
// PromQL: durations for the interval variables, a match-all regex for template variables
// (they are only used in =~ matchers).
func substitute(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		name := grafanaVar.FindStringSubmatch(v)[1]
		switch name {
		case "__rate_interval", "__interval":
			return "5m"
		case "__range":
			return "1h"
		case "__range_s":
			return "3600"
		default:
			return ".*"
		}
	})
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`)

// dashboardQueries checks the structure of one dashboard and returns its expressions.
func dashboardQueries(t *testing.T, file string, d dashboard) []query {
	t.Helper()
	if d.SchemaVersion < 39 {
		t.Errorf("%s: schemaVersion %d, want ≥ 39", file, d.SchemaVersion)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("%s: uid %q, title %q", file, d.UID, d.Title)
	}
	var qs []query
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if ds, ok := vars["datasource"]; !ok || ds.Type != "datasource" || string(ds.Query) != `"prometheus"` {
		t.Errorf("%s: want a datasource variable of type prometheus, got %+v", file, ds)
	}
	for _, name := range []string{"tenant", "host"} {
		v, ok := vars[name]
		if !ok || v.Type != "query" {
			t.Errorf("%s: no query variable %q", file, name)
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("%s: variable %s: %q is not label_values(selector, label)", file, name, v.Definition)
			continue
		}
		qs = append(qs, query{fmt.Sprintf("variable %s", name), fmt.Sprintf("count by (%s) (%s)", m[2], m[1])})
		if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
			t.Errorf("%s: variable %s does not use ${datasource}", file, name)
		}
	}
	if m := labelValues.FindStringSubmatch(vars["host"].Definition); m != nil && m[2] != "instance" {
		t.Errorf("%s: host variable lists %q, want instance", file, m[2])
	}
	ids := map[int]string{}
	var boxes []panel
	for _, p := range flatten(d.Panels) {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("%s: panels %q and %q share id %d", file, prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 || g.Y < 0 {
			t.Errorf("%s: panel %q: gridPos %+v outside the 24-column grid", file, p.Title, g)
		}
		for _, b := range boxes {
			if g.X < b.GridPos.X+b.GridPos.W && b.GridPos.X < g.X+g.W && g.Y < b.GridPos.Y+b.GridPos.H && b.GridPos.Y < g.Y+g.H {
				t.Errorf("%s: panels %q and %q overlap", file, p.Title, b.Title)
			}
		}
		boxes = append(boxes, p)
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", file, p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: panel %q does not use the ${datasource} variable", file, p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if refs[tg.RefID] {
				t.Errorf("%s: panel %q: refId %s twice", file, p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("%s: panel %q query %s does not use ${datasource}", file, p.Title, tg.RefID)
			}
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: panel %q query %s is empty", file, p.Title, tg.RefID)
				continue
			}
			qs = append(qs, query{fmt.Sprintf("panel %d %q query %s", p.ID, p.Title, tg.RefID), tg.Expr})
		}
	}
	return qs
}

// TestDashboards checks every dashboard's structure and that every query names only
// metrics and labels the daemon exports (or Prometheus attaches), and that every exported
// metric is on a dashboard.
func TestDashboards(t *testing.T) {
	exported := loadExported(t)
	onDashboard := map[string]bool{}
	pendingUsed := map[string]bool{}
	for file, d := range loadDashboards(t) {
		for _, q := range dashboardQueries(t, file, d) {
			expr := substitute(q.expr)
			pend, problems := promcheck.Check(expr, exported, promcheck.TargetLabels, promcheck.Synthetic, promcheck.Pending)
			for _, p := range problems {
				t.Errorf("%s: %s: %s\n\t%s", file, q.where, p, q.expr)
			}
			for _, m := range pend {
				pendingUsed[m] = true
			}
			if u, err := promcheck.Scan(expr); err == nil {
				for _, m := range u.Metrics {
					if f, ok := promcheck.Resolve(m, exported); ok {
						onDashboard[f.Name] = true
					}
				}
			}
		}
	}
	var missing []string
	for name := range exported {
		if !onDashboard[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("exported metrics on no dashboard: %v", missing)
	}
	for m := range pendingUsed {
		t.Logf("uses %s, which the daemon does not export yet (promcheck.Pending)", m)
	}
}

// TestPendingNotExported fails once a pending metric is exported: it must then leave
// the Pending list so that it is checked like every other.
func TestPendingNotExported(t *testing.T) {
	exported := loadExported(t)
	for m, labels := range promcheck.Pending {
		if f, ok := exported[m]; ok {
			t.Errorf("%s is exported now (labels %v; pending said %v): remove it from promcheck.Pending", m, f.Labels, labels)
		}
	}
}
