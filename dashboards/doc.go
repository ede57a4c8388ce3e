// Package dashboards holds no code: it is the home of pisync's Grafana dashboards (the
// JSON files in this directory) and of the tests that check them. Those tests parse every
// query with Prometheus' own PromQL parser (internal/promcheck) and check that it names
// only metrics and labels the daemon exports, and that every exported metric is on a
// dashboard and documented in the README.
package dashboards
