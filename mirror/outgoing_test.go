package mirror

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/natstest"
)

// outgoingCases are lines whose header values nats.go must trim or sanitise, next to
// ordinary ones.
var outgoingCases = []struct {
	name  string
	line  Line
	body  string
	fence string
}{
	{name: "entry", line: Line{Kind: KindEntry, EntryID: "a1b2c3d4", ParentID: "9f8e7d6c", EntryType: "message",
		Ordinal: 7, Generation: 2, SHA256: "0011", Format: "v3", Host: "host-1", Source: "proj/2026-01-05_x.jsonl"}, body: `{"type":"message"}`},
	{name: "fenced entry", line: Line{Kind: KindEntry, EntryID: "e", EntryType: "message", Ordinal: 3, Generation: 1,
		SHA256: "ab", Format: "v3", Host: "h", Source: "s.jsonl"}, body: "{}", fence: "41"},
	{name: "header line", line: Line{Kind: KindHeader, EntryID: HeaderEntryType, EntryType: HeaderEntryType, Ordinal: 0,
		Generation: 1, SHA256: "cd", Format: "v3", Host: "h", Source: "s.jsonl"}, body: `{"type":"session"}`},
	{name: "blob", line: Line{Kind: KindBlob, EntryID: "b1", EntryType: "message", Ordinal: 9, Generation: 1, SHA256: "ef",
		Format: "v3", Host: "h", Source: "s.jsonl", BlobSize: 1 << 20}},
	{name: "values nats.go trims and sanitises", line: Line{Kind: KindEntry, EntryID: "L5", ParentID: " \tp\n1 ",
		EntryType: "a\r\nb\rc\n", Ordinal: 5, Generation: 3, SHA256: "01", Host: "", Format: "",
		Source: " dir/with space/é😀.jsonl\t"}, body: "raw"},
}

// TestOutgoingSendsWhatNewMsgSends: a line's pooled message, fenced or not, reaches a
// subscriber with the same headers, subject and body as NewMsg's, and HeaderSize is the
// size of the block nats.go sends for it.
func TestOutgoingSendsWhatNewMsgSends(t *testing.T) {
	srv := natstest.Run(t)
	nc := natstest.Connect(t, srv.URL())
	names := DefaultNames()
	c := acmeConv(t)
	sub, err := nc.SubscribeSync(names.StreamSubjects())
	if err != nil {
		t.Fatal(err)
	}
	next := func() *nats.Msg {
		t.Helper()
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, tc := range outgoingCases {
		t.Run(tc.name, func(t *testing.T) {
			want := names.NewMsg(c, tc.line, []byte(tc.body))
			if tc.fence != "" {
				want.Header.Set(fenceKey, tc.fence)
			}
			out := names.NewOutgoing(c, tc.line, []byte(tc.body))
			defer out.Release()
			if err := nc.PublishMsg(want); err != nil {
				t.Fatal(err)
			}
			if err := nc.PublishMsg(out.Msg(tc.fence)); err != nil {
				t.Fatal(err)
			}
			a, b := next(), next()
			if a.Subject != b.Subject || string(a.Data) != string(b.Data) {
				t.Errorf("sent %s %q, want %s %q", b.Subject, b.Data, a.Subject, a.Data)
			}
			if !maps.EqualFunc(a.Header, b.Header, slices.Equal) {
				t.Errorf("headers\n got %q\nwant %q", b.Header, a.Header)
			}
			if tc.fence == "" {
				if got, want := out.HeaderSize(), b.Size()-len(b.Subject)-len(b.Data); got != want {
					t.Errorf("HeaderSize %d, received a block of %d bytes", got, want)
				}
			}
			if out.Msg("").Header.Get(fenceKey) != "" {
				t.Errorf("the line's own message carries a fence: %q", out.Msg("").Header)
			}
			if out.Line != tc.line {
				t.Errorf("Line %+v, want %+v", out.Line, tc.line)
			}
		})
	}
}

// TestOutgoingReused: a released message's map carries the next line's headers and no
// header of the line before it (a blob's size, a parent).
func TestOutgoingReused(t *testing.T) {
	names := DefaultNames()
	c := acmeConv(t)
	for range 50 { // a sync.Pool may drop what it holds; some rounds reuse
		first := names.NewOutgoing(c, outgoingCases[3].line, nil) // blob: Pisync-Blob-Size
		first.Release()
		l := outgoingCases[2].line // header line: no parent, no blob size
		out := names.NewOutgoing(c, l, []byte("x"))
		want := names.NewMsg(c, l, []byte("x"))
		if got := out.Msg(""); !maps.EqualFunc(got.Header, want.Header, slices.Equal) || string(got.Data) != "x" {
			t.Fatalf("reused message %q %q, want %q", got.Header, got.Data, want.Header)
		}
		out.Release()
	}
}

// TestPublishStoresTheLine: through the async publisher and into a stream, a line's
// message is acknowledged and stored with the headers ParseLine reads back.
func TestPublishStoresTheLine(t *testing.T) {
	e := newAsyncEnv(t, AsyncOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := DefaultNames()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "E", Subjects: []string{names.StreamSubjects()}}); err != nil {
		t.Fatal(err)
	}
	c := acmeConv(t)
	notify := make(chan struct{}, 1)
	for i, fence := range []string{"", "1"} {
		l := outgoingCases[0].line
		l.Ordinal, l.EntryID = int64(100+i), fmt.Sprintf("e%d", i) // its own message id
		out := names.NewOutgoing(c, l, []byte("body"))
		p, err := e.ap.Publish(out.Msg(fence), notify)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := wait(t, p, notify, 10*time.Second)
		e.ap.Release(p)
		if err != nil {
			t.Fatalf("fence %q: %v", fence, err)
		}
		raw, err := e.js.Stream(ctx, "E")
		if err != nil {
			t.Fatal(err)
		}
		stored, err := raw.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseLine(stored.Header)
		if err != nil {
			t.Fatal(err)
		}
		if got != l || string(stored.Data) != "body" || stored.Subject != out.Subject {
			t.Errorf("fence %q: stored %+v %q on %s, want %+v %q on %s", fence, got, stored.Data, stored.Subject, l, "body", out.Subject)
		}
		out.Release()
	}
}

// TestOwnEntryID: a line stored under its ordinal (no id of its own) has none; any other
// id is the line's, "L" ids of another ordinal included.
func TestOwnEntryID(t *testing.T) {
	for _, tc := range []struct {
		id      string
		ordinal int64
		want    string
	}{
		{"a1b2c3d4", 3, "a1b2c3d4"},
		{OrdinalID(3), 3, ""},
		{OrdinalID(2), 3, OrdinalID(2)},
		{"", 3, ""},
	} {
		if got := (Line{EntryID: tc.id, Ordinal: tc.ordinal}).OwnEntryID(); got != tc.want {
			t.Errorf("OwnEntryID of %q at ordinal %d = %q, want %q", tc.id, tc.ordinal, got, tc.want)
		}
	}
}
