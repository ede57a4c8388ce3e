package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/internal/verify"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/recovery"
)

// accountsDir holds the accounts layouts of the deployment kit.
const accountsDir = "../../deploy/nats"

// startAccountsServer starts a JetStream nats-server on loopback with an accounts layout
// of deploy/nats included unchanged (users, permissions, accounts), every password a
// random value in nats-server's environment. It returns the URL and the passwords.
func startAccountsServer(t *testing.T, layout string) (string, map[string]string) {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(accountsDir, layout+".conf"))
	if err != nil {
		t.Fatal(err)
	}
	passwords := map[string]string{}
	for _, m := range regexp.MustCompile(`user: ([a-z0-9-]+)[\s,]*password: \$(NATS_PASSWORD_[A-Z0-9_]+)`).FindAllStringSubmatch(string(text), -1) {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		passwords[m[1]] = hex.EncodeToString(b)
		t.Setenv(m[2], passwords[m[1]])
	}
	if passwords["acme-alice"] == "" || passwords["globex-bob"] == "" {
		t.Fatalf("%s.conf: users acme-alice and globex-bob not found (found %v)", layout, passwords)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, layout+".conf"), text, 0o600); err != nil {
		t.Fatal(err)
	}
	port := natstest.FreePort(t)
	main := fmt.Sprintf("listen: 127.0.0.1:%d\nmax_payload: 1MB\njetstream { store_dir: %q }\ninclude ./%s.conf\n",
		port, filepath.ToSlash(filepath.Join(dir, "js")), layout)
	if err := os.WriteFile(filepath.Join(dir, "server.conf"), []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "server.conf"))
	if err != nil {
		t.Fatal(err)
	}
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(20 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return fmt.Sprintf("nats://127.0.0.1:%d", port), passwords
}

// isoUser is one tenant's owner: its NATS user, its sessions and its connection flags.
type isoUser struct {
	user, tenant, owner string
	provision           string
	conn                []string
	root                string
	files               []*sessiontest.File
}

func (u *isoUser) args(more ...string) []string {
	return append(append(append([]string{}, u.conn...), "--tenant", u.tenant, "--owner", u.owner), more...)
}

// TestIsolationAccounts runs, for each accounts layout of deploy/nats, a daemon as
// acme/alice and one as globex/bob with their own NATS users (an admin provisioned the
// stream and buckets). Each mirrors its sessions, a large line through the object store
// included, under its own subjects, keys and object names only; alice recovers hers byte
// for byte. Run as alice, recover, status and verify answer for bob's conversations
// exactly as for conversations that exist nowhere: not found, not mirrored.
func TestIsolationAccounts(t *testing.T) {
	for _, layout := range []string{"accounts-per-tenant", "accounts-shared"} {
		t.Run(layout, func(t *testing.T) { testIsolationAccounts(t, layout) })
	}
}

func testIsolationAccounts(t *testing.T, layout string) {
	url, passwords := startAccountsServer(t, layout)
	admins := []string{"pisync-admin"}
	if layout == "accounts-per-tenant" {
		admins = []string{"acme-admin", "globex-admin"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adminJS := map[string]jetstream.JetStream{}
	for _, a := range admins {
		nc, err := nats.Connect(url, nats.UserInfo(a, passwords[a]))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		if err := mirror.Provision(ctx, js, mirror.DefaultNames(), mirror.Config{Replicas: 1}); err != nil {
			t.Fatalf("provision as %s: %v", a, err)
		}
		adminJS[a] = js
	}

	rng := mrand.New(mrand.NewPCG(11, 12))
	// alice's daemon runs with the default --provision (create what is missing: nothing
	// here), bob's with --provision off.
	users := []*isoUser{{user: "acme-alice", tenant: "acme", owner: "alice", provision: "create"},
		{user: "globex-bob", tenant: "globex", owner: "bob", provision: "off"}}
	for _, u := range users {
		u.conn = []string{"--nats", url, "--nats-user", u.user, "--nats-password", passwords[u.user], "--connect-timeout", "5s"}
		u.root = t.TempDir()
		u.files = writeSessions(t, rng, u.root, 3, 6)
		// One blob each: nats.go's ObjectStore.Put (v1.55) can leave its async-ack
		// goroutine blocked for good when it returns before that goroutine has started,
		// which goleak reports; the fewer puts, the rarer.
		if err := u.files[0].Append(u.files[0].ImageEntry(80 << 10)); err != nil {
			t.Fatal(err)
		}
	}
	alice, bob := users[0], users[1]
	readerOf := func(u *isoUser) *mirror.Reader {
		c := connFlagsOf(t, u.conn...)
		o, _ := mirror.NewOwner(u.tenant, u.owner)
		nc, err := c.connect(ctx, "test reader", 5*time.Second, zaptest.NewLogger(t), nil, nats.CustomInboxPrefix(o.InboxPrefix()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return newReader(t, nc, u.tenant, u.owner)
	}
	for _, u := range users {
		d := startTestDaemon(t, u.args("--root", u.root, "--state-dir", t.TempDir(), "--blob-threshold", "65536", "--provision", u.provision)...)
		allMirrored(t, readerOf(u), u.root, 60*time.Second)
		if err := d.stop(); err != nil {
			t.Fatal(err)
		}
	}

	// The one pass over an owner's messages that recover --all makes is allowed by the
	// layout, and sees that owner's conversations only.
	r := readerOf(alice)
	counts, err := r.Counts(ctx)
	if err != nil {
		t.Fatalf("count alice's messages as alice: %v", err)
	}
	var keys []string
	var total uint64
	for k, n := range counts {
		keys, total = append(keys, k), total+n
	}
	sort.Strings(keys)
	if want := fileIDs(alice.files); strings.Join(keys, " ") != strings.Join(want, " ") {
		t.Fatalf("alice's conversations counted: %v, want %v", keys, want)
	}
	var read uint64
	if err := r.ScanOwner(ctx, mirror.ScanOptions{HeadersOnly: true}, func(key string, _ mirror.Msg) error {
		if counts[key] == 0 {
			t.Errorf("one pass as alice read a message of %q", key)
		}
		read++
		return nil
	}); err != nil {
		t.Fatalf("one pass over alice's messages as alice: %v", err)
	}
	if read != total {
		t.Errorf("one pass read %d messages, the counts say %d", read, total)
	}

	// What each daemon wrote carries its own tenant and owner only.
	for _, a := range admins {
		checkOwnersOnly(t, ctx, adminJS[a], users)
	}

	// alice gets her sessions back, byte for byte.
	out := t.TempDir()
	rep := recoverJSON(t, exitOK, alice.args("--all", "--out", out)...)
	var ids []string
	for _, r := range rep.Conversations {
		ids = append(ids, r.Conversation)
	}
	sort.Strings(ids)
	if want := fileIDs(alice.files); strings.Join(ids, " ") != strings.Join(want, " ") {
		t.Fatalf("alice recovers %v, want her own %v", ids, want)
	}
	for _, f := range alice.files {
		got, err := os.ReadFile(filepath.Join(out, filepath.Base(filepath.Dir(f.Path)), filepath.Base(f.Path)))
		want, _ := os.ReadFile(f.Path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: recovered %d bytes (%v), want the original %d", f.ID, len(got), err, len(want))
		}
	}

	// bob's conversations, asked for by alice, are not found, exactly like ids that exist
	// nowhere; the answer names no other tenant or owner.
	for i, f := range bob.files {
		nowhere := fmt.Sprintf("0192f0a4-0000-7000-8000-%012d", i)
		bobRep := recoverJSON(t, exitFail, alice.args("--conversation", f.ID, "--out", t.TempDir())...)
		noneRep := recoverJSON(t, exitFail, alice.args("--conversation", nowhere, "--out", t.TempDir())...)
		b, n := strings.ReplaceAll(reportText(bobRep), f.ID, "ID"), strings.ReplaceAll(reportText(noneRep), nowhere, "ID")
		if b != n || !strings.Contains(b, "not found") {
			t.Errorf("bob's conversation, asked for by alice:\n%s\nan id that exists nowhere:\n%s", b, n)
		}
		if strings.Contains(b, "globex") || strings.Contains(b, "bob") {
			t.Errorf("the answer names another tenant or owner: %s", b)
		}
	}

	// status and verify as alice over bob's files: not mirrored, like files never mirrored;
	// the mirror totals are alice's.
	fresh := t.TempDir()
	writeSessions(t, rng, fresh, len(bob.files), 3)
	for _, root := range []string{bob.root, fresh} {
		var stdout, stderr bytes.Buffer
		err := StatusCommand(ctx, alice.args("--root", root, "--json"), &stdout, &stderr)
		if err != nil {
			t.Fatalf("status: %v\n%s", err, stderr.String())
		}
		var st verify.StatusReport
		if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
			t.Fatal(err)
		}
		if st.Local.States["not-mirrored"] != len(bob.files) || st.Local.Sessions != len(bob.files) {
			t.Errorf("status as alice over %s: %+v, want every session not mirrored", root, st.Local)
		}
		if st.Mirror.Conversations != len(alice.files) || st.Mirror.Tenant != "acme" || st.Mirror.Owner != "alice" {
			t.Errorf("mirror totals as alice: %+v", st.Mirror)
		}
		stdout.Reset()
		err = VerifyCommand(ctx, alice.args("--root", root, "--json"), &stdout, &stderr)
		if err != nil {
			t.Fatalf("verify: %v\n%s", err, stderr.String())
		}
		var vd verifyDoc
		if err := json.Unmarshal(stdout.Bytes(), &vd); err != nil {
			t.Fatal(err)
		}
		if vd.Summary[verifyNotMirrored] != len(bob.files) || len(vd.Files) != len(bob.files) {
			t.Errorf("verify as alice over %s: %v", root, vd.Summary)
		}
	}
}

// checkOwnersOnly reads, as an admin, every subject, key and object of the account and
// checks that each carries the tenant and owner of one of the users, who all wrote some.
func checkOwnersOnly(t *testing.T, ctx context.Context, js jetstream.JetStream, users []*isoUser) {
	t.Helper()
	names := mirror.DefaultNames()
	allowed := map[string]string{} // "<tenant>.<owner>." → user
	for _, u := range users {
		o, _ := mirror.NewOwner(u.tenant, u.owner)
		allowed[o.KeyPrefix()] = u.user
	}
	seen := map[string]int{}
	owned := func(what, s string) {
		for p, u := range allowed {
			if strings.HasPrefix(s, p) {
				seen[u+" "+what]++
				return
			}
		}
		t.Errorf("%s %q belongs to no user of this account", what, s)
	}
	s, err := js.Stream(ctx, names.Stream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	for subj := range info.State.Subjects {
		owned("subject", strings.TrimPrefix(subj, "pisync.entries."))
	}
	kv, err := js.KeyValue(ctx, names.HeadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		owned("key", k)
	}
	obj, err := js.ObjectStore(ctx, names.BlobsBucket())
	if err != nil {
		t.Fatal(err)
	}
	objs, err := obj.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		owned("object", o.Name)
	}
	t.Logf("account contents by owner: %v", seen)
	for _, what := range []string{"subject", "key", "object"} {
		n := 0
		for _, u := range users {
			n += seen[u.user+" "+what]
		}
		if n == 0 {
			t.Errorf("no %s at all: the check checked nothing", what)
		}
	}
}

func fileIDs(files []*sessiontest.File) []string {
	var ids []string
	for _, f := range files {
		ids = append(ids, f.ID)
	}
	sort.Strings(ids)
	return ids
}

// recoverJSON runs `pisync recover --json` and checks its exit code.
func recoverJSON(t *testing.T, want int, args ...string) recoverDoc {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := exitCode(RecoverCommand(context.Background(), append(args, "--json"), &stdout, &stderr), &stderr)
	if code != want {
		t.Fatalf("recover %q: exit %d, want %d\n%s%s", args, code, want, stdout.String(), stderr.String())
	}
	var doc recoverDoc
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatalf("recover %q: %v\n%s", args, err, stdout.String())
	}
	return doc
}

// reportText is what recover says of each conversation, output paths left out (they
// are temporary directories).
func reportText(doc recoverDoc) string {
	var b strings.Builder
	for _, r := range doc.Conversations {
		fmt.Fprintf(&b, "%s %s %s: %s\n", r.Conversation, r.Key, r.Result, r.Reason)
	}
	return b.String()
}

// safeToken is what an encoded tenant, owner or conversation looks like in a subject.
var safeToken = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// TestIsolationHostileNames: a tenant, an owner and conversation ids made of '.', '*',
// '>', spaces, '/', "..", NUL and bytes that are not UTF-8 are encoded: every subject,
// key, message id and object name the daemon writes has exactly its tokens, each
// [A-Za-z0-9_-] and decoding back to the name. recover rebuilds such a conversation,
// and refuses (writing nothing) one whose id would make a path leave --out. A tenant
// too long to encode, or empty, is a usage error for every command.
func TestIsolationHostileNames(t *testing.T) {
	srv := natstest.Run(t)
	tenant := "a.b *>/../\x00"
	owner := "o\xff\xfe wner.*/..\\"
	// Ids come from JSON, which holds no bytes that are not UTF-8 (tenant and owner do).
	ids := []string{"x y.*> \u00e9\t", "nul\x00id", "../../escape.jsonl/.."}
	rng := mrand.New(mrand.NewPCG(21, 22))
	root := t.TempDir()
	var files []*sessiontest.File
	for i, id := range ids {
		f := sessiontest.New(rng, root, "/home/dev/hostile", sessiontest.HarnessV3)
		f.ID = id
		lines := [][]byte{f.HeaderLine("/home/dev/hostile"), f.Entry(300)}
		if i == 0 {
			lines = append(lines, f.ImageEntry(8<<10)) // a blob, named by tenant and owner
		}
		if err := f.Append(lines...); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	conn := []string{"--nats", srv.URL(), "--tenant", tenant, "--owner", owner}
	d := startTestDaemon(t, append(conn, "--root", root, "--state-dir", t.TempDir(), "--blob-threshold", "4096")...)
	nc := natstest.Connect(t, srv.URL())
	allMirrored(t, newReader(t, nc, tenant, owner), root, 60*time.Second)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}

	decodes := func(what, tok, want string) {
		t.Helper()
		got, err := mirror.DecodeToken(tok)
		if !safeToken.MatchString(tok) || err != nil || got != want {
			t.Errorf("%s token %q: decodes to %q (%v), want %q", what, tok, got, err, want)
		}
	}
	idSet := map[string]bool{}
	for _, id := range ids {
		idSet[id] = true
	}
	msgs := readStream(t, nc)
	if len(msgs) == 0 {
		t.Fatal("nothing mirrored")
	}
	for _, m := range msgs {
		tok := strings.Split(m.subject, ".")
		if len(tok) != 5 || tok[0] != "pisync" || tok[1] != "entries" {
			t.Fatalf("subject %q: want pisync.entries.<tenant>.<owner>.<conversation>", m.subject)
		}
		decodes("subject tenant", tok[2], tenant)
		decodes("subject owner", tok[3], owner)
		if c, err := mirror.DecodeToken(tok[4]); err != nil || !idSet[c] || !safeToken.MatchString(tok[4]) {
			t.Errorf("subject conversation token %q: %q, %v", tok[4], c, err)
		}
		if id := strings.Split(m.msgID, "."); len(id) != 5 || strings.Join(id[:3], ".") != strings.Join(tok[2:], ".") {
			t.Errorf("message id %q of subject %q", m.msgID, m.subject)
		}
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, mirror.DefaultNames().HeadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := kv.Keys(ctx)
	objs, _ := func() ([]*jetstream.ObjectInfo, error) {
		o, err := js.ObjectStore(ctx, mirror.DefaultNames().BlobsBucket())
		if err != nil {
			return nil, err
		}
		return o.List(ctx)
	}()
	if len(keys) != len(ids) || len(objs) != 1 {
		t.Fatalf("%d keys, %d objects; want %d and 1", len(keys), len(objs), len(ids))
	}
	var names []string
	names = append(names, keys...)
	for _, o := range objs {
		names = append(names, o.Name)
	}
	for _, n := range names {
		tok := strings.Split(n, ".")
		if len(tok) != 3 {
			t.Fatalf("key or object name %q: want 3 tokens", n)
		}
		decodes("key tenant", tok[0], tenant)
		decodes("key owner", tok[1], owner)
		if !safeToken.MatchString(tok[2]) {
			t.Errorf("key or object name %q", n)
		}
	}

	// recover: the first id makes a valid file name; the others cannot name a file in
	// --out (a NUL) or would leave it.
	base := t.TempDir()
	out := filepath.Join(base, "out")
	good := recoverJSON(t, exitOK, append(conn, "--conversation", ids[0], "--out", out)...)
	if r := good.Conversations[0]; r.Result != recovery.Written || filepath.Dir(filepath.Dir(r.Output)) != out {
		t.Fatalf("recover %q: %s %s → %s", ids[0], r.Result, r.Reason, r.Output)
	} else if got, _ := os.ReadFile(r.Output); !bytes.Equal(got, mirrortest.JoinLines(files[0].Lines)) {
		t.Errorf("recover %q: not the original bytes", ids[0])
	}
	for _, id := range ids[1:] {
		bad := recoverJSON(t, exitFail, append(conn, "--conversation", id, "--out", out)...)
		if r := bad.Conversations[0]; r.Result != recovery.Refused || !strings.Contains(r.Reason, "unsafe output path") {
			t.Fatalf("recover %q: %s %s", id, r.Result, r.Reason)
		}
	}
	var written []string
	_ = filepath.WalkDir(base, func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			written = append(written, p)
		}
		return nil
	})
	if len(written) != 1 {
		t.Errorf("files under %s: %q, want the one recovered", base, written)
	}

	// Names that cannot be encoded are refused before anything connects.
	long := strings.Repeat("é", 200) // 400 bytes, 1200 encoded
	for _, args := range [][]string{{"--tenant", long}, {"--owner", long}, {"--tenant", ""}, {"--owner", ""}} {
		var stdout, stderr bytes.Buffer
		codes := map[string]int{
			"status":  exitCode(StatusCommand(ctx, append([]string{"--nats", srv.URL()}, args...), &stdout, &stderr), &stderr),
			"recover": exitCode(RecoverCommand(ctx, append([]string{"--nats", srv.URL(), "--all"}, args...), &stdout, &stderr), &stderr),
			"verify":  exitCode(VerifyCommand(ctx, append([]string{"--nats", srv.URL()}, args...), &stdout, &stderr), &stderr),
		}
		var f runFlags
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		f.register(fs)
		if err := parseFlags(fs, append([]string{"--nats", srv.URL(), "--http-addr", "", "--root", t.TempDir(), "--state-dir", t.TempDir()}, args...)); err != nil {
			t.Fatal(err)
		}
		_, err := startDaemon(ctx, &f, zap.NewNop())
		codes["run"] = exitCode(err, &stderr)
		for cmd, code := range codes {
			if code != exitUsage {
				t.Errorf("%s %q: exit %d, want %d (usage)", cmd, args[0], code, exitUsage)
			}
		}
		if !strings.Contains(stderr.String(), "invalid subject token") {
			t.Errorf("%s: %s", args[0], stderr.String())
		}
	}
}

// TestIsolationRootSymlinks: symbolic links in a watched root — to a directory of
// sessions outside it, to a session file outside it — are not followed, whether they
// are there at start or appear later, through events or the periodic rescan; the
// sessions inside the root are mirrored.
func TestIsolationRootSymlinks(t *testing.T) {
	srv := natstest.Run(t)
	rng := mrand.New(mrand.NewPCG(31, 32))
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	inside := writeSessions(t, rng, root, 2, 3)
	out := writeSessions(t, rng, outside, 4, 3)
	link := func(to, at string) {
		t.Helper()
		if err := os.Symlink(to, at); err != nil {
			t.Fatal(err)
		}
	}
	link(outside, filepath.Join(root, "linked-dir"))
	link(out[0].Path, filepath.Join(root, filepath.Base(filepath.Dir(inside[0].Path)), filepath.Base(out[0].Path)))
	d := startTestDaemon(t, "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir(), "--rescan-interval", "200ms")
	defer d.stop()
	nc := natstest.Connect(t, srv.URL())
	r := newReader(t, nc, "t1", "alice")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	waitFor(t, 30*time.Second, "the sessions inside the root mirrored", func() (bool, string) {
		for _, f := range inside {
			if ok, why := mirrorMatches(ctx, r, f.Path); !ok {
				return false, why
			}
		}
		return true, ""
	})
	// Links appearing later, and the linked files growing.
	if err := os.MkdirAll(filepath.Join(root, "later"), 0o700); err != nil {
		t.Fatal(err)
	}
	link(filepath.Join(outside, filepath.Base(filepath.Dir(out[1].Path))), filepath.Join(root, "later", "dir"))
	link(out[2].Path, filepath.Join(root, "later", filepath.Base(out[2].Path)))
	for _, f := range out {
		if err := f.Append(f.Entry(200)); err != nil {
			t.Fatal(err)
		}
	}
	// A positive barrier instead of a pause: a session written inside the root after the
	// links, mirrored, and two periodic rescans begun after it was, so that the links
	// were seen both through events and by rescans before absence is asserted.
	sentinel := writeSessions(t, rng, filepath.Join(root, "after"), 1, 1)[0]
	inside = append(inside, sentinel)
	waitFor(t, 30*time.Second, "a session written after the links mirrored", func() (bool, string) {
		return mirrorMatches(ctx, r, sentinel.Path)
	})
	rescans := metricValue(t, d, "pisync_watcher_rescans_total", map[string]string{"reason": "periodic"})
	waitFor(t, 30*time.Second, "two more periodic rescans", func() (bool, string) {
		n := metricValue(t, d, "pisync_watcher_rescans_total", map[string]string{"reason": "periodic"})
		return n >= rescans+2, fmt.Sprintf("%v rescans", n-rescans)
	})
	want := map[string]bool{}
	for _, f := range inside {
		c, _ := r.Conv(f.ID)
		want[r.Names().Subject(c)] = true
	}
	seen := map[string]bool{}
	for _, m := range readStream(t, nc) {
		if !want[m.subject] && !seen[m.subject] {
			t.Errorf("%s mirrored from %s: outside the root", m.subject, m.line.Source)
		}
		seen[m.subject] = true
	}
	if len(seen) != len(inside) {
		t.Errorf("%d conversations mirrored, want %d", len(seen), len(inside))
	}
}
