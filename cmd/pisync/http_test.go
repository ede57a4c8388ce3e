package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"html"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/watcher"
)

// startHTTPTestDaemon runs the daemon in-process like startTestDaemon, with its HTTP
// server on a free loopback port and the recent-errors ring on its logger. It returns
// the daemon and the server's base URL.
func startHTTPTestDaemon(t *testing.T, args ...string) (*daemon, string) {
	t.Helper()
	var f runFlags
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	f.register(fs)
	args = append(append([]string{"--tenant", "t1", "--owner", "alice"}, args...), "--http-addr", "127.0.0.1:0")
	if err := parseFlags(fs, args); err != nil {
		t.Fatal(err)
	}
	log := withRecentLog(zaptest.NewLogger(t, zaptest.Level(testLogLevel())))
	d, err := startDaemon(context.Background(), &f, log)
	if err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	if d.http == nil {
		d.stop()
		t.Fatal("daemon started without its HTTP server")
	}
	return d, "http://" + d.http.addr()
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// httpGet fetches url and returns the status code, body and headers.
func httpGet(t testing.TB, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body), resp.Header
}

func getStatus(t testing.TB, base string) statusDoc {
	t.Helper()
	code, body, hdr := httpGet(t, base+"/status.json")
	if code != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("/status.json: %d %s", code, hdr.Get("Content-Type"))
	}
	var doc statusDoc
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatalf("/status.json: %v\n%s", err, body)
	}
	return doc
}

// waitReadyz polls /readyz until it answers want.
func waitReadyz(t *testing.T, base string, want int, reason string) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("/readyz %d %q", want, reason), func() (bool, string) {
		code, body, _ := httpGet(t, base+"/readyz")
		return code == want && strings.Contains(body, reason), fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
	})
}

// nopSink is a watcher sink for a root without files: never called.
type nopSink struct{}

func (nopSink) Open(context.Context, watcher.File, watcher.OpenReason) (watcher.Start, error) {
	return watcher.Start{}, errors.New("unexpected file")
}
func (nopSink) Line(context.Context, watcher.File, watcher.Line) error { return nil }
func (nopSink) Torn(watcher.File, int64, int64)                        {}
func (nopSink) Gone(watcher.File)                                      {}

// TestHTTPReadyzBeforeFirstScan: /readyz is 503 while the initial scan has not finished
// (here: the watcher has not started), 200 once it has, and 503 again when NATS goes
// away; /healthz is 200 throughout.
func TestHTTPReadyzBeforeFirstScan(t *testing.T) {
	srv := natstest.Run(t)
	nc := natstest.Connect(t, srv.URL())
	w, err := watcher.New(watcher.Options{Roots: []string{t.TempDir()}, Sink: nopSink{}, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{nc: nc, watch: w, log: zaptest.NewLogger(t)}
	h := d.httpHandler()
	get0 := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}
	// Before every part has started (NATS still being dialled), not ready but alive.
	if code, body := get0("/readyz"); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "starting") {
		t.Fatalf("/readyz while starting: %d %q", code, body)
	}
	if code, _ := get0("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while starting: %d", code)
	}
	d.up.Store(true)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || body != "initial scan in progress" {
		t.Fatalf("/readyz before the first scan: %d %q", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz before the first scan: %d", code)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, 10*time.Second, "/readyz 200 after the first scan", func() (bool, string) {
		code, body := get("/readyz")
		return code == http.StatusOK && body == "ready", fmt.Sprintf("%d %q", code, body)
	})

	srv.Stop()
	waitFor(t, 10*time.Second, "/readyz 503 without NATS", func() (bool, string) {
		code, body := get("/readyz")
		return code == http.StatusServiceUnavailable && body == "NATS not connected", fmt.Sprintf("%d %q", code, body)
	})
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz without NATS: %d", code)
	}
}

// TestHTTPReadyzFollowsNATS: the running daemon's /readyz flips to 503 when its NATS
// server goes away and back to 200 when it returns; /healthz stays 200; status.json and
// the status page show the connection state and the disconnection among recent errors.
func TestHTTPReadyzFollowsNATS(t *testing.T) {
	rng := rand.New(rand.NewPCG(51, 52))
	srv := natstest.Run(t)
	root := t.TempDir()
	writeSessions(t, rng, root, 3, 5)
	d, base := startHTTPTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir(), "--ack-timeout", "2s")
	defer d.stop()

	if code, body, _ := httpGet(t, base+"/healthz"); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	waitReadyz(t, base, http.StatusOK, "ready")
	if doc := getStatus(t, base); !doc.Ready || !doc.NATS.Connected || doc.NATS.State != "connected" {
		t.Fatalf("status while connected: ready %v, nats %+v", doc.Ready, doc.NATS)
	}

	srv.Stop()
	waitReadyz(t, base, http.StatusServiceUnavailable, "NATS not connected")
	if code, _, _ := httpGet(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz during the outage: %d", code)
	}
	doc := getStatus(t, base)
	if doc.Ready || doc.NATS.Connected || doc.NATS.State == "connected" || doc.Reason != "NATS not connected" {
		t.Fatalf("status during the outage: ready %v (%s), nats %+v", doc.Ready, doc.Reason, doc.NATS)
	}
	_, page, _ := httpGet(t, base+"/")
	for _, want := range []string{"Not ready: NATS not connected", "disconnected from NATS", `class="lvl lvl-warn"`} {
		if !strings.Contains(page, want) {
			t.Errorf("status page during the outage lacks %q", want)
		}
	}

	srv.Restart()
	waitReadyz(t, base, http.StatusOK, "ready")
	doc = getStatus(t, base)
	if !doc.Ready || !doc.NATS.Connected || doc.NATS.Reconnects < 1 {
		t.Fatalf("status after the outage: ready %v, nats %+v", doc.Ready, doc.NATS)
	}
	found := false
	for _, e := range doc.RecentErrors {
		if e.Level == "warn" && e.Message == "disconnected from NATS" && strings.Contains(e.Fields, "error=") {
			found = true
		}
	}
	if !found || doc.ErrorsTotal < 1 {
		t.Fatalf("recent errors lack the disconnection: %+v (total %d)", doc.RecentErrors, doc.ErrorsTotal)
	}
}

// TestHTTPStatusKnownWorkload: for a known set of files (sessions, one deleted after
// mirroring, one with a torn tail, one *.jsonl that is no session), /status.json and the
// status page show exactly the expected numbers, over HTTP and rendered by Chromium.
func TestHTTPStatusKnownWorkload(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(53, 54))
	srv := natstest.Run(t)
	root := t.TempDir()
	files := writeSessions(t, rng, root, 7, 12)
	torn := []byte(`{"type":"message","id":"half`)
	if err := sessiontest.AppendBytes(files[1].Path, torn); err != nil {
		t.Fatal(err)
	}
	notSession := filepath.Join(root, "notes", "todo.jsonl")
	if err := os.MkdirAll(filepath.Dir(notSession), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notSession, []byte(`{"todo":"not a Pi session"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	d, base := startHTTPTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir(),
		"--verify-interval", "1s", "--verify-rate", "1000", "--verify-first-rate", "1000")
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	allMirrored(t, newReader(t, nc, "t1", "alice"), root, 30*time.Second)
	gone := files[6]
	if err := os.Remove(gone.Path); err != nil {
		t.Fatal(err)
	}
	files = files[:6]

	var size int64
	for _, f := range files {
		fi, err := os.Stat(f.Path)
		if err != nil {
			t.Fatal(err)
		}
		size += fi.Size()
	}
	want := rootState{Root: root, Sessions: 6, Mirrored: 6, Torn: 1, Deleted: 1, Skipped: 1,
		Bytes: size, MirroredBytes: size - int64(len(torn)), TornBytes: int64(len(torn)),
		Percent: 100 * float64(size-int64(len(torn))) / float64(size), SessionPercent: 100,
		Verified: verifiedCounts{Identical: 6}}
	var doc statusDoc
	waitFor(t, 30*time.Second, "status.json showing the workload", func() (bool, string) {
		doc = getStatus(t, base)
		got := doc.Roots[root]
		if got == nil {
			return false, fmt.Sprintf("no root %s in %v", root, doc.Roots)
		}
		g := *got
		g.LagSeconds = 0 // nothing waits: asserted below
		return g == want && doc.Verification.Passes > 0, fmt.Sprintf("\n got %+v\nwant %+v (passes %d)", g, want, doc.Verification.Passes)
	})
	r := doc.Roots[root]
	if len(doc.Roots) != 1 || r.LagSeconds != 0 || doc.LagSeconds != 0 || doc.InFlight != 0 {
		t.Fatalf("roots %v, lag %v/%v, in flight %d", doc.Roots, r.LagSeconds, doc.LagSeconds, doc.InFlight)
	}
	if tot := doc.Total; tot.Sessions != 6 || tot.Bytes != size || tot.MirroredBytes != want.MirroredBytes || tot.Verified != want.Verified {
		t.Fatalf("total %+v", tot)
	}
	if !doc.Ready || doc.Version != version || doc.Tenant != "t1" || doc.Owner != "alice" || !doc.NATS.Connected ||
		!doc.Verification.Enabled || doc.Verification.LastPass == nil {
		t.Fatalf("status: %+v", doc)
	}
	// Two directories (the root and notes/), watched within the budget, nothing polled.
	if w := doc.Watch; w.Watches < 2 || (w.Budget != 0 && w.Watches > w.Budget) || w.PolledDirs != 0 || w.PolledFiles != 0 || w.PollIntervalSeconds <= 0 {
		t.Fatalf("watch: %+v", w)
	}

	// The numbers people read, as the page writes them.
	wantText := []string{
		"Ready", "version " + version, "tenant t1", "owner alice",
		humanBytes(want.MirroredBytes) + " of " + humanBytes(size) + " · " + pctText(want.Percent),
		"6 of 6 sessions · 100%",
		"Torn tails 1 · " + humanBytes(want.TornBytes),
		"Deleted locally 1", "Skipped (not sessions) 1", "Pending 0 sessions", "Backlog 0 B", "Lag none",
		"6 identical · 0 drifted · 0 failed", "Watching every directory",
		// The skipped file was logged as a warning.
		"warn publisher skipping a .jsonl that is not a Pi session", "Logged since the daemon started:",
	}

	code, page, hdr := httpGet(t, base+"/")
	if code != http.StatusOK || hdr.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("/: %d %s", code, hdr.Get("Content-Type"))
	}
	text := pageText(page)
	for _, s := range wantText {
		if !strings.Contains(text, s) {
			t.Errorf("status page text lacks %q", s)
		}
	}
	for _, s := range []string{
		fmt.Sprintf(`<data value="%d">`, want.MirroredBytes), fmt.Sprintf(`<data value="%d">`, size),
		fmt.Sprintf(`aria-valuenow="%s"`, barWidth(want.Percent)), `aria-valuenow="100.00"`,
		`<code>` + html.EscapeString(root) + `</code>`,
	} {
		if !strings.Contains(page, s) {
			t.Errorf("status page lacks %s", s)
		}
	}
	checkSelfContained(t, page, hdr.Get("Content-Security-Policy"))
	if t.Failed() {
		t.Logf("page text: %s", text)
		t.FailNow()
	}

	t.Run("chromium", func(t *testing.T) {
		// The daemon's handler, behind a server that numbers the page's loads in the
		// part the page's script replaces: the DOM shows whether it refreshed itself.
		var loads atomic.Int32
		h := d.httpHandler()
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/" {
				h.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			maps.Copy(w.Header(), rec.Header())
			w.WriteHeader(rec.Code)
			_, _ = io.WriteString(w, strings.Replace(rec.Body.String(), `<div id="live">`,
				fmt.Sprintf(`<div id="live" data-load="%d">`, loads.Add(1)), 1))
		}))
		defer ts.Close()
		// Virtual time runs the 5 s refresh timer once before the DOM is dumped.
		dom := renderInChromium(t, ts.URL+"/", "--virtual-time-budget=6000")
		if !strings.Contains(dom, `data-live="on"`) {
			t.Errorf("the page's script did not run (blocked by its Content-Security-Policy?)")
		}
		if !strings.Contains(dom, `<div id="live" data-load="2">`) {
			t.Errorf("the page did not refresh itself (%d loads)", loads.Load())
		}
		text := pageText(dom)
		for _, s := range wantText {
			if !strings.Contains(text, s) {
				t.Errorf("rendered page lacks %q", s)
			}
		}
		if !strings.Contains(text, "Pause refresh") || !staleHidden.MatchString(dom) {
			t.Errorf("rendered page: refresh control missing, or the not-answering banner shown")
		}
		if t.Failed() {
			t.Logf("rendered text: %s", text)
		}
	})
}

var (
	scriptOrStyle = regexp.MustCompile(`(?is)<(script|style)\b[^>]*>.*?</(script|style)>`)
	anyTag        = regexp.MustCompile(`(?s)<[^>]*>`)
	spaces        = regexp.MustCompile(`\s+`)
	assetRef      = regexp.MustCompile(`(?i)\s(?:src|href|action|srcset|poster|data)\s*=\s*"([^"]*)"`)
	scriptBody    = regexp.MustCompile(`(?s)<script>(.*?)</script>`)
	staleHidden   = regexp.MustCompile(`<p id="stale"[^>]*\shidden[\s=>]`)
)

// pageText is the text of an HTML page: no scripts, styles or tags, entities decoded,
// white space collapsed.
func pageText(page string) string {
	s := scriptOrStyle.ReplaceAllString(page, " ")
	s = anyTag.ReplaceAllString(s, " ")
	return strings.TrimSpace(spaces.ReplaceAllString(html.UnescapeString(s), " "))
}

// checkSelfContained: the page refers to nothing outside itself but its own endpoints,
// and its Content-Security-Policy allows its one script and no other.
func checkSelfContained(t *testing.T, page, csp string) {
	t.Helper()
	for _, m := range assetRef.FindAllStringSubmatch(page, -1) {
		u := html.UnescapeString(m[1])
		if strings.Contains(u, "//") && !strings.HasPrefix(u, "data:") {
			t.Errorf("status page refers to %q", u)
		}
	}
	if !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	scripts := scriptBody.FindAllStringSubmatch(page, -1)
	if len(scripts) != 1 {
		t.Fatalf("status page has %d inline scripts, want 1", len(scripts))
	}
	sum := sha256.Sum256([]byte(scripts[0][1]))
	if h := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(csp, "script-src "+h) {
		t.Errorf("Content-Security-Policy %q does not allow the page's script %s", csp, h)
	}
}

// renderInChromium loads url in headless Chromium and returns the DOM after load.
// Without Chromium the test is skipped, or fails under CI=true.
func renderInChromium(t *testing.T, url string, args ...string) string {
	t.Helper()
	chromium, err := exec.LookPath("chromium") // Debian's package; .ci/install-deps installs it
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chromium missing (CI=true): run .ci/install-deps")
		}
		t.Skipf("chromium missing: apt-get install chromium (or run .ci/install-deps)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, chromium, append(args, "--dump-dom", url)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // helpers Chromium left behind
	}
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(string(out), "</html>") {
		t.Fatalf("chromium printed no page:\n%s\n%s", out, stderr.String())
	}
	return string(out)
}

// TestStatusRecentLogRing: the ring keeps the newest warnings and errors, newest first,
// with their logger name and fields, even below the logger's own level; it counts what
// it dropped; wrapping twice is a no-op.
func TestStatusRecentLogRing(t *testing.T) {
	core, logs := observer.New(zapcore.ErrorLevel)
	log := withRecentLog(zap.New(core))
	if withRecentLog(log) != log {
		t.Fatal("withRecentLog wrapped twice")
	}
	ring := recentLogOf(log)
	if ring == nil {
		t.Fatal("no ring on the logger")
	}
	log.Info("routine")
	pub := log.Named("publisher").With(zap.String("file", "a.jsonl"))
	pub.Warn("slow ack", zap.Duration("after", 3*time.Second))
	if recentLogOf(pub) != ring {
		t.Fatal("named logger lost the ring")
	}
	got, total := ring.entries()
	if total != 1 || len(got) != 1 {
		t.Fatalf("entries %+v, total %d", got, total)
	}
	if e := got[0]; e.Level != "warn" || e.Logger != "publisher" || e.Message != "slow ack" || e.Fields != "after=3s file=a.jsonl" {
		t.Fatalf("entry %+v", e)
	}
	if logs.Len() != 0 {
		t.Fatalf("the warning reached the error-level core: %v", logs.All())
	}
	for i := range recentLogSize + 5 {
		log.Error(fmt.Sprintf("failure %d", i), zap.Int("n", i), zap.Error(errors.New("boom")))
	}
	got, total = ring.entries()
	if total != recentLogSize+6 || len(got) != recentLogSize {
		t.Fatalf("%d entries kept of %d, want %d of %d", len(got), total, recentLogSize, recentLogSize+6)
	}
	if got[0].Fields != fmt.Sprintf("error=boom n=%d", recentLogSize+4) || got[len(got)-1].Fields != "error=boom n=5" {
		t.Fatalf("order: newest %q, oldest %q", got[0].Fields, got[len(got)-1].Fields)
	}
	if logs.Len() != recentLogSize+5 {
		t.Fatalf("the inner core got %d errors, want %d", logs.Len(), recentLogSize+5)
	}
	for i := range 3 {
		log.Error("failure 24", zap.Int("n", 100+i)) // repeats of the newest: folded
	}
	got, total = ring.entries()
	if total != recentLogSize+9 || len(got) != recentLogSize || got[0].Count != 4 || got[0].Fields != "n=102" || got[1].Count != 1 {
		t.Fatalf("folding repeats: total %d, newest %+v, next %+v", total, got[0], got[1])
	}
	if recentLogOf(zap.NewNop()) != nil {
		t.Fatal("a ring on a plain logger")
	}
	if e, n := (*recentLog)(nil).entries(); e != nil || n != 0 {
		t.Fatal("nil ring not empty")
	}
}

// TestStatusFormatting: the page's numbers for people.
func TestStatusFormatting(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{pctText(99.97), "99.9%"}, {pctText(100), "100%"}, {pctText(0), "0%"}, {pctText(0.04), "0.0%"}, {pctText(61.25), "61.2%"},
		{barWidth(120), "100.00"}, {barWidth(-1), "0.00"},
		{durText(0), "none"}, {durText(0.35), "350 ms"}, {durText(4.25), "4.2 s"}, {durText(192), "3m12s"}, {durText(7500), "2h5m"}, {durText(600), "10m"}, {durText(3600), "1h0m"},
		{agoText(time.Unix(100, 0), time.Unix(112, 0)), "12.0 s ago"}, {agoText(time.Unix(100, 0), time.Unix(100, 1)), "just now"},
		{numText(0), "0"}, {numText(999), "999"}, {numText(1000), "1,000"}, {numText(int64(-1234567)), "-1,234,567"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// TestHTTPPprof: Go's profiles are served only with --pprof.
func TestHTTPPprof(t *testing.T) {
	for _, on := range []bool{false, true} {
		d := &daemon{f: &runFlags{pprof: on}, log: zaptest.NewLogger(t)}
		h := d.httpHandler()
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if want := map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[on]; rec.Code != want {
				t.Errorf("--pprof=%v: GET %s: %d, want %d", on, path, rec.Code, want)
			}
		}
	}
}
