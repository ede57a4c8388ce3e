package store_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pisync/pisync/store"
)

// part uploads one part of an entry of size bytes with digest sha.
func (e *env) part(owner, id, sha string, size, offset int, data []byte) reply {
	e.t.Helper()
	return e.req(owner, "append", map[string]any{"id": id, "part": map[string]any{
		"sha256": sha, "size": size, "offset": offset, "data": base64.StdEncoding.EncodeToString(data)}})
}

// TestQuotaConversations: an owner at its quota of conversations can neither create nor
// fork one more; another owner can.
func TestQuotaConversations(t *testing.T) {
	m := store.NewMetrics(nil)
	e := newEnv(t, 1, store.Options{MaxConversations: 3, Metrics: m})
	for i := 0; i < 3; i++ {
		e.create("alice", fmt.Sprintf("conv%d", i))
	}
	if r := e.req("alice", "create", map[string]any{"line": headerLine("conv3", "/srv/app")}); r.code() != "too_large" || r.Error.Reason != "conversations" {
		t.Fatalf("create past the quota: %s %+v", r.code(), r.Error)
	}
	if r := e.req("alice", "fork", map[string]any{"source": "conv0", "line": headerLine("conv4", "/srv/app")}); r.code() != "too_large" || r.Error.Reason != "conversations" {
		t.Fatalf("fork past the quota: %s %+v", r.code(), r.Error)
	}
	e.create("bob", "conv3")
	if n := testutil.ToFloat64(m.Quota("conversations")); n != 2 {
		t.Fatalf("pisync_store_quota_refusals_total{quota=conversations} %v, want 2", n)
	}
}

// TestQuotaParts: the bytes an owner has waiting in uploaded parts are bounded; a part
// sent again counts once.
func TestQuotaParts(t *testing.T) {
	m := store.NewMetrics(nil)
	e := newEnv(t, 1, store.Options{MaxPartBytes: 700 << 10, Metrics: m})
	e.create("alice", "conv1")
	big := []byte(strings.Repeat("p", 2*store.PartSize))
	sum := sha256.Sum256(big)
	sha := hex.EncodeToString(sum[:])
	for i := 0; i < 2; i++ {
		if r := e.part("alice", "conv1", sha, len(big), 0, big[:store.PartSize]); !r.OK {
			t.Fatalf("part (attempt %d): %+v", i, r.Error)
		}
	}
	r := e.part("alice", "conv1", sha, len(big), store.PartSize, big[store.PartSize:])
	if r.code() != "too_large" || r.Error.Reason != "parts" {
		t.Fatalf("part past the quota: %s %+v", r.code(), r.Error)
	}
	if n := testutil.ToFloat64(m.Quota("parts")); n != 1 {
		t.Fatalf("pisync_store_quota_refusals_total{quota=parts} %v, want 1", n)
	}
}

// TestPartsExpire: a part no append uses is deleted once older than the part TTL.
func TestPartsExpire(t *testing.T) {
	m := store.NewMetrics(nil)
	e := newEnv(t, 1, store.Options{PartTTL: 100 * time.Millisecond, PartSweep: 20 * time.Millisecond, Metrics: m})
	e.create("alice", "conv1")
	data := []byte(strings.Repeat("q", 1000))
	sum := sha256.Sum256(data)
	sha := hex.EncodeToString(sum[:])
	if r := e.part("alice", "conv1", sha, len(data), 0, data); !r.OK {
		t.Fatalf("part: %+v", r.Error)
	}
	obj, err := e.js.ObjectStore(ctxFor(t), e.names.BlobsBucket())
	if err != nil {
		t.Fatal(err)
	}
	name := "t1.alice." + sha + ".part.0"
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Deleted, then counted: both are waited for.
		_, err := obj.GetInfo(ctxFor(t), name)
		if errors.Is(err, jetstream.ErrObjectNotFound) && testutil.ToFloat64(m.PartsExpired()) >= 1 {
			break
		}
		if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("part %s still there (or not counted) after its TTL", name)
		}
		time.Sleep(10 * time.Millisecond) // the interval of a poll with a deadline
	}
	r := e.req("alice", "append", map[string]any{"id": "conv1", "expectedHead": nil, "blob": map[string]any{"sha256": sha, "size": len(data)}})
	if r.code() != "not_found" {
		t.Fatalf("append of expired parts: %s", r.code())
	}
}
