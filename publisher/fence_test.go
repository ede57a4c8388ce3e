package publisher

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// TestFenceOnFirstUnresolvedLine: fence puts the expected subject sequence on the first
// unresolved line of a file only, and on a back-fill's lines only until the file has an
// acknowledgement of its own (onewriter.go). The fence goes into the header block of
// that one send: the line's message, which a publish in flight may still read (nats.go's
// retry after "no responders", the data race CI once saw), never changes.
func TestFenceOnFirstUnresolvedLine(t *testing.T) {
	const key = jetstream.ExpectedLastSubjSeqHeader
	tests := []struct {
		name   string
		first  bool   // the item is the first of the queue
		acked  uint64 // st.acked.StreamSeq
		fenced uint64 // st.fenceSeq
		on     bool
		live   bool   // appended since the file was opened
		ownAck bool   // a line of the file acknowledged since it was opened
		want   string // the fence sent
	}{
		{name: "first line: fenced on the acknowledged sequence", first: true, acked: 7, on: true, want: "7"},
		{name: "first line, a newer sequence known: fenced on it", first: true, acked: 7, fenced: 9, on: true, want: "9"},
		{name: "not first: no fence", acked: 9, on: true},
		{name: "fencing off (--unfenced): no fence", first: true, acked: 7},
		{name: "nothing acknowledged yet: no fence", first: true, on: true},
		{name: "back-filled line first once the file's lines are acknowledged: no fence", first: true, acked: 7, ownAck: true, on: true},
		{name: "live line first once the file's lines are acknowledged: fenced", first: true, acked: 7, ownAck: true, live: true, on: true, want: "7"},
	}
	owner, err := mirror.NewOwner("acme", "dev")
	if err != nil {
		t.Fatal(err)
	}
	conv, err := mirror.NewConv(owner, "c1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := mirror.DefaultNames().NewOutgoing(conv, mirror.Line{Kind: mirror.KindEntry, EntryID: "e1",
				Ordinal: 3, Generation: 1, SHA256: "ab"}, []byte("x"))
			before := fmt.Sprint(out.Msg("").Header) // sorted by key
			it := &item{out: out}
			st := &fileState{queue: []*item{{}, it}}
			if tc.first {
				st.queue = []*item{it, {}}
			}
			st.acked.StreamSeq, st.fenceSeq, st.ownAck = tc.acked, tc.fenced, tc.ownAck
			if tc.live {
				st.liveFrom = -1 // it ends at 0, past it
			}
			got := fence(st, it, tc.on)
			if got != tc.want {
				t.Fatalf("fence %q, want %q", got, tc.want)
			}
			msg := out.Msg(got)
			if v := msg.Header.Get(key); v != tc.want {
				t.Errorf("header block fenced %q, want %q", v, tc.want)
			}
			if msg.Header.Get(mirror.HdrEntryID) != "e1" || msg.Header.Get(mirror.HdrOrdinal) != "3" || string(msg.Data) != "x" {
				t.Errorf("message changed beyond the fence: %+v", msg)
			}
			if own := fmt.Sprint(out.Msg("").Header); own != before {
				t.Errorf("the line's own headers changed: %s, were %s", own, before)
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
