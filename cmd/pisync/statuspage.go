package main

import (
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"fmt"
	"html/template"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pisync/pisync/internal/logx"
	"github.com/pisync/pisync/publisher"
	"github.com/pisync/pisync/watcher"
)

// statusDoc is what /status.json and the status page show.
type statusDoc struct {
	Version      string                  `json:"version"`
	Ready        bool                    `json:"ready"`
	Reason       string                  `json:"reason"`
	Tenant       string                  `json:"tenant"`
	Owner        string                  `json:"owner"`
	Host         string                  `json:"host"`
	NATS         natsStatus              `json:"nats"`
	Roots        map[string]*rootState   `json:"roots"` // by root (absolute path)
	Total        rootState               `json:"total"` // every root together
	InFlight     int                     `json:"in_flight"`
	LagSeconds   float64                 `json:"lag_seconds"` // age of the oldest line read and not acknowledged
	Verification verifyStatus            `json:"verification"`
	Watch        watchStatus             `json:"watch"`
	RecentErrors []recentEntry           `json:"recent_errors"`       // newest first, at most recentLogSize
	ErrorsTotal  uint64                  `json:"recent_errors_total"` // warnings and errors logged since start
	Quarantined  []publisher.Quarantined `json:"quarantined"`         // lines the server refused for good, newest first
	// Shrunk are the sessions whose newest generation lacks entries of the one before
	// it: destroyed in place, their data in the older generation.
	Shrunk []publisher.ShrunkSession `json:"shrunk"`
	// Diverged are the sessions mirrored apart because another host continued their
	// conversation past the lines the two copies share.
	Diverged []publisher.DivergedSession `json:"diverged"`
	// SkippedFiles are the .jsonl files under the roots that are no session in any form.
	SkippedFiles []publisher.SkippedFile `json:"skipped_files"`
	Backpressure publisher.Backpressure  `json:"backpressure"` // the cluster holding publishing back for lack of room
	Time         time.Time               `json:"time"`
}

// natsStatus is the daemon's connection to NATS.
type natsStatus struct {
	Connected  bool   `json:"connected"`
	State      string `json:"state"`            // connected, reconnecting, closed, …
	URL        string `json:"url"`              // as configured, credentials hidden
	Server     string `json:"server,omitempty"` // name of the server connected to
	Embedded   bool   `json:"embedded"`         // the daemon runs its own nats-server
	Reconnects uint64 `json:"reconnects"`
	LastError  string `json:"last_error,omitempty"`
}

// rootState is the progress of one root (or of all of them, in statusDoc.Total).
type rootState struct {
	Root           string         `json:"root,omitempty"`
	Sessions       int            `json:"sessions"`
	Mirrored       int            `json:"mirrored"`
	Pending        int            `json:"pending"`
	Torn           int            `json:"torn"`
	Deleted        int            `json:"deleted"`
	Skipped        int            `json:"skipped"`
	Bytes          int64          `json:"bytes"`
	MirroredBytes  int64          `json:"mirrored_bytes"`
	BacklogBytes   int64          `json:"backlog_bytes"`
	TornBytes      int64          `json:"torn_bytes"`
	Percent        float64        `json:"percent"`         // mirrored bytes / bytes
	SessionPercent float64        `json:"session_percent"` // mirrored sessions / sessions
	LagSeconds     float64        `json:"lag_seconds"`
	Verified       verifiedCounts `json:"verified"`           // in the last background verification pass
	PolledDirs     int            `json:"polled_directories"` // directories without a watch, polled
	PolledFiles    int            `json:"polled_sessions"`    // sessions in them
}

// watchStatus is how the watcher follows the roots: kernel watches within a budget,
// and polling for what does not fit (the pisync_watcher_watches, _watch_budget and
// _polled_* metrics).
type watchStatus struct {
	Watches             int     `json:"watches"`
	Budget              int     `json:"budget"` // 0 = none
	PolledDirs          int     `json:"polled_directories"`
	PolledFiles         int     `json:"polled_sessions"`
	PollIntervalSeconds float64 `json:"poll_interval_seconds"`
}

type verifiedCounts struct {
	Identical int `json:"identical"`
	Drifted   int `json:"drifted"`
	Failed    int `json:"failed"`
	// Unverified: never verified, waiting for their first read (--verify-first-rate).
	Unverified int `json:"unverified"`
}

// verifyStatus is the background verification (the pisync_verif* metrics).
type verifyStatus struct {
	Enabled         bool       `json:"enabled"`
	IntervalSeconds float64    `json:"interval_seconds"`
	Passes          int        `json:"passes"`
	LastPass        *time.Time `json:"last_pass,omitempty"`
}

func (d *daemon) status() statusDoc {
	now := time.Now()
	ok, why := d.ready()
	p := publisher.Progress{Roots: map[string]*publisher.RootProgress{}}
	var oldest map[string]time.Time
	if d.up.Load() { // before, the daemon is still connecting: nothing to report yet
		p = d.pub.Progress()
		oldest = d.pub.OldestUnackedByRoot()
	}
	doc := statusDoc{Version: version, Ready: ok, Reason: why, Tenant: d.f.conn.tenant, Owner: d.f.conn.owner,
		Host: d.f.host, NATS: d.natsStatus(), InFlight: p.InFlight, Time: now.UTC()}
	if !p.OldestUnacked.IsZero() {
		doc.LagSeconds = now.Sub(p.OldestUnacked).Seconds()
	}
	verified, ver := d.verification()
	doc.Verification = ver
	var polled map[string]watcher.Polled
	doc.Watch.PollIntervalSeconds = watcher.DefaultFallbackPollInterval.Seconds()
	if d.up.Load() {
		st := d.watch.Stats()
		doc.Watch.Watches, doc.Watch.Budget = st.Watches, st.WatchBudget
		doc.Watch.PolledDirs, doc.Watch.PolledFiles = st.PolledDirs, st.PolledFiles
		polled = d.watch.PolledByRoot()
	}

	doc.Roots = map[string]*rootState{}
	for _, root := range d.f.roots.get() {
		if abs, err := filepath.Abs(root); err == nil {
			root = abs
		}
		doc.Roots[root] = &rootState{Root: root}
	}
	for root := range p.Roots {
		if doc.Roots[root] == nil {
			doc.Roots[root] = &rootState{Root: root}
		}
	}
	t := &doc.Total
	for _, rs := range doc.Roots {
		if r := p.Roots[rs.Root]; r != nil {
			rs.Sessions, rs.Mirrored, rs.Pending, rs.Torn, rs.Deleted, rs.Skipped = r.Sessions, r.Mirrored, r.Pending, r.Torn, r.Deleted, r.Skipped
			rs.Bytes, rs.MirroredBytes, rs.BacklogBytes, rs.TornBytes = r.Bytes, r.MirroredBytes, r.BacklogBytes, r.TornBytes
		}
		if o, ok := oldest[rs.Root]; ok {
			rs.LagSeconds = now.Sub(o).Seconds()
		}
		rs.Verified = verified[rs.Root]
		rs.PolledDirs, rs.PolledFiles = polled[rs.Root].Dirs, polled[rs.Root].Files
		rs.percents()
		t.Sessions += rs.Sessions
		t.Mirrored += rs.Mirrored
		t.Pending += rs.Pending
		t.Torn += rs.Torn
		t.Deleted += rs.Deleted
		t.Skipped += rs.Skipped
		t.Bytes += rs.Bytes
		t.MirroredBytes += rs.MirroredBytes
		t.BacklogBytes += rs.BacklogBytes
		t.TornBytes += rs.TornBytes
		t.LagSeconds = max(t.LagSeconds, rs.LagSeconds)
		t.Verified.Identical += rs.Verified.Identical
		t.Verified.Drifted += rs.Verified.Drifted
		t.Verified.Failed += rs.Verified.Failed
		t.Verified.Unverified += rs.Verified.Unverified
	}
	t.percents()
	doc.RecentErrors, doc.ErrorsTotal = recentLogOf(d.log).entries()
	if doc.RecentErrors == nil {
		doc.RecentErrors = []recentEntry{}
	}
	doc.Quarantined = []publisher.Quarantined{}
	doc.Shrunk = []publisher.ShrunkSession{}
	doc.Diverged = []publisher.DivergedSession{}
	doc.SkippedFiles = []publisher.SkippedFile{}
	if d.up.Load() {
		doc.Quarantined = d.pub.Quarantined()
		doc.Shrunk = d.pub.Shrunk()
		doc.Diverged = d.pub.Diverged()
		doc.SkippedFiles = d.pub.Skipped()
		doc.Backpressure = d.pub.Backpressure()
	}
	return doc
}

func (rs *rootState) percents() {
	rs.Percent, rs.SessionPercent = 100, 100
	if rs.Bytes > 0 {
		rs.Percent = 100 * float64(rs.MirroredBytes) / float64(rs.Bytes)
	}
	if rs.Sessions > 0 {
		rs.SessionPercent = 100 * float64(rs.Mirrored) / float64(rs.Sessions)
	}
}

func (d *daemon) natsStatus() natsStatus {
	s := natsStatus{URL: logx.URL(d.f.conn.url()), Embedded: d.f.conn.natsURL == "", State: "connecting"}
	if !d.up.Load() {
		return s
	}
	s.Connected = d.nc.IsConnected()
	s.State = strings.ToLower(d.nc.Status().String())
	if s.Connected {
		s.Server = d.nc.ConnectedServerName()
	}
	s.Reconnects = d.nc.Stats().Reconnects
	if err := d.nc.LastError(); err != nil {
		s.LastError = err.Error()
	}
	return s
}

// verification reads the background verification's latest pass from the daemon's
// registry: the same numbers /metrics exports.
func (d *daemon) verification() (map[string]verifiedCounts, verifyStatus) {
	vs := verifyStatus{Enabled: d.f.verifyInterval > 0, IntervalSeconds: d.f.verifyInterval.Seconds()}
	counts := map[string]verifiedCounts{}
	if d.reg == nil {
		return counts, vs
	}
	mfs, _ := d.reg.Gather() // a failing collector elsewhere leaves these intact
	var last float64
	for _, mf := range mfs {
		switch mf.GetName() {
		case "pisync_verified_sessions":
			for _, m := range mf.GetMetric() {
				var root, result string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "root":
						root = l.GetValue()
					case "result":
						result = l.GetValue()
					}
				}
				c := counts[root]
				n := int(m.GetGauge().GetValue())
				switch result {
				case "identical":
					c.Identical = n
				case "drifted":
					c.Drifted = n
				case "failed":
					c.Failed = n
				case "unverified":
					c.Unverified = n
				}
				counts[root] = c
			}
		case "pisync_verify_passes_total":
			for _, m := range mf.GetMetric() {
				vs.Passes = int(m.GetCounter().GetValue())
			}
		case "pisync_verify_last_pass_timestamp_seconds":
			for _, m := range mf.GetMetric() {
				last = m.GetGauge().GetValue()
			}
		}
	}
	if vs.Passes > 0 && last > 0 {
		sec, frac := math.Modf(last)
		t := time.Unix(int64(sec), int64(frac*1e9)).UTC()
		vs.LastPass = &t
	}
	return counts, vs
}

// Formatting for people.

// pctText is a percentage rounded down, so that 99.97 % does not read as done.
func pctText(p float64) string {
	switch {
	case p >= 100:
		return "100%"
	case p <= 0:
		return "0%"
	}
	return strconv.FormatFloat(math.Floor(p*10)/10, 'f', 1, 64) + "%"
}

// barWidth is p clamped to 0–100, for a CSS width.
func barWidth(p float64) string {
	return strconv.FormatFloat(math.Max(0, math.Min(100, p)), 'f', 2, 64)
}

// durText is a duration in seconds: "none", "350 ms", "4.2 s", "3m12s", "10m", "2h5m".
func durText(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d <= 0:
		return "none"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		s := d.Round(time.Second).String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		return s
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

// agoText is how long before now t was.
func agoText(t time.Time, now time.Time) string {
	d := now.Sub(t)
	if d < time.Second {
		return "just now"
	}
	return durText(d.Seconds()) + " ago"
}

// numText groups thousands: 1234567 → "1,234,567".
func numText[N int | int64 | uint64](n N) string {
	s := strconv.FormatInt(int64(n), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// statusRefresh is how often the page reloads its numbers.
const statusRefresh = 5 * time.Second

//go:embed statuspage.html
var statusPageHTML string

//go:embed statuspage.js
var statusPageJS string

// statusPageCSP allows nothing but the page's own style, its one script (by digest) and
// its requests to itself: no external asset can load.
var statusPageCSP = func() string {
	sum := sha256.Sum256([]byte(statusPageJS))
	return "default-src 'none'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; " +
		"script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; " +
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

// statusView is what the template renders.
type statusView struct {
	statusDoc
	Now     time.Time
	Refresh int // seconds
	Script  template.JS
}

var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	"bytes": humanBytes,
	"pct":   pctText,
	"width": barWidth,
	"dur":   durText,
	"ago":   agoText,
	"num":   func(n int) string { return numText(n) },
	"num64": func(n int64) string { return numText(n) },
	"numu":  func(n uint64) string { return numText(n) },
	"clock": func(t time.Time) string { return t.UTC().Format("15:04:05 MST") },
	"stamp": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
}).Parse(statusPageHTML))
