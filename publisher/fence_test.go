package publisher

import (
	"maps"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestFenceNeverChangesASentMessage: fence puts the expected subject sequence on the
// first unresolved line of a file only, and never changes a message once nats.go has it
// (it.sent): nats.go may still encode it for a retry of its own while a reconciliation
// resends the line fenced otherwise (the data race CI saw before send published a copy
// of every message). A message not sent yet is fenced in place, and one that needs no
// change is sent as it is: a back-fill's lines cost no copy.
func TestFenceNeverChangesASentMessage(t *testing.T) {
	const key = jetstream.ExpectedLastSubjSeqHeader
	tests := []struct {
		name     string
		first    bool   // the item is the first of the queue
		acked    uint64 // st.acked.StreamSeq
		had      string // the message's fence before ("" none)
		sent     bool
		on       bool
		want     string // the fence of the message returned
		wantCopy bool
	}{
		{name: "first line, not sent: fenced in place", first: true, acked: 7, on: true, want: "7"},
		{name: "first line, sent unfenced: fenced on a copy", first: true, acked: 7, sent: true, on: true, want: "7", wantCopy: true},
		{name: "sent fenced on an older sequence: a copy", first: true, acked: 9, had: "7", sent: true, on: true, want: "9", wantCopy: true},
		{name: "sent fenced, no longer first: unfenced copy", acked: 9, had: "7", sent: true, on: true, wantCopy: true},
		{name: "sent fenced as needed: as it is", first: true, acked: 7, had: "7", sent: true, on: true, want: "7"},
		{name: "back-filled line behind the first, sent: as it is", acked: 7, sent: true, on: true},
		{name: "fencing off (--unfenced): no fence", first: true, acked: 7, sent: true},
		{name: "nothing acknowledged yet: no fence", first: true, sent: true, on: true},
		{name: "not sent, fence dropped in place", acked: 7, had: "5", on: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := nats.Header{"Nats-Msg-Id": {"id"}, "Pisync-Kind": {"entry"}}
			if tc.had != "" {
				h.Set(key, tc.had)
			}
			before := maps.Clone(h)
			orig := &nats.Msg{Subject: "s", Header: h, Data: []byte("x")}
			it := &item{msg: orig, sent: tc.sent}
			st := &fileState{queue: []*item{{}, it}}
			if tc.first {
				st.queue = []*item{it, {}}
			}
			st.acked.StreamSeq = tc.acked
			got := fence(st, it, tc.on)
			if got != it.msg {
				t.Fatalf("returned a message that is not the line's")
			}
			if v := got.Header.Get(key); v != tc.want {
				t.Errorf("fence %q, want %q", v, tc.want)
			}
			if (got != orig) != tc.wantCopy {
				t.Errorf("copied %v, want %v", got != orig, tc.wantCopy)
			}
			if tc.sent && !maps.EqualFunc(orig.Header, before, slices.Equal) {
				t.Errorf("the sent message's headers changed: %v, were %v", orig.Header, before)
			}
			if got.Subject != "s" || string(got.Data) != "x" || got.Header.Get("Nats-Msg-Id") != "id" || got.Header.Get("Pisync-Kind") != "entry" {
				t.Errorf("message changed beyond the fence: %+v", got)
			}
		})
	}
}
