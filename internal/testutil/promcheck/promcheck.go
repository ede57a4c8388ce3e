// Package promcheck keeps pisync's Grafana dashboards (dashboards/) and alert rules
// (deploy/prometheus) true to the metrics the daemon exports: it parses each PromQL
// expression with Prometheus' own parser, finds the metric and label names it uses, and
// checks them against the golden list of exported metric families
// (dashboards/testdata/exported-metrics.txt, written by the daemon's own test in
// cmd/pisync). Only tests import it, so the Prometheus module never reaches the daemon.
package promcheck

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
)

// TargetLabels are the labels Prometheus attaches to every series of a target at scrape
// time (deploy/prometheus/prometheus.yml): job and instance always, tenant from the
// target's configuration (one daemon publishes for one tenant), namespace and pod for
// the Kubernetes sidecars.
var TargetLabels = map[string]bool{"job": true, "instance": true, "tenant": true, "namespace": true, "pod": true}

// Synthetic are series Prometheus makes itself, with their own labels.
var Synthetic = map[string][]string{"up": nil}

// Pending are metrics that dashboards and alert rules already use but the daemon does
// not export yet, with the labels they will have. The checks accept them and say so; once
// the daemon exports one, the checks fail until it is removed from here.
var Pending = map[string][]string{}

// Family is one exported metric family: its type and label names.
type Family struct {
	Name   string
	Type   string // counter, gauge, histogram, summary, untyped
	Labels []string
}

// LoadExported reads the golden list of exported metric families.
func LoadExported(path string) (map[string]Family, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]Family{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Fields(line)
		if len(parts) < 2 || len(parts) > 3 {
			return nil, fmt.Errorf("%s:%d: want `name type [label,label…]`, got %q", path, n, line)
		}
		fam := Family{Name: parts[0], Type: parts[1]}
		if len(parts) == 3 {
			fam.Labels = strings.Split(parts[2], ",")
		}
		out[fam.Name] = fam
	}
	return out, sc.Err()
}

// Use is what one expression refers to.
type Use struct {
	Metrics   []string          // metric names, sorted, deduplicated
	Functions []string          // functions and aggregation operators called
	Matchers  map[string]string // label name → metric it was matched on ("" inside by/on/…)
	Grouping  []string          // label names of by, without, on, ignoring, group_left/right
}

// promql parses with Prometheus' defaults: the functions every Prometheus 3 accepts,
// so a query that needs an experimental flag is refused.
var promql = parser.NewParser(parser.Options{})

// Scan parses a PromQL expression and finds its metrics, functions and label names. It
// fails on what Prometheus would refuse (a syntax error, an unknown function, a Grafana
// variable left in) and on a selector without a metric name, which no check could
// follow.
func Scan(expr string) (Use, error) {
	u := Use{Matchers: map[string]string{}}
	root, err := promql.ParseExpr(expr)
	if err != nil {
		return u, err
	}
	metrics, funcs := map[string]bool{}, map[string]bool{}
	parser.Inspect(root, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			if n.Name == "" {
				err = fmt.Errorf("selector without a metric name: %s", n)
				return err
			}
			metrics[n.Name] = true
			for _, m := range n.LabelMatchers {
				if m.Name != "__name__" {
					u.Matchers[m.Name] = n.Name
				}
			}
		case *parser.Call:
			funcs[n.Func.Name] = true
		case *parser.AggregateExpr:
			funcs[n.Op.String()] = true
			u.Grouping = append(u.Grouping, n.Grouping...)
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil {
				u.Grouping = append(u.Grouping, vm.MatchingLabels...)
				u.Grouping = append(u.Grouping, vm.Include...)
			}
		}
		return nil
	})
	if err != nil {
		return u, err
	}
	u.Metrics = sortedKeys(metrics)
	u.Functions = sortedKeys(funcs)
	return u, nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Resolve maps a metric name as written in PromQL to its exported family: a histogram
// or summary is exported under its own name and queried as name_bucket, name_sum and
// name_count.
func Resolve(name string, exported map[string]Family) (Family, bool) {
	if f, ok := exported[name]; ok {
		return f, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if f, ok := exported[base]; ok && (f.Type == "histogram" || f.Type == "summary") {
			if suffix == "_bucket" && f.Type != "histogram" {
				return Family{}, false
			}
			if suffix == "_bucket" {
				f.Labels = append(append([]string(nil), f.Labels...), "le")
			}
			return f, true
		}
	}
	return Family{}, false
}

// Check verifies one expression against the exported families: every metric exists
// (or is in extra, e.g. Prometheus' own `up`, or in pending, named but not yet
// exported), every label matched on a metric is one of its labels or a target label,
// and every grouping label belongs to a metric of the expression or to the targets.
// pending names are reported back so that the caller can say so.
func Check(expr string, exported map[string]Family, targetLabels map[string]bool, extra, pending map[string][]string) (usedPending []string, problems []string) {
	u, err := Scan(expr)
	if err != nil {
		return nil, []string{err.Error()}
	}
	if len(u.Metrics) == 0 {
		problems = append(problems, "names no metric")
	}
	known := map[string]bool{}
	for l := range targetLabels {
		known[l] = true
	}
	labelsOf := map[string][]string{}
	for _, m := range u.Metrics {
		if f, ok := Resolve(m, exported); ok {
			labelsOf[m] = f.Labels
		} else if ls, ok := extra[m]; ok {
			labelsOf[m] = ls
		} else if ls, ok := pending[m]; ok {
			labelsOf[m] = ls
			usedPending = append(usedPending, m)
		} else {
			problems = append(problems, fmt.Sprintf("metric %s is not exported by the daemon", m))
			continue
		}
		for _, l := range labelsOf[m] {
			known[l] = true
		}
	}
	for l, m := range u.Matchers {
		if l == "__name__" {
			continue
		}
		ls, ok := labelsOf[m]
		if !ok {
			continue // unknown metric: reported above
		}
		if !slices.Contains(ls, l) && !targetLabels[l] {
			problems = append(problems, fmt.Sprintf("%s has no label %q (labels: %v; target labels: %v)", m, l, ls, sortedKeys(targetLabels)))
		}
	}
	for _, l := range u.Grouping {
		if !known[l] {
			problems = append(problems, fmt.Sprintf("grouping by %q, a label of none of %v nor of the targets", l, u.Metrics))
		}
	}
	return usedPending, problems
}
