// Package deploy holds no code: it is the home of the deployment kit (systemd unit, NATS
// cluster and account configurations, Prometheus scrape configuration and alert rules, a
// Kubernetes example) and of the tests that check it. Those tests parse every file with
// the parser of the program that reads it (nats-server's, promtool, systemd-analyze where
// present), start a 3-node TLS cluster and the permission layouts from the NATS files, and
// check that every metric the alert rules use is one the daemon exports.
package deploy
