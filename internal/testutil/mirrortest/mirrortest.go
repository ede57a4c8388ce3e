// Package mirrortest builds mirrored conversations for tests: files classified line by
// line the way the publisher does, heads the way the daemon records them, and a
// provisioned mirror on a real embedded nats-server to publish them to.
package mirrortest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// Root is the root recorded in the heads of test conversations (never written to: tests
// that write pass their own root).
const Root = "/srv/pi/sessions"

// ReadLines reads a file's complete lines, without their newlines.
func ReadLines(t testing.TB, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return session.SplitLines(b)
}

// JoinLines is the file holding lines, each ended by a newline.
func JoinLines(lines [][]byte) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// Mirrored is a file as the daemon mirrors it.
type Mirrored struct {
	Conv   string // header id
	Source string // path relative to the root, Pi's layout
	Format session.Format
	Msgs   []mirror.Msg // one per line, ordinal order; blob messages have no Data
	Blobs  map[string][]byte
}

// MirrorFile classifies lines like the publisher does: line 1 the header, a line that
// is blank or not a JSON entry raw, lines longer than blobThreshold (if > 0) blobs.
func MirrorFile(t testing.TB, lines [][]byte, gen int, blobThreshold int) Mirrored {
	t.Helper()
	hdr, err := session.ParseHeader(lines[0])
	if err != nil {
		t.Fatalf("header: %v", err)
	}
	m := Mirrored{Conv: hdr.ID, Format: hdr.Format, Blobs: map[string][]byte{},
		Source: session.DirName(hdr.Cwd) + "/" + session.FileName(hdr.Timestamp, hdr.ID)}
	for i, l := range lines {
		ord := int64(i)
		ml := mirror.Line{Ordinal: ord, Generation: gen, SHA256: session.Digest(l), Format: string(hdr.Format), Host: "testhost", Source: m.Source}
		switch env, err := session.ScanEntry(l); {
		case i == 0:
			ml.Kind, ml.EntryID, ml.EntryType = mirror.KindHeader, mirror.HeaderEntryType, mirror.HeaderEntryType
		case session.IsBlank(l) || err != nil:
			ml.Kind, ml.EntryID = mirror.KindRaw, mirror.OrdinalID(ord)
		default:
			ml.Kind, ml.EntryID, ml.ParentID, ml.EntryType = mirror.KindEntry, env.ID, env.ParentID, env.Type
			if env.ID == "" {
				ml.EntryID = mirror.OrdinalID(ord)
			}
		}
		msg := mirror.Msg{Line: ml, Seq: uint64(i + 1), Data: l}
		if blobThreshold > 0 && len(l) > blobThreshold {
			msg.Kind, msg.BlobSize, msg.Data = mirror.KindBlob, int64(len(l)), nil
			m.Blobs[ml.SHA256] = l
		}
		m.Msgs = append(m.Msgs, msg)
	}
	return m
}

// DaemonHead is the head the daemon records after mirroring every line: the leaf by Pi's
// rule over the entry lines.
func DaemonHead(lines [][]byte, m Mirrored, gen int) mirror.Head {
	var leaf session.Leaf
	var size int64
	for i, l := range lines {
		size += int64(len(l)) + 1
		if i == 0 {
			continue
		}
		if env, err := session.ScanEntry(l); err == nil {
			leaf.Apply(env)
		}
	}
	hdr, _ := session.ParseHeader(lines[0])
	return mirror.Head{Conversation: m.Conv, Key: m.Conv, Tenant: "t1", Owner: "alice", Host: "testhost",
		Root: Root, Source: m.Source, Cwd: hdr.Cwd, Format: string(m.Format), Generation: gen,
		Entries: int64(len(lines)), LastOrdinal: int64(len(lines) - 1), LastSeq: uint64(len(lines)),
		Bytes: size, Head: leaf.ID(), UpdatedAt: time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)}
}

// Without drops the messages at the given ordinals.
func Without(msgs []mirror.Msg, drop []int64) []mirror.Msg {
	skip := map[int64]bool{}
	for _, o := range drop {
		skip[o] = true
	}
	var out []mirror.Msg
	for _, m := range msgs {
		if !skip[m.Ordinal] {
			out = append(out, m)
		}
	}
	return out
}

// Mirror is a provisioned mirror on a real embedded nats-server.
type Mirror struct {
	JS     jetstream.JetStream
	Names  mirror.Names
	Owner  mirror.Owner
	Reader *mirror.Reader
	Writer *mirror.Writer
}

// New starts an embedded server and provisions a mirror for tenant t1, owner alice.
func New(t *testing.T) *Mirror {
	t.Helper()
	srv := natstest.Run(t)
	return For(t, srv.URL(), "t1", "alice")
}

// Provision provisions the mirror for a test, asking again where a cluster under load
// answers late or not yet: each ask has 10 s (right after a node came back a reply can be
// lost, and one lost reply must not wait out the test's context), and "no suitable peers
// for placement" (a peer the meta leader has not heard from yet) is asked again too, for
// up to a minute in all.
func Provision(t testing.TB, ctx context.Context, js jetstream.JetStream, names mirror.Names, cfg mirror.Config) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := mirror.Provision(pctx, js, names, cfg)
		cancel()
		if err == nil {
			return
		}
		var apiErr *jetstream.APIError
		retry := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
			errors.As(err, &apiErr) && apiErr.ErrorCode == noSuitablePeers
		if !retry || ctx.Err() != nil || time.Now().After(deadline) {
			t.Fatalf("provision the mirror: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the peer's next heartbeat
	}
}

// noSuitablePeers is nats-server's JSClusterNoPeersErrF ("no suitable peers for
// placement"), which nats.go has no constant for.
const noSuitablePeers = 10005

// For provisions the mirror on the server at url (if needed) and binds it to an owner.
func For(t *testing.T, url, tenant, owner string) *Mirror {
	t.Helper()
	nc := natstest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := Ctx(t)
	names := mirror.DefaultNames()
	Provision(t, ctx, js, names, mirror.Config{})
	o, err := mirror.NewOwner(tenant, owner)
	if err != nil {
		t.Fatal(err)
	}
	r, err := mirror.NewReader(ctx, js, names, o)
	if err != nil {
		t.Fatal(err)
	}
	w, err := mirror.NewWriter(ctx, js, names, o)
	if err != nil {
		t.Fatal(err)
	}
	return &Mirror{JS: js, Names: names, Owner: o, Reader: r, Writer: w}
}

// Ctx is a context cancelled at the end of the test, or after a minute.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Publish stores msgs of m (blobs first, as the publisher does) and, if given, the head.
func (tm *Mirror) Publish(t *testing.T, m Mirrored, msgs []mirror.Msg, head *mirror.Head) {
	t.Helper()
	ctx := Ctx(t)
	conv, err := mirror.NewConv(tm.Owner, m.Conv)
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range msgs {
		if msg.Kind == mirror.KindBlob {
			if _, err := tm.Writer.PutBlob(ctx, msg.SHA256, bytes.NewReader(m.Blobs[msg.SHA256])); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tm.JS.PublishMsg(ctx, tm.Names.NewMsg(conv, msg.Line, msg.Data)); err != nil {
			t.Fatal(err)
		}
	}
	if head != nil {
		if err := tm.Writer.PutHead(ctx, conv, *head); err != nil {
			t.Fatal(err)
		}
	}
}

// PlantBlob stores b under the object name of digest sha256hex without the writer's
// digest check: a damaged blob, for tests of the readers that must refuse it.
func (tm *Mirror) PlantBlob(t *testing.T, sha256hex string, b []byte) {
	t.Helper()
	ctx := Ctx(t)
	obj, err := tm.JS.ObjectStore(ctx, tm.Names.BlobsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obj.PutBytes(ctx, tm.Owner.ObjectName(sha256hex), b); err != nil {
		t.Fatal(err)
	}
}

// MirrorInput publishes a file's lines whole as generation gen, with its head recorded
// under root.
func (tm *Mirror) MirrorInput(t *testing.T, path string, gen, blobThreshold int, root string) ([][]byte, Mirrored, mirror.Head) {
	t.Helper()
	lines := ReadLines(t, path)
	m := MirrorFile(t, lines, gen, blobThreshold)
	head := DaemonHead(lines, m, gen)
	head.Root = root
	tm.Publish(t, m, m.Msgs, &head)
	return lines, m, head
}

// WriteFile writes b at path, creating its directory.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// FillStream stores n empty messages of another tenant's conversation in the stream and
// waits until the stream holds them. Tests of a lagging replica use it: a replica serves
// direct gets once it holds 90 % of its stream, so with a stream far larger than what a
// restarted node missed, that node answers reads at once, from its store behind the
// leader's.
func FillStream(t testing.TB, ctx context.Context, js jetstream.JetStream, names mirror.Names, n int) {
	t.Helper()
	o, err := mirror.NewOwner("acme", "other")
	if err != nil {
		t.Fatal(err)
	}
	c, err := mirror.NewConv(o, "filler")
	if err != nil {
		t.Fatal(err)
	}
	nc := js.Conn()
	for range n {
		if err := nc.Publish(names.Subject(c), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, names.Stream())
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := stream.Info(ctx)
		if err == nil && info.State.Msgs >= uint64(n) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the stream holds %d of the %d filler messages", info.State.Msgs, n)
		case <-time.After(10 * time.Millisecond): // poll interval
		}
	}
}
