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

	"github.com/pisync/pisync/internal/natstest"
)

// TestEncodedPublishIsOn: the header blocks the publisher encodes go to the connection's
// own publish only with the nats.go version whose signature rawpub.go declares. After an
// upgrade this fails: compare nats.go's (*Conn).publish with connPublish's declaration,
// then add the version to EncodedPublish.
func TestEncodedPublishIsOn(t *testing.T) {
	if !EncodedPublish {
		t.Fatalf("nats.go %s: encoded headers go through PublishMsg (a map per line); check (*Conn).publish's signature against connPublish and allow this version", nats.Version)
	}
}

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

// TestOutgoingSendsWhatNewMsgSends: a line's encoded header block, sent by the
// connection's own publish (and by PublishMsg when the version is not one checked),
// reaches a subscriber with the same headers, subject and body as NewMsg's map sent by
// nats.go's PublishMsg.
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
	for _, encoded := range []bool{true, false} {
		for _, tc := range outgoingCases {
			t.Run(map[bool]string{true: "encoded/", false: "fallback/"}[encoded]+tc.name, func(t *testing.T) {
				defer func(was bool) { EncodedPublish = was }(EncodedPublish)
				EncodedPublish = encoded
				want := names.NewMsg(c, tc.line, []byte(tc.body))
				if tc.fence != "" {
					want.Header.Set(fenceKey, tc.fence)
				}
				out := names.NewOutgoing(c, tc.line, []byte(tc.body))
				if err := nc.PublishMsg(want); err != nil {
					t.Fatal(err)
				}
				if err := publishEncoded(nc, &nats.Msg{Subject: out.Subject, Data: out.Data}, out.Header(tc.fence)); err != nil {
					t.Fatal(err)
				}
				a, b := next(), next()
				if a.Subject != b.Subject || string(a.Data) != string(b.Data) {
					t.Errorf("sent %s %q, want %s %q", b.Subject, b.Data, a.Subject, a.Data)
				}
				if !maps.EqualFunc(a.Header, b.Header, slices.Equal) {
					t.Errorf("headers\n got %q\nwant %q", b.Header, a.Header)
				}
				if got := out.Msg(tc.fence); !maps.EqualFunc(got.Header, a.Header, slices.Equal) {
					t.Errorf("Msg's headers\n got %q\nwant %q", got.Header, a.Header)
				}
				if out.Line != tc.line {
					t.Errorf("Line %+v, want %+v", out.Line, tc.line)
				}
			})
		}
	}
}

// TestPublishEncodedStoresTheLine: through the async publisher and into a stream, an
// encoded line is acknowledged and stored with the headers ParseLine reads back, both
// ways of sending it.
func TestPublishEncodedStoresTheLine(t *testing.T) {
	e := newAsyncEnv(t, AsyncOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := DefaultNames()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "E", Subjects: []string{names.StreamSubjects()}}); err != nil {
		t.Fatal(err)
	}
	c := acmeConv(t)
	notify := make(chan struct{}, 1)
	for i, encoded := range []bool{true, false} {
		func() {
			defer func(was bool) { EncodedPublish = was }(EncodedPublish)
			EncodedPublish = encoded
			l := outgoingCases[0].line
			l.Ordinal, l.EntryID = int64(100+i), fmt.Sprintf("e%d", i) // its own message id
			out := names.NewOutgoing(c, l, []byte("body"))
			p, err := e.ap.PublishEncoded(out.Subject, out.Header(""), out.Data, notify)
			if err != nil {
				t.Fatal(err)
			}
			ack, err := wait(t, p, notify, 10*time.Second)
			e.ap.Release(p)
			if err != nil {
				t.Fatalf("encoded=%v: %v", encoded, err)
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
				t.Errorf("encoded=%v: stored %+v %q on %s, want %+v %q on %s", encoded, got, stored.Data, stored.Subject, l, "body", out.Subject)
			}
		}()
	}
}
