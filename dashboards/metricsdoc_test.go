package dashboards

import (
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/testutil/promcheck"
)

const metricsDoc = "../README.md"

// docRow is one metric of README.md (section Metrics).
type docRow struct {
	typ    string
	labels []string
}

var backticked = regexp.MustCompile("`([^`]+)`")

// readMetricsDoc parses the metric tables of README.md (section Metrics): rows whose first cell is a
// `pisync_…` name, with type, labels (the backticked names) and meaning.
func readMetricsDoc(t *testing.T) (map[string]docRow, string) {
	t.Helper()
	b, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]docRow{}
	inSection := false
	for n, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "## ") {
			inSection = line == "## Metrics"
		}
		if !inSection || !strings.HasPrefix(line, "| `pisync_") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 4 {
			t.Errorf("%s:%d: want 4 cells (name, type, labels, meaning), got %d", metricsDoc, n+1, len(cells))
			continue
		}
		name := strings.Trim(cells[0], "`")
		if _, dup := rows[name]; dup {
			t.Errorf("%s:%d: %s documented twice", metricsDoc, n+1, name)
		}
		var labels []string
		for _, m := range backticked.FindAllStringSubmatch(cells[2], -1) {
			labels = append(labels, m[1])
		}
		sort.Strings(labels)
		if strings.TrimSpace(cells[3]) == "" {
			t.Errorf("%s:%d: %s has no meaning", metricsDoc, n+1, name)
		}
		rows[name] = docRow{typ: cells[1], labels: labels}
	}
	return rows, string(b)
}

// TestMetricsDoc checks README.md (section Metrics) against the metrics the daemon exports: the same
// names, types and label names, both ways; and that planned metrics are described.
func TestMetricsDoc(t *testing.T) {
	exported := loadExported(t)
	doc, text := readMetricsDoc(t)
	for name, f := range exported {
		d, ok := doc[name]
		switch {
		case !ok:
			t.Errorf("%s is exported but not documented in %s", name, metricsDoc)
		case d.typ != f.Type:
			t.Errorf("%s: documented as %s, exported as %s", name, d.typ, f.Type)
		case !slices.Equal(d.labels, f.Labels):
			t.Errorf("%s: documented labels %v, exported %v", name, d.labels, f.Labels)
		}
	}
	for name := range doc {
		if _, ok := exported[name]; !ok {
			t.Errorf("%s is documented in %s but the daemon does not export it", name, metricsDoc)
		}
	}
	for name := range promcheck.Pending {
		if !strings.Contains(text, "`"+name+"`") {
			t.Errorf("pending metric %s is not described in %s (## Planned)", name, metricsDoc)
		}
	}
}
