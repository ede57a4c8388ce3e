// Package dashboards holds pisync's Grafana dashboards (JSON files in this directory)
// and the checks that keep them, and the alert rules of deploy/prometheus, true to the
// metrics the daemon exports: a PromQL scanner that finds the metric and label names an
// expression uses, and the reader of the golden list of exported metric families
// (testdata/exported-metrics.txt, written by the daemon's own test in cmd/pisync).
//
// The scanner is not a PromQL parser (the Prometheus module is not a dependency of
// pisync); promtool, where installed, parses the expressions fully.
package dashboards

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strings"
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

// keywords are PromQL words that are neither metrics nor functions.
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "offset": true, "bool": true, "atan2": true,
	"inf": true, "nan": true, "start": true, "end": true,
}

// groupingWords take a parenthesised list of label names.
var groupingWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// aggregations are PromQL's aggregation operators: `sum by (x) (…)` puts the grouping
// between the operator and its parenthesis.
var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// Functions are PromQL's functions (Prometheus 2.x and 3.x).
var Functions = map[string]bool{
	"abs": true, "absent": true, "absent_over_time": true, "ceil": true, "changes": true, "clamp": true,
	"clamp_max": true, "clamp_min": true, "day_of_month": true, "day_of_week": true, "day_of_year": true,
	"days_in_month": true, "delta": true, "deriv": true, "exp": true, "floor": true,
	"histogram_avg": true, "histogram_count": true, "histogram_fraction": true, "histogram_quantile": true,
	"histogram_stddev": true, "histogram_stdvar": true, "histogram_sum": true, "hour": true, "idelta": true,
	"increase": true, "irate": true, "label_join": true, "label_replace": true, "ln": true, "log2": true,
	"log10": true, "minute": true, "month": true, "predict_linear": true, "rate": true, "resets": true,
	"round": true, "scalar": true, "sgn": true, "sort": true, "sort_desc": true, "sort_by_label": true,
	"sort_by_label_desc": true, "sqrt": true, "time": true, "timestamp": true, "vector": true, "year": true,
	"avg_over_time": true, "min_over_time": true, "max_over_time": true, "sum_over_time": true,
	"count_over_time": true, "quantile_over_time": true, "stddev_over_time": true, "stdvar_over_time": true,
	"last_over_time": true, "present_over_time": true, "mad_over_time": true,
	"acos": true, "acosh": true, "asin": true, "asinh": true, "atan": true, "atanh": true, "cos": true,
	"cosh": true, "sin": true, "sinh": true, "tan": true, "tanh": true, "deg": true, "rad": true, "pi": true,
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentChar(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// Scan finds the metrics, functions and label names of a PromQL expression. It fails on
// what it cannot tokenize (an unterminated string or brace), on an unknown function and
// on a selector without a metric name.
func Scan(expr string) (Use, error) {
	u := Use{Matchers: map[string]string{}}
	metrics, funcs := map[string]bool{}, map[string]bool{}
	i, n := 0, len(expr)
	lastIdent := ""
	for i < n {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '$':
			return u, fmt.Errorf("unsubstituted variable at %d: %.20s", i, expr[i:])
		case c == '#': // comment to the end of the line
			for i < n && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, i)
			if err != nil {
				return u, err
			}
			i, lastIdent = end, ""
		case c == '[': // range or subquery: durations only
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return u, fmt.Errorf("unterminated [ at %d", i)
			}
			if strings.ContainsRune(expr[i:i+j], '$') {
				return u, fmt.Errorf("unsubstituted variable in %s", expr[i:i+j+1])
			}
			i, lastIdent = i+j+1, ""
		case c == '{':
			end, labels, err := scanMatchers(expr, i)
			if err != nil {
				return u, err
			}
			if lastIdent == "" {
				return u, fmt.Errorf("selector without a metric name at %d: %s", i, expr[i:end])
			}
			for _, l := range labels {
				u.Matchers[l] = lastIdent
			}
			i, lastIdent = end, ""
		case c >= '0' && c <= '9' || (c == '.' && i+1 < n && expr[i+1] >= '0' && expr[i+1] <= '9'):
			// a number or a duration (5m, 1h30m, 1e3, 0x1f)
			for i < n && (isIdentChar(expr[i]) || expr[i] == '.') {
				i++
			}
			lastIdent = ""
		case isIdentStart(c):
			j := i
			for j < n && isIdentChar(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := j
			for k < n && (expr[k] == ' ' || expr[k] == '\t' || expr[k] == '\n') {
				k++
			}
			next := byte(0)
			if k < n {
				next = expr[k]
			}
			lw := strings.ToLower(word)
			switch {
			case groupingWords[lw]:
				if next == '(' {
					end := strings.IndexByte(expr[k:], ')')
					if end < 0 {
						return u, fmt.Errorf("unterminated %s( at %d", word, i)
					}
					for _, l := range strings.Split(expr[k+1:k+end], ",") {
						if l = strings.TrimSpace(l); l != "" {
							u.Grouping = append(u.Grouping, l)
						}
					}
					j = k + end + 1
				}
				lastIdent = ""
			case keywords[lw]:
				lastIdent = ""
			case aggregations[lw]:
				funcs[lw] = true
				lastIdent = ""
			case next == '(':
				if !Functions[word] {
					return u, fmt.Errorf("unknown function %s()", word)
				}
				funcs[word] = true
				lastIdent = ""
			default:
				metrics[word] = true
				lastIdent = word
			}
			i = j
		default:
			i++
			lastIdent = ""
		}
	}
	u.Metrics = sortedKeys(metrics)
	u.Functions = sortedKeys(funcs)
	return u, nil
}

func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if q != '`' {
				j++
			}
		case q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at %d", i)
}

// scanMatchers reads {name op "value", …} from s[i] = '{' and returns the label names.
func scanMatchers(s string, i int) (int, []string, error) {
	var labels []string
	j := i + 1
	for j < len(s) {
		switch c := s[j]; {
		case c == '}':
			return j + 1, labels, nil
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(s, j)
			if err != nil {
				return 0, nil, err
			}
			j = end
		case isIdentStart(c):
			k := j
			for k < len(s) && isIdentChar(s[k]) {
				k++
			}
			labels = append(labels, s[j:k])
			j = k
		default:
			j++
		}
	}
	return 0, nil, fmt.Errorf("unterminated { at %d", i)
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
		if !contains(ls, l) && !targetLabels[l] {
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

func contains(ls []string, l string) bool {
	for _, x := range ls {
		if x == l {
			return true
		}
	}
	return false
}
