package conformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/pitest"
	"github.com/pisync/pisync/recovery"
)

// blobThreshold is pisync's default --blob-threshold: lines above go to the object store.
const blobThreshold = 512 << 10

// TestRoundTrip: Pi writes a tree of sessions — every scenario of the helper before the
// daemon starts, again while it runs (in roots that do not exist yet when it starts),
// messages appended to a session the daemon has already back-filled, and a new session of
// lines over 512 KiB, which Node writes in several writes. The daemon mirrors it all, the
// tree is deleted, and `pisync recover --all` rebuilds it in place: every file comes back
// byte for byte, Pi opens it, and Pi's canonical dump (header, entries, leaf, branch,
// model context) equals the original's. `pisync verify` then agrees.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	sw := newStopwatch(t)
	pi := pitest.New(t)
	pisyncBinary(t)
	sw.lap("built pisync")
	srv := natstest.Run(t)
	base := t.TempDir()
	before, during := filepath.Join(base, "before"), filepath.Join(base, "during")
	var roots []string
	for _, dir := range []string{before, during} {
		roots = append(roots, filepath.Join(dir, "harness"), filepath.Join(dir, "cli", "sessions"))
	}

	var files []piFile
	add := func(phase string, s pitest.Scenario) { files = append(files, scenarioFile(phase, s)) }
	var appendTo string
	for _, s := range pi.WriteScenarios(t, before) {
		add("before", s)
		if s.Name == "harness-basic" {
			appendTo = s.Path
		}
	}

	sw.lap("Pi wrote the first tree")
	d := startDaemon(t, srv.URL(), filepath.Join(base, "state"), roots...)
	mc := newMirrorClient(t, srv.URL())
	appending := pi.StartLive(t, appendTo, pitest.LiveOptions{Count: 6, IntervalMs: 50})
	large := pi.StartLive(t, filepath.Join(during, "harness"), pitest.LiveOptions{Count: 4, IntervalMs: 50, Bytes: 700 << 10, Cwd: "/home/dev/live"})
	for _, s := range pi.WriteScenarios(t, during) {
		add("during", s)
	}
	if ev := appending.Wait(t); len(ev) != 7 || ev[0].Created {
		t.Fatalf("live append to %s: events %+v", appendTo, ev)
	}
	ev := large.Wait(t)
	files = append(files, piFile{name: "during/live-large-lines", path: ev[0].Path, loader: "harness"})
	sw.lap("Pi wrote while the daemon ran")
	mc.waitMirrored(t, roots...)
	sw.lap("mirrored")
	d.stop(t)

	recoverAndCompare(t, sw, pi, srv.URL(), []string{before, during}, roots, files)
}

// piFile is one session file Pi wrote: a name for the subtest, and Pi's loader for it.
type piFile struct {
	name, path, loader string
	v1                 bool // a version-1 file: Pi gives its entries random ids on each open
}

func scenarioFile(phase string, s pitest.Scenario) piFile {
	return piFile{name: phase + "/" + s.Name, path: s.Path, loader: s.Loader(), v1: s.Format == "cli-v1"}
}

// recoverAndCompare takes files (every session file under roots, mirrored, the daemon
// stopped): Pi dumps them, dirs are deleted, `pisync recover --all` rebuilds them, and
// every file must come back byte for byte, with a complete report, and read by Pi as
// the original was; `pisync verify` then agrees.
func recoverAndCompare(t *testing.T, sw *stopwatch, pi *pitest.Helper, url string, dirs, roots []string, files []piFile) {
	t.Helper()
	if got := sessionFiles(t, roots...); len(got) != len(files) {
		t.Fatalf("Pi wrote %d session files, the test knows %d: %v", len(got), len(files), got)
	}
	original := map[string][]byte{}
	loaders := map[string]string{}
	ids := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		original[f.path], loaders[f.path] = b, f.loader
		if ids[f.path], err = conversationID(bytes.SplitN(b, []byte("\n"), 2)[0]); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
	}
	want := pi.DumpMany(t, dumpRequests(loaders))
	sw.lap("Pi dumped the originals")
	for _, f := range files {
		if e := want[f.path].Error; e != "" {
			t.Fatalf("%s: Pi refuses the original: %s", f.name, e)
		}
	}

	for _, dir := range dirs {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	doc := recoverJSON(t, url, append([]string{"--all"}, rootArgs(roots...)...)...)
	sw.lap("recovered")
	if len(doc.Conversations) != len(files) {
		t.Errorf("recover --all rebuilt %d conversations, Pi wrote %d", len(doc.Conversations), len(files))
	}
	reports := doc.byConversation()
	got := pi.DumpMany(t, dumpRequests(loaders))
	sw.lap("Pi dumped the rebuilt files")

	for _, f := range files {
		t.Run(f.name, func(t *testing.T) {
			r, ok := reports[ids[f.path]]
			if !ok {
				t.Fatalf("no report for conversation %s", ids[f.path])
			}
			checkCompleteReport(t, r, f.path, original[f.path])
			rebuilt, err := os.ReadFile(f.path)
			if err != nil {
				t.Fatalf("not rebuilt: %v", err)
			}
			if !bytes.Equal(rebuilt, original[f.path]) {
				t.Errorf("rebuilt file is not byte-identical: %s", firstDifference(original[f.path], rebuilt))
			}
			res := got[f.path]
			if res.Error != "" {
				t.Fatalf("Pi refuses the rebuilt file: %s", res.Error)
			}
			wantRaw, gotRaw := want[f.path].Dump.Raw, res.Dump.Raw
			if f.v1 {
				wantRaw, gotRaw = normalize(t, wantRaw), normalize(t, gotRaw)
			}
			if diffs := pitest.DiffDumps(wantRaw, gotRaw); diffs != nil {
				t.Errorf("Pi (%s loader) reads the rebuilt file differently:\n%s", f.loader, strings.Join(diffs, "\n"))
			}
		})
	}

	verifyArgs := append([]string{"verify", "--nats", url, "--tenant", tenant, "--owner", owner, "--json"}, rootArgs(roots...)...)
	if out, errOut, code := pisync(t, verifyArgs...); code != 0 {
		var doc struct {
			Files []struct {
				Path   string          `json:"path"`
				Result string          `json:"result"`
				Drift  json.RawMessage `json:"drift"`
			} `json:"files"`
		}
		why := string(out)
		if json.Unmarshal(out, &doc) == nil {
			var bad []string
			for _, f := range doc.Files {
				if f.Result != "ok" {
					bad = append(bad, fmt.Sprintf("%s: %s %s", f.Path, f.Result, f.Drift))
				}
			}
			why = strings.Join(bad, "\n")
		}
		t.Errorf("pisync verify after recovery: exit %d, want 0\n%s\n%s", code, why, errOut)
	}
	sw.lap("verified")
}

// checkCompleteReport checks recovery's report on a conversation whose mirror is whole.
func checkCompleteReport(t *testing.T, r recovery.Report, path string, content []byte) {
	t.Helper()
	blobs := 0
	for _, l := range bytes.Split(bytes.TrimSuffix(content, []byte("\n")), []byte("\n")) {
		if len(l) > blobThreshold {
			blobs++
		}
	}
	switch {
	case r.Result != recovery.Written:
		t.Errorf("result %s (%s), want written", r.Result, r.Reason)
	case r.Output != path:
		t.Errorf("rebuilt at %s, want %s", r.Output, path)
	case !r.Complete || len(r.Missing) > 0:
		t.Errorf("mirror not complete: missing ordinals %v", r.Missing)
	case len(r.Placeholders) > 0 || r.HeaderSynthesized:
		t.Errorf("a complete mirror got %d placeholders, header synthesized %v", len(r.Placeholders), r.HeaderSynthesized)
	case r.Blobs != blobs:
		t.Errorf("%d lines went through the object store, the file has %d over %d bytes", r.Blobs, blobs, blobThreshold)
	}
}

func normalize(t *testing.T, raw []byte) []byte {
	t.Helper()
	n, err := pitest.NormalizeIDs(raw)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
