package promcheck

import (
	"slices"
	"strings"
	"testing"
)

func TestScan(t *testing.T) {
	for _, c := range []struct {
		expr      string
		metrics   []string
		matchers  map[string]string
		grouping  []string
		functions []string
	}{
		{expr: `up`, metrics: []string{"up"}},
		{
			expr:      `sum by (instance) (rate(pisync_lines_published_total{kind="entry", tenant=~".*"}[5m]))`,
			metrics:   []string{"pisync_lines_published_total"},
			matchers:  map[string]string{"kind": "pisync_lines_published_total", "tenant": "pisync_lines_published_total"},
			grouping:  []string{"instance"},
			functions: []string{"rate", "sum"},
		},
		{
			expr:      `histogram_quantile(0.99, sum by (le) (rate(pisync_publish_latency_seconds_bucket[5m])))`,
			metrics:   []string{"pisync_publish_latency_seconds_bucket"},
			grouping:  []string{"le"},
			functions: []string{"histogram_quantile", "rate", "sum"},
		},
		{
			// label values, strings with braces, numbers, durations, offset and keywords
			// are not metrics
			expr:      "a{x=\"{not} a metric\"} / on (job) group_left (version) b offset 5m > bool 1e3 and c unless d{y='z'} # comment metric",
			metrics:   []string{"a", "b", "c", "d"},
			matchers:  map[string]string{"x": "a", "y": "d"},
			grouping:  []string{"job", "version"},
			functions: nil,
		},
		{
			expr:      `topk(20, sum without (root) (pisync_backlog_bytes)) and on (instance) max_over_time(x[30m:1m])`,
			metrics:   []string{"pisync_backlog_bytes", "x"},
			grouping:  []string{"instance", "root"}, // the binary operator is met first
			functions: []string{"max_over_time", "sum", "topk"},
		},
	} {
		u, err := Scan(c.expr)
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		if !slices.Equal(u.Metrics, c.metrics) {
			t.Errorf("%s: metrics %v, want %v", c.expr, u.Metrics, c.metrics)
		}
		if c.matchers == nil {
			c.matchers = map[string]string{}
		}
		if len(u.Matchers) != len(c.matchers) {
			t.Errorf("%s: matchers %v, want %v", c.expr, u.Matchers, c.matchers)
		}
		for l, m := range c.matchers {
			if u.Matchers[l] != m {
				t.Errorf("%s: matcher %s on %q, want %q", c.expr, l, u.Matchers[l], m)
			}
		}
		if !slices.Equal(u.Grouping, c.grouping) {
			t.Errorf("%s: grouping %v, want %v", c.expr, u.Grouping, c.grouping)
		}
		if !slices.Equal(u.Functions, c.functions) {
			t.Errorf("%s: functions %v, want %v", c.expr, u.Functions, c.functions)
		}
	}
}

func TestScanRefuses(t *testing.T) {
	for _, expr := range []string{
		`rat(x[5m])`,                // unknown function
		`x{a="b"`,                   // unterminated selector
		`x{a="b}`,                   // unterminated string
		`{__name__="x"}`,            // no metric name to check
		`rate(x[$__rate_interval])`, // a Grafana variable left in
		// What only a real parser sees:
		`rate(x)`,                   // an instant vector where a range is expected
		`sum(x) by`,                 // a grouping without its labels
		`x + on (a) group_left y z`, // two expressions side by side
		`histogram_quantile(x[5m])`, // wrong number of arguments
	} {
		if _, err := Scan(expr); err == nil {
			t.Errorf("%s: accepted", expr)
		}
	}
}

func TestCheck(t *testing.T) {
	exported := map[string]Family{
		"pisync_sessions":                {Name: "pisync_sessions", Type: "gauge", Labels: []string{"root", "state"}},
		"pisync_publish_latency_seconds": {Name: "pisync_publish_latency_seconds", Type: "histogram"},
		"pisync_nats_connected":          {Name: "pisync_nats_connected", Type: "gauge"},
	}
	pending := map[string][]string{"pisync_future": {"result"}}
	for _, c := range []struct {
		expr    string
		problem string // "" for none
		pending bool
	}{
		{expr: `sum by (instance, state) (pisync_sessions{state="mirrored", tenant=~".*"})`},
		{expr: `histogram_quantile(0.5, sum by (le) (rate(pisync_publish_latency_seconds_bucket[5m])))`},
		{expr: `pisync_publish_latency_seconds_count / pisync_publish_latency_seconds_sum`},
		{expr: `up{job="pisync"} == 0`},
		{expr: `pisync_future{result="drifted"} > 0`, pending: true},
		{expr: `pisync_sessions_total`, problem: "not exported"},
		{expr: `pisync_nats_connected_bucket`, problem: "not exported"},
		{expr: `pisync_sessions{tenant_id="x"}`, problem: `no label "tenant_id"`},
		{expr: `sum by (owner) (pisync_nats_connected)`, problem: `grouping by "owner"`},
		{expr: `pisync_nats_connected{state="x"}`, problem: `no label "state"`},
	} {
		pend, problems := Check(c.expr, exported, TargetLabels, Synthetic, pending)
		got := strings.Join(problems, "; ")
		switch {
		case c.problem == "" && got != "":
			t.Errorf("%s: %s", c.expr, got)
		case c.problem != "" && !strings.Contains(got, c.problem):
			t.Errorf("%s: problems %q, want one about %q", c.expr, got, c.problem)
		}
		if (len(pend) > 0) != c.pending {
			t.Errorf("%s: pending %v", c.expr, pend)
		}
	}
}
