package conformance

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/pitest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// TestDisasters: Pi writes its sessions, and the test damages them the way Pi's and
// oh-my-pi's bug reports say they are damaged in the field:
//   - headerless: the file recreated without its header line (Pi #8939): every line but
//     the header;
//   - title-first: oh-my-pi's title record written before the header (Pi #8880);
//   - overwritten: a fresh header written over the mirrored session in place while the
//     daemon runs (Pi #6002, oh-my-pi #9915).
//
// The tree is then lost. `pisync recover --all --root` restores the title-first file
// byte for byte, the headerless one with a header in front of every line it had (Pi
// opens it and reads every entry the original had, on the same leaf), and refuses the
// overwritten one, listing its generations, exit 1; `--generation 1` restores it byte
// for byte and Pi's reading of it equals the original's.
func TestDisasters(t *testing.T) {
	t.Parallel()
	pi := pitest.New(t)
	pisyncBinary(t)
	srv := natstest.Run(t)
	base := t.TempDir()
	root := filepath.Join(base, "harness")
	cliRoot := filepath.Join(base, "cli", "sessions")
	scenarios := pi.WriteScenarios(t, base)
	byName := map[string]pitest.Scenario{}
	for _, s := range scenarios {
		byName[s.Name] = s
	}
	headerless, titled, overwritten := byName["harness-basic"], byName["harness-branching"], byName["harness-compaction"]
	edited := byName["cli-basic"] // Pi 1.6 appends a context_edit entry to it: no rewrite, no shrink
	for _, s := range []pitest.Scenario{headerless, titled, overwritten} {
		if s.Path == "" || s.API != "harness" || !strings.HasPrefix(s.Path, root+string(filepath.Separator)) {
			t.Fatalf("the helper's scenarios changed: %+v", s)
		}
	}
	original := map[string][]byte{}
	for _, s := range []pitest.Scenario{headerless, titled, overwritten} {
		b, err := os.ReadFile(s.Path)
		if err != nil {
			t.Fatal(err)
		}
		original[s.Path] = b
	}
	want := pi.DumpMany(t, []pitest.DumpRequest{{Path: headerless.Path, Loader: "harness"}, {Path: overwritten.Path, Loader: "harness"}})

	// Damaged before the daemon first sees them.
	_, rest, _ := bytes.Cut(original[headerless.Path], []byte("\n"))
	writeFile(t, headerless.Path, rest)
	title := `{"type":"title","v":1,"title":"compare the branches","source":"auto","updatedAt":"2026-12-05T14:00:00.000Z","pad":"          "}` + "\n"
	writeFile(t, titled.Path, append([]byte(title), original[titled.Path]...))
	titledBytes := append([]byte(title), original[titled.Path]...)

	if edited.SessionsRoot != cliRoot || !strings.Contains(string(mustRead(t, edited.Path)), `"type":"context_edit"`) {
		t.Fatalf("the helper's cli-basic scenario changed: %+v", edited)
	}
	d := startDaemon(t, srv.URL(), filepath.Join(base, "state"), root, cliRoot)
	mc := newMirrorClient(t, srv.URL())
	mc.waitMirrored(t, root, cliRoot)
	// Overwritten in place by a fresh header, as SessionManager.open does with a file it
	// cannot parse.
	hdr, _, _ := bytes.Cut(original[overwritten.Path], []byte("\n"))
	writeFile(t, overwritten.Path, append(hdr, '\n'))
	mc.waitMirrored(t, root, cliRoot)
	d.stop(t)

	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := pisync(t, "recover", "--nats", srv.URL(), "--tenant", tenant, "--owner", owner, "--json", "--all",
		"--root", root, "--root", cliRoot)
	var doc recoverDoc
	if err := json.Unmarshal(out, &doc); err != nil || code != 1 {
		t.Fatalf("recover --all: exit %d (want 1: one refused), %v\n%s\n%s", code, err, out, errOut)
	}
	reports := doc.byConversation()
	if r := reports[overwritten.ConversationID]; r.Result != recovery.Refused || !strings.Contains(r.Reason, recovery.ErrShrunk.Error()) ||
		len(r.History) != 2 || r.History[1].Shrunk == nil || r.History[1].Shrunk.Reason != mirror.ShrinkHeaderOnly {
		t.Errorf("overwritten session: %s: %s (history %+v)", r.Result, r.Reason, r.History)
	}
	for _, s := range scenarios {
		want := map[string]recovery.Result{root: recovery.Written, cliRoot: recovery.Unchanged}[s.SessionsRoot]
		if want == "" || s.ConversationID == overwritten.ConversationID {
			continue
		}
		if r := reports[s.ConversationID]; r.Result != want {
			t.Errorf("%s: %s: %s", s.Name, r.Result, r.Reason)
		}
	}
	if r := reports[edited.ConversationID]; len(r.Generations) != 1 || r.History != nil {
		t.Errorf("the session Pi edited with context_edit: generations %v, history %+v", r.Generations, r.History)
	}
	if got, err := os.ReadFile(titled.Path); err != nil || !bytes.Equal(got, titledBytes) {
		t.Errorf("title-first file not rebuilt byte for byte (%v)", err)
	}
	got, err := os.ReadFile(headerless.Path)
	if err != nil {
		t.Fatal(err)
	}
	if _, after, _ := bytes.Cut(got, []byte("\n")); !bytes.Equal(after, rest) {
		t.Errorf("the headerless file's lines are not kept byte for byte after the synthesized header")
	}
	if r := reports[headerless.ConversationID]; !r.HeaderSynthesized {
		t.Errorf("headerless: report %+v", r)
	}

	// The last good generation of the overwritten session, asked for by number.
	recoverJSON(t, srv.URL(), "--conversation", overwritten.ConversationID, "--generation", "1", "--root", root)
	if got, err := os.ReadFile(overwritten.Path); err != nil || !bytes.Equal(got, original[overwritten.Path]) {
		t.Errorf("--generation 1 does not restore the overwritten session byte for byte (%v)", err)
	}

	gotDumps := pi.DumpMany(t, []pitest.DumpRequest{{Path: headerless.Path, Loader: "harness"}, {Path: overwritten.Path, Loader: "harness"}})
	if g := gotDumps[overwritten.Path]; g.Error != "" || !bytes.Equal(g.Dump.Raw, want[overwritten.Path].Dump.Raw) {
		t.Errorf("Pi reads the restored session otherwise than the original (%s)", g.Error)
	}
	g, w := gotDumps[headerless.Path], want[headerless.Path]
	if g.Error != "" {
		t.Fatalf("Pi refuses the recovered headerless file: %s", g.Error)
	}
	if !sameEntries(g.Dump.Entries, w.Dump.Entries) || *g.Dump.LeafID != *w.Dump.LeafID {
		t.Errorf("Pi reads %d entries on leaf %v from the recovered headerless file; the original had %d on %v",
			len(g.Dump.Entries), *g.Dump.LeafID, len(w.Dump.Entries), *w.Dump.LeafID)
	}
}

// sameEntries compares entries by their bytes as Pi gives them back.
func sameEntries(a, b []pitest.Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		ja, _ := json.Marshal(a[i])
		jb, _ := json.Marshal(b[i])
		if !bytes.Equal(ja, jb) {
			return false
		}
	}
	return true
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
