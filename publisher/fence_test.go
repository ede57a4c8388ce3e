package publisher

import (
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/natstest"
	"github.com/pisync/pisync/mirror"
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
		live     bool   // appended since the file was opened
		ownAck   bool   // a line of the file acknowledged since it was opened
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
		{name: "back-filled line first once the file's lines are acknowledged: no fence", first: true, acked: 7, ownAck: true, on: true},
		{name: "live line first once the file's lines are acknowledged: fenced", first: true, acked: 7, ownAck: true, live: true, on: true, want: "7"},
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
			st.acked.StreamSeq, st.ownAck = tc.acked, tc.ownAck
			if tc.live {
				st.liveFrom = -1 // it ends at 0, past it
			}
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

// TestBackfillFencedOnce: the lines a file held when it was opened are fenced once, on
// the first line sent, not again each time the file's queue drains while the watcher
// reads on (a window of one message drains it after every line): each such fence makes
// the server read the subject's last message, which costs it far more than the check
// (onewriter.go). Every line appended since the file was opened is fenced, on the line
// before it.
func TestBackfillFencedOnce(t *testing.T) {
	c := newCutOver(t, 4)
	c.window = 1
	c.localAppend(20) // a back-fill of 23 lines: header, 2 + 20 messages
	type sent struct {
		ordinal int64
		fence   string
	}
	var mu sync.Mutex
	var seen []sent
	nc := natstest.Connect(t, c.url)
	sub, err := nc.Subscribe(mirror.DefaultNames().StreamSubjects(), func(m *nats.Msg) {
		ord, _ := strconv.ParseInt(m.Header.Get(mirror.HdrOrdinal), 10, 64)
		mu.Lock()
		seen = append(seen, sent{ord, m.Header.Get(jetstream.ExpectedLastSubjSeqHeader)})
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// fenced returns the ordinals published with a fence since the last call.
	fenced := func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		var out []int64
		for _, s := range seen {
			if s.fence != "" {
				out = append(out, s.ordinal)
			}
		}
		seen = nil
		return out
	}
	c.startDaemon()
	c.waitFileGeneration(1)
	if got := fenced(); len(got) != 0 {
		t.Errorf("back-fill of a new conversation: lines %v fenced, want none (nothing acknowledged before the first)", got)
	}
	for range 3 { // Pi's pace: one line, then the next once it is mirrored
		c.localAppend(1)
		c.waitFileGeneration(1)
	}
	if got, want := fenced(), []int64{23, 24, 25}; !slices.Equal(got, want) {
		t.Errorf("live lines: %v fenced, want %v", got, want)
	}
	c.stopDaemon()
	c.localAppend(4) // held by the file at the next open: a back-fill
	c.startDaemon()
	c.waitFileGeneration(1)
	if got, want := fenced(), []int64{26}; !slices.Equal(got, want) {
		t.Errorf("back-fill after a restart: %v fenced, want %v (its first line only)", got, want)
	}
}
