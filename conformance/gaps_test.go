package conformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/pitest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// gapCase removes chosen entries of one Pi-written session from the mirror.
type gapCase struct {
	name     string
	scenario string // the helper's scenario name
	copy     int    // which of the two scenario trees (each case needs a conversation of its own)
	// remove picks the entries to delete from the mirror, from Pi's dump of the original.
	remove func(t *testing.T, s pitest.Scenario, d *pitest.Dump) []string
	// dropped is how many messages of the original model context the rebuilt file lacks:
	// those of removed entries that were in it (0 when the removed entries lie before the
	// compaction that the context starts from).
	dropped int
	// samePath: the rebuilt file's walk from the leaf to the root passes the same ids as
	// the original's (true when each removed entry's parent was the line before it, which
	// is where recovery parents its placeholder).
	samePath bool
	// headerSynthesized: the header line is removed, so recovery makes one up from the
	// conversation id, the earliest timestamp and the recorded cwd.
	headerSynthesized bool
}

var gapCases = []gapCase{
	{name: "inner message", scenario: "harness-basic", remove: pick(toolResult("call_1")), dropped: 1, samePath: true},
	{name: "inner message, CLI", scenario: "cli-basic", remove: pick(toolResult("call_g")), dropped: 0, samePath: true},
	{name: "two adjacent entries", scenario: "harness-basic", copy: 1, remove: pick(toolResult("call_2"), nextAfter(toolResult("call_2"))), dropped: 2},
	{name: "branch point at the root", scenario: "harness-branching", remove: pick(branchPoint(firstMessage)), dropped: 1, samePath: true},
	{name: "branch point, CLI", scenario: "cli-basic", copy: 1, remove: pick(branchPoint(messageText("Find TODOs in the repo."))), dropped: 0, samePath: true},
	{name: "leaf target", scenario: "harness-branching", copy: 1, remove: pick(lastLeafTarget), dropped: 1, samePath: true},
	{name: "leaf target, then appended to", scenario: "harness-fork-full", remove: pick(lastLeafTarget), dropped: 1, samePath: true},
	{name: "first kept entry of an earlier compaction", scenario: "harness-compaction", remove: pick(firstKept(0)), dropped: 0, samePath: true},
	{name: "first kept entry of the latest compaction", scenario: "harness-fork-after-compaction", remove: pick(firstKept(0)), dropped: 1, samePath: true},
	{name: "first kept entry of a compaction, CLI", scenario: "cli-fork-from", remove: pick(firstKept(0)), dropped: 1, samePath: true},
	{name: "blob line", scenario: "harness-image", remove: pick(messageRole("user")), dropped: 1, samePath: true},
	// A navigation record that nothing names: the tree and the final leaf stay as they were.
	{name: "leaf record", scenario: "harness-fork-full", copy: 1, remove: pick(where("a leaf entry", isLeaf)), dropped: 0, samePath: true},
	{name: "header", scenario: "harness-compaction", copy: 1, remove: pick(headerLine), dropped: 0, samePath: true, headerSynthesized: true},
}

// No case removes the entry that the mirrored head names without a placeholder taking
// its id (that would need --force): a removed leaf target comes back as a placeholder
// with exactly its id, so the computed leaf is still the head.

// TestGaps: Pi writes two trees of scenario sessions, the daemon mirrors them, chosen
// entries are deleted from the stream (the heads keep naming the original leaves), and
// `pisync recover --out` rebuilds the damaged conversations. For each, Pi must open the
// rebuilt file; every placeholder is a `custom` entry of type pisync.placeholder carrying
// exactly a missing id that some entry names; no placeholder reaches the model context,
// which is the original's without the removed messages; the other entries are Pi's
// original ones, in order; and the leaf is the original leaf, from which the active
// branch still reaches a root.
func TestGaps(t *testing.T) {
	t.Parallel()
	sw := newStopwatch(t)
	pi := pitest.New(t)
	srv := natstest.Run(t)
	base := t.TempDir()
	var roots []string
	trees := make([]map[string]pitest.Scenario, 2)
	for i := range trees {
		dir := filepath.Join(base, fmt.Sprintf("tree%d", i))
		roots = append(roots, filepath.Join(dir, "harness"), filepath.Join(dir, "cli", "sessions"))
		trees[i] = map[string]pitest.Scenario{}
		for _, s := range pi.WriteScenarios(t, dir) {
			trees[i][s.Name] = s
		}
	}
	sw.lap("Pi wrote two trees")
	d := startDaemon(t, srv.URL(), filepath.Join(base, "state"), roots...)
	mc := newMirrorClient(t, srv.URL())
	mc.waitMirrored(t, roots...)
	d.stop(t)
	sw.lap("mirrored")

	type prepared struct {
		s        pitest.Scenario
		orig     *pitest.Dump
		removed  map[string]int64 // entry id → ordinal
		expected []string         // ids that must get a placeholder
	}
	loaders := map[string]string{}
	for _, c := range gapCases {
		s := trees[c.copy][c.scenario]
		if _, dup := loaders[s.Path]; dup {
			t.Fatalf("case %q: %s copy %d is used by two cases", c.name, c.scenario, c.copy)
		}
		loaders[s.Path] = s.Loader()
	}
	// A version-1 file has no entry ids, so a lost line gets no placeholder by id; yet its
	// compaction names the first kept entry by line index (see TestGaps/v1...).
	v1 := trees[0]["cli-v1"]
	loaders[v1.Path] = v1.Loader()
	originals := pi.DumpMany(t, dumpRequests(loaders))
	sw.lap("Pi dumped the originals")
	prep := make([]prepared, len(gapCases))
	args := []string{"--out", filepath.Join(base, "out")}
	for i, c := range gapCases {
		s := trees[c.copy][c.scenario]
		res := originals[s.Path]
		if res.Error != "" {
			t.Fatalf("case %q: Pi refuses the original: %s", c.name, res.Error)
		}
		ids := c.remove(t, s, res.Dump)
		prep[i] = prepared{s: s, orig: res.Dump, removed: mc.deleteEntries(t, s.ConversationID, ids),
			expected: namedBySurvivors(res.Dump, ids)}
		args = append(args, "--conversation", s.ConversationID)
	}
	if role := lineRole(t, v1.Path, v1LostLine); role != "toolResult" {
		t.Fatalf("cli-v1 line %d is a %q message, the case expects the tool result", v1LostLine, role)
	}
	mc.deleteEntries(t, v1.ConversationID, []string{mirror.OrdinalID(v1LostLine)})
	args = append(args, "--conversation", v1.ConversationID)
	doc := recoverJSON(t, srv.URL(), args...)
	reports := doc.byConversation()
	sw.lap("removed entries, recovered")
	rebuilt := map[string]string{}
	for i, p := range prep {
		r, ok := reports[p.s.ConversationID]
		if !ok {
			t.Fatalf("case %q: no report for %s", gapCases[i].name, p.s.ConversationID)
		}
		rebuilt[r.Output] = p.s.Loader()
	}
	rebuilt[reports[v1.ConversationID].Output] = v1.Loader()
	dumps := pi.DumpMany(t, dumpRequests(rebuilt))
	sw.lap("Pi dumped the rebuilt files")

	for i, c := range gapCases {
		p := prep[i]
		t.Run(c.name, func(t *testing.T) {
			r := reports[p.s.ConversationID]
			t.Logf("%s (%s): removed %v; placeholders %+v", c.scenario, p.s.Path, p.removed, r.Placeholders)
			checkGapReport(t, c, r, p.orig, p.removed, p.expected)
			res := dumps[r.Output]
			if res.Error != "" {
				t.Fatalf("Pi refuses the rebuilt file: %s", res.Error)
			}
			checkGapDump(t, c, p.orig, res.Dump, p.removed, p.expected)
		})
	}

	t.Run("v1 line before a compaction", func(t *testing.T) {
		r := reports[v1.ConversationID]
		if r.Result != recovery.Written || r.Complete {
			t.Fatalf("result %s (%s), complete %v; want written, incomplete", r.Result, r.Reason, r.Complete)
		}
		res := dumps[r.Output]
		if res.Error != "" {
			t.Fatalf("Pi refuses the rebuilt file: %s", res.Error)
		}
		// The lost line (a tool result) precedes the compaction, so it was not in the
		// model context: the context must be the original's, message for message.
		orig := originals[v1.Path].Dump
		var problems []string
		if idx := res.Dump.Context.MessagesMentioning(pitest.Placeholder); len(idx) > 0 {
			problems = append(problems, fmt.Sprintf("context messages %v come from a placeholder", idx))
		}
		if !bytes.Equal(mustJSON(res.Dump.Context.Messages), mustJSON(orig.Context.Messages)) {
			problems = append(problems, pitest.DiffDumps(mustJSON(map[string]any{"context": orig.Context}),
				mustJSON(map[string]any{"context": res.Dump.Context}))...)
		}
		if len(problems) > 0 {
			t.Errorf("Pi reads the rebuilt v1 file with another model context:\n%s", strings.Join(problems, "\n"))
		}
	})
}

// v1LostLine is the line (ordinal, header = 0) of the helper's v1 file that the v1 gap
// case removes: the first tool result, before the compaction (firstKeptEntryIndex 7).
const v1LostLine = 3

// lineRole is the message role of a file's line (ordinal, header = 0).
func lineRole(t *testing.T, path string, ordinal int) string {
	t.Helper()
	var e struct {
		Message struct {
			Role string `json:"role"`
		} `json:"message"`
	}
	if err := json.Unmarshal(readLines(t, path)[ordinal], &e); err != nil {
		t.Fatal(err)
	}
	return e.Message.Role
}

// checkGapReport checks recovery's report: written, incomplete exactly at the removed
// ordinals, a placeholder for each expected id, and the original leaf.
func checkGapReport(t *testing.T, c gapCase, r recovery.Report, orig *pitest.Dump, removed map[string]int64, expected []string) {
	t.Helper()
	if r.Result != recovery.Written {
		t.Fatalf("result %s (%s), want written", r.Result, r.Reason)
	}
	if r.HeaderSynthesized != c.headerSynthesized {
		t.Errorf("header synthesized: %v, want %v", r.HeaderSynthesized, c.headerSynthesized)
	}
	var wantMissing, gotMissing []int64
	for _, o := range removed {
		wantMissing = append(wantMissing, o)
	}
	for _, m := range r.Missing {
		for o := m.First; o <= m.Last; o++ {
			gotMissing = append(gotMissing, o)
		}
	}
	slices.Sort(wantMissing)
	if r.Complete || !slices.Equal(gotMissing, wantMissing) {
		t.Errorf("report: complete %v, missing ordinals %v; want incomplete, missing %v", r.Complete, gotMissing, wantMissing)
	}
	var got []string
	for _, ph := range r.Placeholders {
		got = append(got, ph.ID)
	}
	sort.Strings(got)
	if !slices.Equal(got, expected) {
		t.Errorf("placeholders for %v, want exactly the removed ids that remaining entries name: %v", got, expected)
	}
	if r.Leaf != orig.Leaf() || r.HeadCheck != "ok" {
		t.Errorf("report: leaf %q, head check %q; want Pi's original leaf %q and head check ok", r.Leaf, r.HeadCheck, orig.Leaf())
	}
}

// checkGapDump checks how Pi reads the rebuilt file against how it read the original.
func checkGapDump(t *testing.T, c gapCase, orig, got *pitest.Dump, removed map[string]int64, expected []string) {
	t.Helper()
	// Placeholders: custom entries of pisync's type, with exactly the expected ids.
	var placeholders []string
	for _, e := range got.Entries {
		if e.IsPlaceholder() {
			placeholders = append(placeholders, e.ID)
		}
	}
	sort.Strings(placeholders)
	if !slices.Equal(placeholders, expected) {
		t.Errorf("Pi sees placeholders %v, want %v", placeholders, expected)
	}
	for _, id := range expected {
		if e := got.Entry(id); e == nil || !e.IsPlaceholder() {
			t.Errorf("entry %s is not a custom %s entry: %s", id, pitest.Placeholder, entryRaw(e))
		}
	}

	// Every other entry is Pi's original, in the original order.
	var want, have []string
	for _, e := range orig.Entries {
		if _, gone := removed[e.ID]; !gone {
			want = append(want, string(e.Raw))
		}
	}
	for _, e := range got.Entries {
		if !e.IsPlaceholder() {
			have = append(have, string(e.Raw))
		}
	}
	if !slices.Equal(have, want) {
		t.Errorf("entries other than placeholders differ from the original's without the removed ones (%d vs %d entries)", len(have), len(want))
	}
	if c.headerSynthesized {
		// Made up from what the mirror knows: the same conversation and cwd.
		for _, k := range []string{"type", "version", "id", "cwd"} {
			if got.Header[k] != orig.Header[k] {
				t.Errorf("synthesized header: %s %v, want %v", k, got.Header[k], orig.Header[k])
			}
		}
	} else if !bytes.Equal(mustJSON(got.Header), mustJSON(orig.Header)) {
		t.Errorf("header %s, want %s", mustJSON(got.Header), mustJSON(orig.Header))
	}

	// The model context: no placeholder in it, nothing new, and only the removed
	// messages missing.
	if idx := got.Context.MessagesMentioning(pitest.Placeholder); len(idx) > 0 {
		t.Errorf("context messages %v come from a placeholder", idx)
	}
	for _, id := range expected {
		if idx := got.Context.MessagesMentioning(`"` + id + `"`); len(idx) > 0 {
			t.Errorf("context messages %v mention placeholder %s", idx, id)
		}
	}
	if !isSubsequence(got.Context.Messages, orig.Context.Messages) {
		t.Errorf("context holds messages the original's has not (or in another order)")
	}
	if n := len(orig.Context.Messages) - len(got.Context.Messages); n != c.dropped {
		t.Errorf("context lost %d messages (%d → %d), want %d: the removed ones", n, len(orig.Context.Messages), len(got.Context.Messages), c.dropped)
	}
	for _, f := range []struct {
		name      string
		want, got json.RawMessage
	}{
		{"model", orig.Context.Model, got.Context.Model},
		{"thinkingLevel", orig.Context.ThinkingLevel, got.Context.ThinkingLevel},
		{"activeTools", orig.Context.ActiveTools, got.Context.ActiveTools},
	} {
		if !bytes.Equal(f.want, f.got) {
			t.Errorf("context %s %s, want %s", f.name, f.got, f.want)
		}
	}

	// The active branch: the original leaf, and from it a walk that reaches a root.
	if got.Leaf() != orig.Leaf() {
		t.Errorf("Pi's leaf %q, want the original %q", got.Leaf(), orig.Leaf())
	}
	switch {
	case got.DanglingParentID != nil:
		t.Errorf("the walk from the leaf stops at missing parent %s: %v", *got.DanglingParentID, got.RootPath)
	case len(got.RootPath) == 0 || got.RootPath[len(got.RootPath)-1] != got.Leaf():
		t.Errorf("root path %v does not end at the leaf %s", got.RootPath, got.Leaf())
	case got.Entry(got.RootPath[0]).ParentID != nil:
		t.Errorf("root path %v starts at %s, whose parent is %s", got.RootPath, got.RootPath[0], *got.Entry(got.RootPath[0]).ParentID)
	}
	if c.samePath && !slices.Equal(got.RootPath, orig.RootPath) {
		t.Errorf("root path %v, want the original %v", got.RootPath, orig.RootPath)
	}
	if n := len(got.Branch); n == 0 || got.Branch[n-1] != got.Leaf() {
		t.Errorf("branch %v does not end at the leaf", got.Branch)
	}
}

// namedBySurvivors lists, sorted, the removed ids that a remaining entry names as its
// parentId, or as the targetId of a `leaf` entry: recovery must make a placeholder for
// exactly these (DESIGN §4).
func namedBySurvivors(d *pitest.Dump, removed []string) []string {
	gone := map[string]bool{}
	for _, id := range removed {
		gone[id] = true
	}
	named := map[string]bool{}
	for _, e := range d.Entries {
		if gone[e.ID] {
			continue
		}
		if e.ParentID != nil && gone[*e.ParentID] {
			named[*e.ParentID] = true
		}
		if e.Type == "leaf" && e.TargetID != nil && gone[*e.TargetID] {
			named[*e.TargetID] = true
		}
	}
	var out []string
	for id := range named {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// isSubsequence reports whether sub's items appear in seq in order.
func isSubsequence(sub, seq []json.RawMessage) bool {
	i := 0
	for _, m := range seq {
		if i < len(sub) && bytes.Equal(sub[i], m) {
			i++
		}
	}
	return i == len(sub)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func entryRaw(e *pitest.Entry) string {
	if e == nil {
		return "(absent)"
	}
	return string(e.Raw)
}

// Entry pickers. Each finds one entry in Pi's dump of the original, or fails the test.

type picker func(t *testing.T, s pitest.Scenario, d *pitest.Dump) string

func pick(ps ...picker) func(*testing.T, pitest.Scenario, *pitest.Dump) []string {
	return func(t *testing.T, s pitest.Scenario, d *pitest.Dump) []string {
		t.Helper()
		var ids []string
		for _, p := range ps {
			ids = append(ids, p(t, s, d))
		}
		return ids
	}
}

// where returns the first entry whose decoded JSON satisfies ok.
func where(what string, ok func(e map[string]any) bool) picker {
	return func(t *testing.T, s pitest.Scenario, d *pitest.Dump) string {
		t.Helper()
		for _, e := range d.Entries {
			var m map[string]any
			if err := json.Unmarshal(e.Raw, &m); err != nil {
				t.Fatal(err)
			}
			if ok(m) {
				return e.ID
			}
		}
		t.Fatalf("%s: no entry is %s", s.Name, what)
		return ""
	}
}

func message(m map[string]any) map[string]any {
	if m["type"] != "message" {
		return nil
	}
	msg, _ := m["message"].(map[string]any)
	return msg
}

func toolResult(callID string) picker {
	return where("the tool result of "+callID, func(m map[string]any) bool {
		msg := message(m)
		return msg != nil && msg["role"] == "toolResult" && msg["toolCallId"] == callID
	})
}

func messageRole(role string) picker {
	return where("a "+role+" message", func(m map[string]any) bool {
		msg := message(m)
		return msg != nil && msg["role"] == role
	})
}

func messageText(text string) picker {
	return where("a message saying "+text, func(m map[string]any) bool {
		msg := message(m)
		if msg == nil {
			return false
		}
		b, _ := json.Marshal(msg["content"])
		return strings.Contains(string(b), text)
	})
}

// firstKept is the entry that the n-th compaction (from 0, in file order) keeps first.
func firstKept(n int) picker {
	return func(t *testing.T, s pitest.Scenario, d *pitest.Dump) string {
		t.Helper()
		i := 0
		for _, e := range d.Entries {
			var m map[string]any
			if err := json.Unmarshal(e.Raw, &m); err != nil {
				t.Fatal(err)
			}
			if id, ok := m["firstKeptEntryId"].(string); ok && m["type"] == "compaction" {
				if i == n {
					return id
				}
				i++
			}
		}
		t.Fatalf("%s: no compaction %d with a first kept entry", s.Name, n)
		return ""
	}
}

func isLeaf(m map[string]any) bool { return m["type"] == "leaf" }

// headerLine is the entry id under which the mirror keeps line 1, the header.
func headerLine(*testing.T, pitest.Scenario, *pitest.Dump) string { return mirror.HeaderEntryType }

// firstMessage is the helper's record of the branching scenario's first user message.
func firstMessage(t *testing.T, s pitest.Scenario, _ *pitest.Dump) string {
	t.Helper()
	if s.FirstMessageID == "" {
		t.Fatalf("%s: the manifest names no first message", s.Name)
	}
	return s.FirstMessageID
}

// branchPoint requires that the picked entry has at least two children.
func branchPoint(p picker) picker {
	return func(t *testing.T, s pitest.Scenario, d *pitest.Dump) string {
		t.Helper()
		id := p(t, s, d)
		children := 0
		for _, e := range d.Entries {
			if e.ParentID != nil && *e.ParentID == id && e.Type != "leaf" && e.Type != "label" {
				children++
			}
		}
		if children < 2 {
			t.Fatalf("%s: entry %s has %d children, not a branch point", s.Name, id, children)
		}
		return id
	}
}

// lastLeafTarget is the targetId of the file's last `leaf` entry.
func lastLeafTarget(t *testing.T, s pitest.Scenario, d *pitest.Dump) string {
	t.Helper()
	for i := len(d.Entries) - 1; i >= 0; i-- {
		if e := d.Entries[i]; e.Type == "leaf" && e.TargetID != nil {
			return *e.TargetID
		}
	}
	t.Fatalf("%s: no leaf entry with a target", s.Name)
	return ""
}

// nextAfter is the entry that follows the picked one in file order.
func nextAfter(p picker) picker {
	return func(t *testing.T, s pitest.Scenario, d *pitest.Dump) string {
		t.Helper()
		id := p(t, s, d)
		for i, e := range d.Entries {
			if e.ID == id && i+1 < len(d.Entries) {
				return d.Entries[i+1].ID
			}
		}
		t.Fatalf("%s: nothing follows %s", s.Name, id)
		return ""
	}
}
