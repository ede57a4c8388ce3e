package store_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/store"
)

func TestCreateAppendOpenExactBytes(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	const id = "0199a1c2-7d3e-7000-8000-00000000abcd"
	hdr := headerLine(id, "/srv/app")
	r := e.req("alice", "create", map[string]any{"line": hdr})
	if !r.OK || r.Meta.ID != id || r.Meta.Writer != "store" || r.Meta.Head != nil || r.Meta.Cwd != "/srv/app" {
		t.Fatalf("create: %+v", r)
	}
	if again := e.req("alice", "create", map[string]any{"line": hdr}); !again.OK || again.Seq != r.Seq {
		t.Fatalf("create again: %+v, want ok with seq %d", again, r.Seq)
	}
	other := e.req("alice", "create", map[string]any{"line": headerLine(id, "/elsewhere")})
	if other.code() != "conflict" || other.Error.Reason != "exists" || other.hdrCode != "409" {
		t.Fatalf("create with another header: %+v", other)
	}
	lines := []string{
		entryLine("a1b2c3d4", "", "hello <world> & \u2028 \"quoted\""),
		entryLine("b2c3d4e5", "a1b2c3d4", "second"),
		leafLine("c3d4e5f6", "b2c3d4e5", "a1b2c3d4"),
		entryLine("d4e5f6a7", "a1b2c3d4", "branch"),
	}
	head := ""
	for i, l := range lines {
		a := e.mustAppend("alice", id, head, l)
		if a.Ordinal != int64(i+1) || a.Duplicate {
			t.Fatalf("append %d: %+v", i, a)
		}
		env, _ := session.ScanEntry([]byte(l))
		want := env.ID
		if env.Type == "leaf" {
			want = env.TargetID
		}
		if a.Head == nil || *a.Head != want {
			t.Fatalf("append %d: head %v, want %s", i, a.Head, want)
		}
		head = want
	}
	first, got := e.openAll("alice", id)
	if !first.OK || first.Head == nil || *first.Head != "d4e5f6a7" || first.Meta.Entries != 4 {
		t.Fatalf("open: %+v", first)
	}
	if strings.Join(got, "\n") != strings.Join(lines, "\n") {
		t.Fatalf("open lines differ:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(lines, "\n"))
	}
	// The stream holds the header and the lines byte for byte, as §2 messages.
	msgs := e.streamMsgs("alice", id)
	if len(msgs) != 5 || string(msgs[0].Data) != hdr || msgs[0].Kind != mirror.KindHeader {
		t.Fatalf("stream: %d messages, first %q", len(msgs), msgs[0].Data)
	}
	for i, m := range msgs[1:] {
		if string(m.Data) != lines[i] || m.Ordinal != int64(i+1) || m.Generation != 1 || m.Kind != mirror.KindEntry {
			t.Fatalf("message %d: %+v %q", i+1, m.Line, m.Data)
		}
	}
	h := e.kvHead("alice", id)
	if h.Writer != mirror.WriterStore || h.Head != "d4e5f6a7" || h.LastSeq != msgs[4].Seq || h.Source != "--srv-app--/2026-12-01T18-00-00-000Z_"+id+".jsonl" {
		t.Fatalf("head: %+v", h)
	}
}

func TestAppendInvalid(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	e.create("alice", "conv1")
	e.mustAppend("alice", "conv1", "", entryLine("a1b2c3d4", "", "x"))
	cases := []struct {
		name string
		body map[string]any
		code string
	}{
		{"not json", appendReq("conv1", "a1b2c3d4", `{"type":"message",`), "invalid"},
		{"two objects", appendReq("conv1", "a1b2c3d4", `{"type":"x","id":"ffff0000","parentId":null,"timestamp":"t"} {}`), "invalid"},
		{"no id", appendReq("conv1", "a1b2c3d4", `{"type":"custom","parentId":null,"timestamp":"t"}`), "invalid"},
		{"no timestamp", appendReq("conv1", "a1b2c3d4", `{"type":"custom","id":"ffff0000","parentId":null}`), "invalid"},
		{"parent absent", appendReq("conv1", "a1b2c3d4", entryLine("ffff0000", "99999999", "x")), "invalid"},
		{"leaf target absent", appendReq("conv1", "a1b2c3d4", leafLine("ffff0000", "a1b2c3d4", "99999999")), "invalid"},
		{"no expected head", map[string]any{"id": "conv1", "line": entryLine("ffff0000", "a1b2c3d4", "x")}, "invalid"},
		{"missing conversation", appendReq("nope", "", entryLine("ffff0000", "", "x")), "not_found"},
		{"wrong head", appendReq("conv1", "", entryLine("ffff0000", "a1b2c3d4", "x")), "conflict"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.req("alice", "append", c.body)
			if r.code() != c.code {
				t.Fatalf("%s: got %s (%+v), want %s", c.name, r.code(), r.Error, c.code)
			}
		})
	}
	if n := len(e.streamMsgs("alice", "conv1")); n != 2 {
		t.Fatalf("failed appends left messages: %d in the stream, want 2", n)
	}
}

// Two runtimes append on the same head: exactly one is stored, the other is told the head.
func TestAppendSameHeadOneWins(t *testing.T) {
	e := newEnv(t, 2, store.Options{})
	e.create("alice", "conv1")
	head := ""
	for round := 0; round < 20; round++ {
		ids := []string{fmt.Sprintf("a%07d", round), fmt.Sprintf("b%07d", round)}
		res := make([]reply, 2)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				res[i] = e.req("alice", "append", appendReq("conv1", head, entryLine(ids[i], head, "x")))
			}(i)
		}
		wg.Wait()
		var winner string
		for i, r := range res {
			switch r.code() {
			case "ok":
				if winner != "" {
					t.Fatalf("round %d: both appends succeeded", round)
				}
				winner = ids[i]
			case "conflict":
			default:
				t.Fatalf("round %d: %+v", round, r)
			}
		}
		if winner == "" {
			t.Fatalf("round %d: neither append succeeded: %+v %+v", round, res[0].Error, res[1].Error)
		}
		for _, r := range res {
			if r.code() == "conflict" && (r.Error.Reason != "head" || r.errHead() != winner) {
				t.Fatalf("round %d: conflict %+v, want reason head and head %s", round, r.Error, winner)
			}
		}
		head = winner
	}
	if n := len(e.streamMsgs("alice", "conv1")); n != 21 {
		t.Fatalf("%d messages, want 21", n)
	}
}

// A retried append whose reply was lost succeeds once, with the original sequence; the
// same id with other bytes is a conflict.
func TestAppendRetryIdempotent(t *testing.T) {
	e := newEnv(t, 2, store.Options{})
	e.create("alice", "conv1")
	line := entryLine("a1b2c3d4", "", "x")
	first := e.mustAppend("alice", "conv1", "", line)
	e.mustAppend("alice", "conv1", "a1b2c3d4", entryLine("b2c3d4e5", "a1b2c3d4", "y"))
	for i := 0; i < 4; i++ { // both replicas, whichever answers
		again := e.mustAppend("alice", "conv1", "", line)
		if again.Seq != first.Seq || again.Ordinal != first.Ordinal || !again.Duplicate {
			t.Fatalf("retry: %+v, want seq %d ordinal %d duplicate", again, first.Seq, first.Ordinal)
		}
	}
	other := e.req("alice", "append", appendReq("conv1", "", entryLine("a1b2c3d4", "", "changed")))
	if other.code() != "conflict" || other.Error.Reason != "entry_exists" {
		t.Fatalf("same id, other bytes: %+v", other.Error)
	}
	if n := len(e.streamMsgs("alice", "conv1")); n != 3 {
		t.Fatalf("%d messages, want 3", n)
	}
}

// Many writers through two replicas, each appending on the head it last saw: the
// conversation stays one chain, every ok is one message, no head is extended twice.
func TestReplicasRaceNeverBothExtend(t *testing.T) {
	e := newEnv(t, 2, store.Options{})
	e.create("alice", "conv1")
	const writers, each = 4, 8
	var mu sync.Mutex
	oks := 0
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			n := 0
			for tries := 0; n < each && tries < 50*each; tries++ {
				o := e.req("alice", "open", map[string]any{"id": "conv1"})
				head := ""
				if o.Head != nil {
					head = *o.Head
				}
				id := fmt.Sprintf("w%dn%05d", w, n)
				r := e.req("alice", "append", appendReq("conv1", head, entryLine(id, head, "x")))
				if r.OK {
					n++
					mu.Lock()
					oks++
					mu.Unlock()
				} else if r.code() != "conflict" {
					t.Errorf("writer %d: %+v", w, r.Error)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	msgs := e.streamMsgs("alice", "conv1")
	if len(msgs) != oks+1 {
		t.Fatalf("%d messages for %d successful appends", len(msgs), oks)
	}
	prev := ""
	for i, m := range msgs[1:] {
		if m.ParentID != prev || m.Ordinal != int64(i+1) {
			t.Fatalf("message %d (%s) has parent %q ordinal %d, want %q and %d: a head was extended twice", i+1, m.EntryID, m.ParentID, m.Ordinal, prev, i+1)
		}
		prev = m.EntryID
	}
	if h := e.kvHead("alice", "conv1"); h.Head != prev || h.LastSeq != msgs[len(msgs)-1].Seq {
		t.Fatalf("head %+v, want %s", h, prev)
	}
}

// A serve stopped between its publish and its head update leaves the head behind the
// stream; the next open and append work from the stream and repair the head.
func TestHeadRepairedAfterPublishWithoutHead(t *testing.T) {
	// No grace: the entry below is known to be a dead replica's, not one whose head is
	// being written.
	opts := store.Options{HeadRepairGrace: time.Nanosecond}
	e := newEnv(t, 1, opts)
	e.create("alice", "conv1")
	e.mustAppend("alice", "conv1", "", entryLine("a1b2c3d4", "", "x"))
	before := e.kvHead("alice", "conv1")
	// What a replica has done when it dies after the publish: the message is stored, the
	// head is not.
	o, _ := mirror.NewOwner("t1", "alice")
	c, _ := mirror.NewConv(o, "conv1")
	line := entryLine("b2c3d4e5", "a1b2c3d4", "y")
	sum := sha256.Sum256([]byte(line))
	l := mirror.Line{Kind: mirror.KindEntry, EntryID: "b2c3d4e5", ParentID: "a1b2c3d4", EntryType: "message", Ordinal: 2,
		Generation: 1, SHA256: hex.EncodeToString(sum[:]), Format: "v3", Host: "pisync-store", Source: before.Source}
	if _, err := e.js.PublishMsg(ctxFor(t), e.names.NewMsg(c, l, []byte(line))); err != nil {
		t.Fatal(err)
	}
	// A fresh replica (no cache) and the old one both see the stream.
	e.addReplica(opts)
	for i := 0; i < 2; i++ {
		r := e.req("alice", "open", map[string]any{"id": "conv1"})
		if r.Head == nil || *r.Head != "b2c3d4e5" {
			t.Fatalf("open head %v, want b2c3d4e5", r.Head)
		}
	}
	if h := e.kvHead("alice", "conv1"); h.Head != "b2c3d4e5" || h.LastOrdinal != 2 {
		t.Fatalf("head not repaired: %+v", h)
	}
	stale := e.req("alice", "append", appendReq("conv1", "a1b2c3d4", entryLine("c3d4e5f6", "a1b2c3d4", "z")))
	if stale.code() != "conflict" || stale.errHead() != "b2c3d4e5" {
		t.Fatalf("append on the old head: %+v", stale.Error)
	}
	e.mustAppend("alice", "conv1", "b2c3d4e5", entryLine("c3d4e5f6", "b2c3d4e5", "z"))
}

// Another owner's conversation, or a missing one, is not_found for every operation.
func TestOwnerIsolation(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	e.create("alice", "conv1")
	e.mustAppend("alice", "conv1", "", entryLine("a1b2c3d4", "", "secret"))
	for _, c := range []struct {
		op   string
		body map[string]any
	}{
		{"open", map[string]any{"id": "conv1"}},
		{"append", appendReq("conv1", "a1b2c3d4", entryLine("b2c3d4e5", "a1b2c3d4", "x"))},
		{"append", appendReq("conv1", "", entryLine("b2c3d4e5", "", "x"))},
		{"delete", map[string]any{"id": "conv1"}},
		{"fork", map[string]any{"source": "conv1", "line": headerLine("conv2", "/srv/app")}},
		{"open", map[string]any{"id": "missing"}},
	} {
		r := e.req("bob", c.op, c.body)
		if r.code() != "not_found" || r.hdrCode != "404" || strings.Contains(r.Error.Message, "secret") {
			t.Fatalf("bob %s: %+v", c.op, r.Error)
		}
	}
	if l := e.req("bob", "list", map[string]any{}); !l.OK || len(l.Sessions) != 0 {
		t.Fatalf("bob's list: %+v", l)
	}
	if l := e.req("alice", "list", map[string]any{}); !l.OK || len(l.Sessions) != 1 || l.Sessions[0].ID != "conv1" {
		t.Fatalf("alice's list: %+v", l)
	}
	if n := len(e.streamMsgs("alice", "conv1")); n != 2 {
		t.Fatalf("alice's conversation changed: %d messages", n)
	}
}

// An entry above the payload limit is uploaded in parts, stored as a blob, and read back
// in parts, byte for byte.
func TestLargeEntryThroughBlob(t *testing.T) {
	e := newEnv(t, 2, store.Options{})
	e.create("alice", "conv1")
	e.mustAppend("alice", "conv1", "", entryLine("a1b2c3d4", "", "x"))
	big := entryLine("b2c3d4e5", "a1b2c3d4", strings.Repeat("iVBORw0KGgo=", 200_000)) // 2.4 MB
	sum := sha256.Sum256([]byte(big))
	sha := hex.EncodeToString(sum[:])
	for off := 0; off < len(big); off += store.PartSize {
		end := min(off+store.PartSize, len(big))
		r := e.req("alice", "append", map[string]any{"id": "conv1", "part": map[string]any{
			"sha256": sha, "size": len(big), "offset": off, "data": base64.StdEncoding.EncodeToString([]byte(big[off:end]))}})
		if !r.OK || r.Received != int64(end) {
			t.Fatalf("part %d: %+v", off, r)
		}
	}
	blobReq := map[string]any{"id": "conv1", "expectedHead": "a1b2c3d4", "blob": map[string]any{"sha256": sha, "size": len(big)}}
	a := e.req("alice", "append", blobReq)
	if !a.OK || a.Head == nil || *a.Head != "b2c3d4e5" {
		t.Fatalf("blob append: %+v", a)
	}
	// Retried after its parts are gone: answered from the stored entry.
	if again := e.req("alice", "append", blobReq); !again.OK || again.Seq != a.Seq || !again.Duplicate {
		t.Fatalf("blob append again: %+v", again)
	}
	e.mustAppend("alice", "conv1", "b2c3d4e5", entryLine("c3d4e5f6", "b2c3d4e5", "after"))
	msgs := e.streamMsgs("alice", "conv1")
	if msgs[2].Kind != mirror.KindBlob || msgs[2].BlobSize != int64(len(big)) || msgs[2].SHA256 != sha {
		t.Fatalf("stored as %+v", msgs[2].Line)
	}
	_, lines := e.openAll("alice", "conv1")
	if len(lines) != 3 || lines[1] != big {
		t.Fatalf("open: %d lines, large one intact: %v", len(lines), len(lines) > 1 && lines[1] == big)
	}
	bad := e.req("alice", "append", map[string]any{"id": "conv1", "expectedHead": "c3d4e5f6", "blob": map[string]any{"sha256": strings.Repeat("0", 64), "size": 10}})
	if bad.code() != "not_found" {
		t.Fatalf("blob without parts: %+v", bad.Error)
	}
}

// Open of a conversation larger than one reply comes in continuations.
func TestOpenInChunks(t *testing.T) {
	e := newEnv(t, 2, store.Options{})
	e.create("alice", "conv1")
	head := ""
	var want []string
	for i := 0; i < 60; i++ {
		id := fmt.Sprintf("e%07d", i)
		l := entryLine(id, head, strings.Repeat("\"quote\" ", 5000)) // ~45 KB, more once escaped
		e.mustAppend("alice", "conv1", head, l)
		want = append(want, l)
		head = id
	}
	first, got := e.openAll("alice", "conv1")
	if first.Next == nil {
		t.Fatal("one reply held 2.7 MB of entries")
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("chunks lost or reordered entries: %d of %d", len(got), len(want))
	}
}

func TestForkAndDelete(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	e.create("alice", "src")
	lines := []string{
		entryLine("u1000000", "", "first question"),
		`{"type":"message","id":"a1000000","parentId":"u1000000","timestamp":"2026-12-01T18:00:01.000Z","message":{"role":"assistant","content":[]}}`,
		entryLine("u2000000", "a1000000", "second question"),
	}
	head := ""
	for _, l := range lines {
		r := e.mustAppend("alice", "src", head, l)
		head = *r.Head
	}
	cases := []struct {
		name, entry, position string
		want                  []string
		code                  string
	}{
		{"all", "", "", lines, "ok"},
		{"at", "a1000000", "at", lines[:2], "ok"},
		{"before", "u2000000", "before", lines[:2], "ok"},
		{"before first", "u1000000", "before", nil, "ok"},
		{"before non-user", "a1000000", "before", nil, "invalid"},
		{"missing", "99999999", "at", nil, "not_found"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := fmt.Sprintf("fork%d", i)
			body := map[string]any{"source": "src", "line": headerLine(id, "/srv/app"), "entryId": c.entry, "position": c.position}
			r := e.req("alice", "fork", body)
			if r.code() != c.code {
				t.Fatalf("fork: %s %+v", r.code(), r.Error)
			}
			if !r.OK {
				return
			}
			_, got := e.openAll("alice", id)
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") || r.Meta.Entries != int64(len(c.want)) {
				t.Fatalf("forked %q, want %q", got, c.want)
			}
		})
	}
	if r := e.req("alice", "delete", map[string]any{"id": "src"}); !r.OK {
		t.Fatalf("delete: %+v", r.Error)
	}
	for _, op := range []string{"open", "delete"} {
		if r := e.req("alice", op, map[string]any{"id": "src"}); r.code() != "not_found" {
			t.Fatalf("%s after delete: %+v", op, r)
		}
	}
	if r := e.req("alice", "append", appendReq("src", head, entryLine("x1000000", head, "x"))); r.code() != "not_found" {
		t.Fatalf("append after delete: %+v", r.Error)
	}

	// Created again at once, with the same header and entries: their message ids are still
	// in the duplicate window, and the server must not drop them as duplicates of the
	// deleted ones. The same for a fork deleted and made again.
	e.create("alice", "src")
	head = ""
	for _, l := range lines {
		r := e.mustAppend("alice", "src", head, l)
		if r.Duplicate {
			t.Fatalf("append to the re-created conversation answered as a duplicate: %+v", r)
		}
		head = *r.Head
	}
	if _, got := e.openAll("alice", "src"); strings.Join(got, "\n") != strings.Join(lines, "\n") {
		t.Fatalf("re-created conversation holds %q, want %q", got, lines)
	}
	if r := e.req("alice", "delete", map[string]any{"id": "fork0"}); !r.OK {
		t.Fatalf("delete fork0: %+v", r.Error)
	}
	r := e.req("alice", "fork", map[string]any{"source": "src", "line": headerLine("fork0", "/srv/app")})
	if !r.OK {
		t.Fatalf("fork again: %+v", r.Error)
	}
	if _, got := e.openAll("alice", "fork0"); strings.Join(got, "\n") != strings.Join(lines, "\n") {
		t.Fatalf("fork made again holds %q, want %q", got, lines)
	}
}

// A conversation mirrored by the daemon opens through the store and is continued in its
// generation; from then on the store is its writer.
func TestContinueMirroredConversation(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	o, _ := mirror.NewOwner("t1", "alice")
	c, _ := mirror.NewConv(o, "mirrored")
	hdr := headerLine("mirrored", "/srv/app")
	lines := []string{hdr, entryLine("a1b2c3d4", "", "x"), entryLine("b2c3d4e5", "a1b2c3d4", "y")}
	for i, l := range lines {
		sum := sha256.Sum256([]byte(l))
		kind, id, typ := mirror.KindEntry, "", "message"
		if i == 0 {
			kind, id, typ = mirror.KindHeader, mirror.HeaderEntryType, mirror.HeaderEntryType
		} else {
			env, _ := session.ScanEntry([]byte(l))
			id = env.ID
		}
		ml := mirror.Line{Kind: kind, EntryID: id, EntryType: typ, Ordinal: int64(i), Generation: 2,
			SHA256: hex.EncodeToString(sum[:]), Format: "v3", Host: "laptop", Source: "--srv-app--/x_mirrored.jsonl"}
		if _, err := e.js.PublishMsg(ctxFor(t), e.names.NewMsg(c, ml, []byte(l))); err != nil {
			t.Fatal(err)
		}
	}
	r := e.req("alice", "open", map[string]any{"id": "mirrored"})
	if !r.OK || r.Meta.Writer != "daemon" || r.Generation != 2 || r.Head == nil || *r.Head != "b2c3d4e5" {
		t.Fatalf("open: %+v", r)
	}
	a := e.mustAppend("alice", "mirrored", "b2c3d4e5", entryLine("c3d4e5f6", "b2c3d4e5", "z"))
	if a.Ordinal != 3 {
		t.Fatalf("appended at ordinal %d, want 3", a.Ordinal)
	}
	msgs := e.streamMsgs("alice", "mirrored")
	if last := msgs[len(msgs)-1]; last.Generation != 2 || last.Ordinal != 3 {
		t.Fatalf("appended as %+v", last.Line)
	}
	// The first append through the store makes the head the store's before its reply
	// (the daemon learns from the head who writes): read without waiting.
	if h := e.kvHeadNow("alice", "mirrored"); h.Writer != mirror.WriterStore || h.Generation != 2 || h.Head != "c3d4e5f6" {
		t.Fatalf("head %+v", h)
	}
}

// TestOpenSeesEveryAppend: opens on a replica that has served the conversation before
// (which reads only what came after the last snapshot it kept) see exactly the entries
// appended since, in order; once it is deleted, none.
func TestOpenSeesEveryAppend(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	e.create("alice", "conv1")
	head := ""
	var want []string
	for round, n := range []int{3, 1, 0, 5, 2} {
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("r%di%05d", round, i)
			l := entryLine(id, head, fmt.Sprintf("round %d entry %d", round, i))
			e.mustAppend("alice", "conv1", head, l)
			want, head = append(want, l), id
		}
		r, got := e.openAll("alice", "conv1")
		if !r.OK || strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("round %d: open read %d entries, want %d: %+v", round, len(got), len(want), r.Error)
		}
	}
	if r := e.req("alice", "delete", map[string]any{"id": "conv1"}); !r.OK {
		t.Fatalf("delete: %+v", r.Error)
	}
	if r := e.req("alice", "open", map[string]any{"id": "conv1"}); r.code() != "not_found" {
		t.Fatalf("open after delete: %s, want not_found", r.code())
	}
}

// An append's reply may come before its head is written; the head written afterwards
// catches up with every append (those that came meanwhile written together), never goes
// back, and a conversation deleted meanwhile does not get its head back.
func TestHeadWrittenAfterReply(t *testing.T) {
	cases := []struct {
		name     string
		appends  int
		deleteAt bool // delete right after the last append's reply
	}{
		{"one append", 1, false},
		{"appends one after the other", 40, false},
		{"delete right after", 20, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 0, store.Options{})
			svc := e.addReplica(store.Options{})
			e.create("alice", "conv1")
			head := ""
			for i := 0; i < tc.appends; i++ {
				id := fmt.Sprintf("h%07d", i)
				a := e.mustAppend("alice", "conv1", head, entryLine(id, head, "x"))
				if a.Head == nil || *a.Head != id {
					t.Fatalf("append %d: head %v, want %s", i, a.Head, id)
				}
				head = id
			}
			if tc.deleteAt {
				if r := e.req("alice", "delete", map[string]any{"id": "conv1"}); !r.OK {
					t.Fatalf("delete: %+v", r.Error)
				}
			}
			// Stop waits for the requests at work, the writing of heads included.
			if err := svc.Stop(); err != nil {
				t.Fatal(err)
			}
			r, c := e.reader("alice", "conv1")
			h, _, err := r.Head(ctxFor(t), c)
			if tc.deleteAt {
				if !errors.Is(err, mirror.ErrNotFound) {
					t.Fatalf("head of the deleted conversation: %+v, %v; want none", h, err)
				}
				return
			}
			msgs := e.streamMsgs("alice", "conv1")
			if err != nil || h.Head != head || h.LastSeq != msgs[len(msgs)-1].Seq || h.Entries != int64(tc.appends+1) || h.Writer != mirror.WriterStore {
				t.Fatalf("head %+v (%v), want %s at sequence %d", h, err, head, msgs[len(msgs)-1].Seq)
			}
		})
	}
}
