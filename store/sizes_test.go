package store_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/store"
)

// mirrorLines publishes lines as the daemon mirrors a file: line 0 the header.
func (e *env) mirrorLines(owner, id string, lines []string) {
	e.t.Helper()
	o, _ := mirror.NewOwner("t1", owner)
	c, _ := mirror.NewConv(o, id)
	for i, l := range lines {
		sum := sha256.Sum256([]byte(l))
		kind, eid, typ, parent := mirror.KindEntry, "", "message", ""
		if i == 0 {
			kind, eid, typ = mirror.KindHeader, mirror.HeaderEntryType, mirror.HeaderEntryType
		} else {
			env, err := session.ScanEntry([]byte(l))
			if err != nil {
				e.t.Fatal(err)
			}
			eid, parent = env.ID, env.ParentID
		}
		ml := mirror.Line{Kind: kind, EntryID: eid, ParentID: parent, EntryType: typ, Ordinal: int64(i), Generation: 1,
			SHA256: hex.EncodeToString(sum[:]), Format: "v3", Host: "laptop", Source: "--srv-app--/x_" + id + ".jsonl"}
		if _, err := e.js.PublishMsg(ctxFor(e.t), e.names.NewMsg(c, ml, []byte(l))); err != nil {
			e.t.Fatal(err)
		}
	}
}

func headerWithMetadata(id string, metaBytes int) string {
	return fmt.Sprintf(`{"type":"session","version":3,"id":%q,"timestamp":"2026-12-01T18:00:00.000Z","cwd":"/srv/app","metadata":{"note":%q}}`,
		id, strings.Repeat("m", metaBytes))
}

// TestListPagedInBytes: a list reply holds as many sessions as fit max_payload, metadata
// included, not a fixed count; every session is listed once over the pages.
func TestListPagedInBytes(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	const n = 400
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("conv%04d", i)
		if r := e.req("alice", "create", map[string]any{"line": headerWithMetadata(id, 3000)}); !r.OK {
			t.Fatalf("create %s: %+v", id, r.Error)
		}
	}
	seen := map[string]bool{}
	pages := 0
	for offset := 0; ; pages++ {
		var r struct {
			OK       bool         `json:"ok"`
			Sessions []store.Meta `json:"sessions"`
			Next     int          `json:"next"`
		}
		raw := e.reqRaw("alice", "list", map[string]any{"offset": offset})
		if err := json.Unmarshal(raw, &r); err != nil || !r.OK {
			t.Fatalf("list at %d: %s", offset, raw)
		}
		for _, m := range r.Sessions {
			if seen[m.ID] || len(m.Metadata) < 3000 {
				t.Fatalf("session %s listed twice or without its metadata", m.ID)
			}
			seen[m.ID] = true
		}
		if r.Next == 0 {
			break
		}
		offset = r.Next
	}
	if len(seen) != n || pages < 1 {
		t.Fatalf("listed %d sessions in %d pages, want %d in more than one", len(seen), pages+1, n)
	}
}

// TestOpenBoundedWithLargeMeta: the first reply of open carries the metadata; an entry
// that would not fit beside it goes by reference, read in parts.
func TestOpenBoundedWithLargeMeta(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	lines := []string{
		headerWithMetadata("big", 800<<10),
		entryLine("a1b2c3d4", "", strings.Repeat("x", 250<<10)),
		entryLine("b2c3d4e5", "a1b2c3d4", "small"),
		entryLine("c3d4e5f6", "b2c3d4e5", strings.Repeat("y", 300<<10)),
	}
	e.mirrorLines("alice", "big", lines)
	first, got := e.openAll("alice", "big")
	if !first.OK || strings.Join(got, "\n") != strings.Join(lines[1:], "\n") {
		t.Fatalf("open: %s, %d of %d lines", first.code(), len(got), len(lines)-1)
	}
	if l := e.req("alice", "list", map[string]any{}); !l.OK || len(l.Sessions) != 1 {
		t.Fatalf("list: %+v", l.Error)
	}
}

// TestCreateHeaderTooLarge: a header line above the store's limit is refused.
func TestCreateHeaderTooLarge(t *testing.T) {
	e := newEnv(t, 1, store.Options{})
	r := e.req("alice", "create", map[string]any{"line": headerWithMetadata("conv1", 100<<10)})
	if r.code() != "too_large" || r.hdrCode != "413" {
		t.Fatalf("create with 100 KB of metadata: %s %+v", r.code(), r.Error)
	}
	if r := e.req("alice", "open", map[string]any{"id": "conv1"}); r.code() != "not_found" {
		t.Fatalf("open: %s", r.code())
	}
}

// TestReplyAboveMaxPayloadIsAnError: a reply the connection cannot carry (a replica told
// a larger max_payload than the server's) is answered unavailable and counted so, not
// counted ok and lost.
func TestReplyAboveMaxPayloadIsAnError(t *testing.T) {
	m := store.NewMetrics(nil)
	e := newEnv(t, 1, store.Options{MaxPayload: 8 << 20, Metrics: m})
	e.create("alice", "conv1")
	head := ""
	for i := 0; i < 8; i++ {
		id := fmt.Sprintf("e%07d", i)
		e.mustAppend("alice", "conv1", head, entryLine(id, head, strings.Repeat("z", 300<<10)))
		head = id
	}
	r := e.req("alice", "open", map[string]any{"id": "conv1"})
	if r.code() != "unavailable" {
		t.Fatalf("open with a reply above max_payload: %s", r.code())
	}
	if ok, un := testutil.ToFloat64(m.Requests("open", "ok")), testutil.ToFloat64(m.Requests("open", "unavailable")); ok != 0 || un != 1 {
		t.Fatalf("requests_total{op=open}: ok %v, unavailable %v; want 0 and 1", ok, un)
	}
}

// TestSmallMaxPayload: under a server max_payload below the blob threshold, an entry too
// large for one message goes to the object store whatever the threshold says, and its
// parts are read back in replies that fit.
func TestSmallMaxPayload(t *testing.T) {
	const maxPayload = 256 << 10
	e := newEnvWith(t, 1, store.Options{MaxPayload: maxPayload}, func(o *server.Options) { o.MaxPayload = maxPayload })
	e.create("alice", "conv1")
	e.mustAppend("alice", "conv1", "", entryLine("a1b2c3d4", "", "x"))
	mid := entryLine("b2c3d4e5", "a1b2c3d4", strings.Repeat("m", 300<<10)) // above max_payload, below 512 KiB
	sum := sha256.Sum256([]byte(mid))
	sha := hex.EncodeToString(sum[:])
	const part = 128 << 10
	for off := 0; off < len(mid); off += part {
		end := min(off+part, len(mid))
		if r := e.req("alice", "append", map[string]any{"id": "conv1", "part": map[string]any{
			"sha256": sha, "size": len(mid), "offset": off, "data": []byte(mid[off:end])}}); !r.OK {
			t.Fatalf("part at %d: %+v", off, r.Error)
		}
	}
	a := e.req("alice", "append", map[string]any{"id": "conv1", "expectedHead": "a1b2c3d4", "blob": map[string]any{"sha256": sha, "size": len(mid)}})
	if !a.OK {
		t.Fatalf("append of %d bytes under max_payload %d: %s %+v", len(mid), maxPayload, a.code(), a.Error)
	}
	first, got := e.openAll("alice", "conv1")
	if !first.OK || len(got) != 2 || got[1] != mid {
		t.Fatalf("open: %s, %d lines, the large one intact: %v", first.code(), len(got), len(got) == 2 && got[1] == mid)
	}
}

// TestBlobAppendRacingItsRetry: a blob append whose first attempt, on another replica,
// stores the entry and deletes its parts while the retry reads them, answers the retry
// as a duplicate, not not_found (found by the store torture run).
func TestBlobAppendRacingItsRetry(t *testing.T) {
	for _, size := range []int{600 << 10, 200 << 10} { // stored as a blob; stored inline
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			e := newEnv(t, 1, store.Options{})
			e.create("alice", "conv1")
			line := entryLine("a1b2c3d4", "", strings.Repeat("b", size))
			sum := sha256.Sum256([]byte(line))
			sha := hex.EncodeToString(sum[:])
			const part = 128 << 10
			upload := func(upTo int) {
				for off := 0; off < upTo; off += part {
					end := min(off+part, len(line))
					if r := e.req("alice", "append", map[string]any{"id": "conv1", "part": map[string]any{
						"sha256": sha, "size": len(line), "offset": off, "data": []byte(line[off:end])}}); !r.OK {
						t.Fatalf("part at %d: %+v", off, r.Error)
					}
				}
			}
			blob := map[string]any{"id": "conv1", "expectedHead": nil, "blob": map[string]any{"sha256": sha, "size": len(line)}}
			upload(len(line))
			first := e.req("alice", "append", blob)
			if !first.OK {
				t.Fatalf("append: %+v", first.Error)
			}
			// What the retry finds while the first attempt deletes the parts: the first of
			// them still there, the others gone.
			upload(part)
			again := e.req("alice", "append", blob)
			if !again.OK || !again.Duplicate || again.Seq != first.Seq {
				t.Fatalf("append again while its parts are deleted: %s %+v, want ok duplicate at %d", again.code(), again.Error, first.Seq)
			}
		})
	}
}
