package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/pitest"
	"github.com/pisync/pisync/mirror"
)

// storeSetup is what every store test needs: the package's script, pisync built, and a
// JetStream server.
func storeSetup(t *testing.T) (*pitest.Helper, *natstest.Server) {
	t.Helper()
	ps := pitest.NewStoreScript(t)
	pisyncBinary(t)
	return ps, natstest.Run(t)
}

// storeArgs are pistore's flags for the store of the test owner at url.
func storeArgs(url string) []string {
	return []string{"--servers", url, "--tenant", tenant, "--owner", owner}
}

// TestStoreMatchesJSONL drives Pi's own Session through one scripted history — tool calls
// and results, model and thinking changes, branching with `leaf` records and a branch
// summary, two compactions, labels set and cleared, a session name, `custom` and
// `custom_message` entries, an image above 1 MiB, forks at, before and without an entry,
// a delete — once on Pi's JsonlSessionRepo and once on NatsSessionRepo through
// `pisync serve`, with the same ids and clock (see pistore.mjs). Every SessionStorage read
// and buildContext() must be equal, live and after reopening; and `pisync recover` of the
// store-born conversations must write the files Pi's JSONL backend wrote, byte for byte.
func TestStoreMatchesJSONL(t *testing.T) {
	t.Parallel()
	ps, srv := storeSetup(t)
	startServe(t, srv.URL())
	base := t.TempDir()
	// Both runs name the same sessions root, so that a fork's parentSession (the source's
	// path) is the same string; only the JSONL run writes there.
	root := filepath.Join(base, "sessions")

	var jsonl, store map[string]any
	ps.JSON(t, &jsonl, "history", "--backend", "jsonl", "--root", root)
	ps.JSON(t, &store, append([]string{"history", "--backend", "nats", "--root", root}, storeArgs(srv.URL())...)...)

	for _, view := range []string{"sessions", "reopened"} {
		js, ss := jsonl[view].(map[string]any), store[view].(map[string]any)
		if len(js) != 5 || !sameKeys(js, ss) {
			t.Fatalf("%s: JSONL has sessions %v, the store %v", view, keys(js), keys(ss))
		}
		for name, jd := range js {
			jd, sd := jd.(map[string]any), ss[name].(map[string]any)
			if !sameKeys(jd, sd) {
				t.Fatalf("%s/%s: JSONL dump has %v, the store's %v", view, name, keys(jd), keys(sd))
			}
			for field := range jd {
				if d := firstDiff(jd[field], sd[field], field); d != "" {
					t.Errorf("%s/%s: %s", view, name, d)
				}
			}
		}
	}
	for _, field := range []string{"list", "reopenDeleted", "files"} {
		if d := firstDiff(jsonl[field], store[field], field); d != "" {
			t.Errorf("%s", d)
		}
	}
	if jsonl["reopenDeleted"] != "not_found" {
		t.Errorf("opening a deleted session: %v, want not_found", jsonl["reopenDeleted"])
	}
	if t.Failed() {
		return
	}

	out := filepath.Join(base, "recovered")
	doc := recoverJSON(t, srv.URL(), "--all", "--out", out)
	if len(doc.Conversations) != 5 {
		t.Errorf("recover wrote %d conversations, want the 5 not deleted", len(doc.Conversations))
	}
	want, got := relFiles(t, root), relFiles(t, out)
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("recover wrote %v, JSONL %v", got, want)
	}
	for _, rel := range want {
		a, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(out, rel))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s: the recovered file (%d bytes) is not the JSONL backend's (%d bytes): %s", rel, len(b), len(a), lineDiff(a, b))
		}
	}
}

// TestStoreOpensMirroredSession: a session Pi wrote to a local file and `pisync run`
// mirrored opens through NatsSessionRepo with the reads and context Pi's JSONL storage
// gives for the file, and continues there: the appended entries follow the file's leaf,
// and `pisync recover` writes the file's bytes followed by them.
func TestStoreOpensMirroredSession(t *testing.T) {
	t.Parallel()
	pi := pitest.New(t)
	ps := pitest.NewStoreScript(t)
	pisyncBinary(t)
	srv := natstest.Run(t)
	base := t.TempDir()
	root := filepath.Join(base, "sessions")
	ev := pi.StartLive(t, root, pitest.LiveOptions{Count: 6, Cwd: "/home/dev/mirrored"}).Wait(t)
	path, id := ev[0].Path, ev[0].ConversationID
	d := startDaemon(t, srv.URL(), filepath.Join(base, "state"), root)
	newMirrorClient(t, srv.URL()).waitMirrored(t, root)
	d.stop(t)
	startServe(t, srv.URL())

	var local map[string]any
	ps.JSON(t, &local, "dump-jsonl", "--path", path)
	var opened struct {
		Before   map[string]any `json:"before"`
		After    map[string]any `json:"after"`
		Appended []string       `json:"appended"`
	}
	ps.JSON(t, &opened, append([]string{"open-nats", "--id", id, "--append", "2"}, storeArgs(srv.URL())...)...)
	for field := range local {
		if field == "meta" {
			continue // the store's path is relative to the root, the file's absolute
		}
		if d := firstDiff(local[field], opened.Before[field], field); d != "" {
			t.Errorf("opened through the store: %s", d)
		}
	}
	if d := firstDiff(dropKeys(local["meta"], "path"), dropKeys(opened.Before["meta"], "path"), "meta"); d != "" {
		t.Errorf("opened through the store: %s", d)
	}
	entries := opened.After["entries"].([]any)
	if len(entries) != 6+2 || len(opened.Appended) != 2 {
		t.Fatalf("after continuing: %d entries, %d appended; want 8 and 2", len(entries), len(opened.Appended))
	}
	parent := local["leafId"]
	for i, e := range entries[6:] {
		e := e.(map[string]any)
		if e["id"] != opened.Appended[i] || e["parentId"] != parent {
			t.Errorf("appended entry %d: id %v parent %v, want %v on %v", i, e["id"], e["parentId"], opened.Appended[i], parent)
		}
		parent = e["id"]
	}
	if opened.After["leafId"] != opened.Appended[1] {
		t.Errorf("leaf after continuing %v, want %v", opened.After["leafId"], opened.Appended[1])
	}

	out := filepath.Join(base, "recovered")
	recoverJSON(t, srv.URL(), "--conversation", id, "--out", out)
	files := relFiles(t, out)
	if len(files) != 1 {
		t.Fatalf("recover wrote %v", files)
	}
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rebuilt, err := os.ReadFile(filepath.Join(out, files[0]))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(rebuilt, orig) || bytes.Count(rebuilt[len(orig):], []byte("\n")) != 2 {
		t.Errorf("the recovered file is not the local file plus the 2 lines appended through the store: %s", lineDiff(orig, rebuilt))
	}
}

// TestStoreTwoRuntimesRace: two runtimes open one session through two replicas of serve and
// append on the same head at once. Exactly one append succeeds; the other gets conflict
// with the winner as head, its local index stays where it was, it refuses to append again
// on that stale view, and once reopened it continues from the head.
func TestStoreTwoRuntimesRace(t *testing.T) {
	t.Parallel()
	ps, srv := storeSetup(t)
	startServe(t, srv.URL())
	startServe(t, srv.URL())
	for round := 0; round < 3; round++ {
		var r struct {
			Root    string `json:"root"`
			Outcome []struct {
				Status     string  `json:"status"`
				ID         string  `json:"id"`
				Conflict   bool    `json:"conflict"`
				Head       *string `json:"head"`
				LocalLeaf  string  `json:"localLeaf"`
				LocalCount int     `json:"localEntries"`
			} `json:"outcome"`
			RetryStale string   `json:"retryStale"`
			Continued  string   `json:"continued"`
			Entries    []string `json:"entries"`
			Head       string   `json:"head"`
		}
		id := fmt.Sprintf("019ad000-0000-7000-8000-0000000010%02d", round)
		ps.JSON(t, &r, append([]string{"race", "--id", id}, storeArgs(srv.URL())...)...)
		won, lost := -1, -1
		for i, o := range r.Outcome {
			if o.Status == "fulfilled" {
				won = i
			} else {
				lost = i
			}
		}
		if won < 0 || lost < 0 {
			t.Fatalf("round %d: want one append to win and one to lose: %+v", round, r.Outcome)
		}
		w, l := r.Outcome[won], r.Outcome[lost]
		if !l.Conflict || l.Head == nil || *l.Head != w.ID {
			t.Errorf("round %d: the loser got %+v, want a conflict with head %s", round, l, w.ID)
		}
		if l.LocalLeaf != r.Root || l.LocalCount != 1 {
			t.Errorf("round %d: the loser's index moved: leaf %s with %d entries, want %s with 1", round, l.LocalLeaf, l.LocalCount, r.Root)
		}
		if r.RetryStale != "conflict" {
			t.Errorf("round %d: appending again on the stale view: %s, want conflict", round, r.RetryStale)
		}
		if want := []string{r.Root, w.ID, r.Continued}; !reflect.DeepEqual(r.Entries, want) || r.Head != r.Continued {
			t.Errorf("round %d: the session holds %v (head %s), want %v", round, r.Entries, r.Head, want)
		} else if got := streamEntryIDs(t, srv.URL(), id); !reflect.DeepEqual(got, want) {
			t.Errorf("round %d: the stream holds %v, want %v", round, got, want)
		}
	}
}

// TestStoreServeKilledMidAppend: a runtime appends 60 messages one after the other while
// serve is SIGKILLed three times and restarted; the client retries each unanswered append
// with the same bytes. Every acknowledged entry is in the session, once, in order, and
// nothing else is.
func TestStoreServeKilledMidAppend(t *testing.T) {
	t.Parallel()
	ps, srv := storeSetup(t)
	sv := startServe(t, srv.URL())
	const count = 60
	args := append([]string{ps.Script, "appender", "--id", "019ad000-0000-7000-8000-000000002000", "--count", fmt.Sprint(count),
		"--timeoutMs", "1000", "--attempts", "60"}, storeArgs(srv.URL())...)
	cmd := exec.Command(ps.Node, args...)
	var stderr daemontest.Output
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var acked []string
	var final struct {
		Done    bool     `json:"done"`
		Entries []string `json:"entries"`
		Head    string   `json:"head"`
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ack struct {
			N  int    `json:"n"`
			ID string `json:"id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ack); err != nil {
			t.Fatalf("appender printed %q: %v", sc.Text(), err)
		}
		if ack.N == 0 {
			if err := json.Unmarshal(sc.Bytes(), &final); err != nil {
				t.Fatal(err)
			}
			break
		}
		acked = append(acked, ack.ID)
		if ack.N%15 == 0 && ack.N < count {
			sv.Kill() // the next append is sent to no one, or to a serve about to die
			sv = startServe(t, srv.URL())
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("appender: %v\n%s", err, stderr.String())
	}
	if !final.Done || len(acked) != count {
		t.Fatalf("appender acknowledged %d of %d appends, done=%v\n%s", len(acked), count, final.Done, stderr.String())
	}
	if !reflect.DeepEqual(final.Entries, acked) || final.Head != acked[count-1] {
		t.Errorf("the session holds %d entries %v (head %s), want exactly the %d acknowledged %v", len(final.Entries), final.Entries, final.Head, count, acked)
	}
	if got := streamEntryIDs(t, srv.URL(), "019ad000-0000-7000-8000-000000002000"); !reflect.DeepEqual(got, acked) {
		t.Errorf("the stream holds %d entry messages %v, want exactly the %d acknowledged, once each, in order: %v", len(got), got, count, acked)
	}
}

// streamEntryIDs lists the entry id of every message the stream holds for a conversation
// of the test owner, in stream order, the header left out: what is stored, not what the
// store's open makes of it.
func streamEntryIDs(t *testing.T, url, id string) []string {
	t.Helper()
	mc := newMirrorClient(t, url)
	conv, err := mc.r.Conv(id)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = mc.r.Scan(ctx, conv, mirror.ScanOptions{HeadersOnly: true}, func(m mirror.Msg) error {
		if m.Kind != mirror.KindHeader {
			ids = append(ids, m.EntryID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// relFiles lists the session files under root, relative to it.
func relFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for _, p := range sessionFiles(t, root) {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rel)
	}
	return out
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sameKeys(a, b map[string]any) bool { return reflect.DeepEqual(keys(a), keys(b)) }

func dropKeys(v any, drop ...string) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := map[string]any{}
	for k, x := range m {
		out[k] = x
	}
	for _, k := range drop {
		delete(out, k)
	}
	return out
}

// firstDiff names the first place where two decoded JSON values differ ("" if equal).
func firstDiff(a, b any, path string) string {
	switch a := a.(type) {
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: %s vs %s", path, short(a), short(b))
		}
		for _, k := range keys(a) {
			if d := firstDiff(a[k], bm[k], path+"."+k); d != "" {
				return d
			}
		}
		for k := range bm {
			if _, ok := a[k]; !ok {
				return fmt.Sprintf("%s.%s: absent vs %s", path, k, short(bm[k]))
			}
		}
		return ""
	case []any:
		bs, ok := b.([]any)
		if !ok || len(bs) != len(a) {
			return fmt.Sprintf("%s: %s vs %s", path, short(a), short(b))
		}
		for i := range a {
			if d := firstDiff(a[i], bs[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(a, b) {
			return fmt.Sprintf("%s: %s vs %s", path, short(a), short(b))
		}
		return ""
	}
}

func short(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 200 {
		return string(b[:200]) + fmt.Sprintf("… (%d bytes)", len(b))
	}
	return string(b)
}

// lineDiff says where two files' lines first differ.
func lineDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; i < len(al) && i < len(bl); i++ {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d: %.200q vs %.200q", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("%d lines vs %d", len(al), len(bl))
}

// TestStoreLocalAppendsAfterCutOver: the daemon keeps running while a runtime continues a
// mirrored session through the store; lines Pi then still appends to the old local file
// are mirrored as a new generation of that file, never into the store's generation, which
// the store keeps serving and extending.
func TestStoreLocalAppendsAfterCutOver(t *testing.T) {
	t.Parallel()
	pi := pitest.New(t)
	ps, srv := storeSetup(t)
	base := t.TempDir()
	root := filepath.Join(base, "sessions")
	ev := pi.StartLive(t, root, pitest.LiveOptions{Count: 4, Cwd: "/home/dev/cutover"}).Wait(t)
	path, id := ev[0].Path, ev[0].ConversationID
	d := startDaemon(t, srv.URL(), filepath.Join(base, "state"), root)
	mc := newMirrorClient(t, srv.URL())
	mc.waitMirrored(t, root)
	startServe(t, srv.URL())

	var opened struct {
		Appended []string       `json:"appended"`
		After    map[string]any `json:"after"`
	}
	ps.JSON(t, &opened, append([]string{"open-nats", "--id", id, "--append", "2"}, storeArgs(srv.URL())...)...)
	pi.StartLive(t, path, pitest.LiveOptions{Count: 2}).Wait(t)
	// A newer generation than the store's holds the local file, line for line.
	local, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(local, []byte("\n")), []byte("\n"))
	conv, err := mc.r.Conv(id)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(mirrorTimeout)
	for {
		g, err := mc.r.ReadGeneration(context.Background(), conv, 0)
		if err == nil && len(g.Generations) > 1 && len(g.Msgs) == len(lines) && g.Msgs[len(lines)-1].SHA256 == sha256hex(lines[len(lines)-1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new generation holding the local file after %v: %+v %v", mirrorTimeout, g.Generations, err)
		}
		time.Sleep(100 * time.Millisecond) // polling interval of a poll-with-deadline
	}

	var again struct {
		Before map[string]any `json:"before"`
	}
	ps.JSON(t, &again, append([]string{"open-nats", "--id", id}, storeArgs(srv.URL())...)...)
	if d := firstDiff(opened.After["entries"], again.Before["entries"], "entries"); d != "" {
		t.Errorf("the store's generation changed after local appends: %s", d)
	}
	d.stop(t)
}
