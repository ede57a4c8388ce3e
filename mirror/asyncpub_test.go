package mirror

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pisync/pisync/internal/testutil/natstest"
)

// asyncEnv is a server with a stream "T" on t.> (2-minute duplicate window), a
// connection and an AsyncPublisher on it.
type asyncEnv struct {
	srv *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	ap  *AsyncPublisher
}

func newAsyncEnv(t *testing.T, opts AsyncOptions) *asyncEnv {
	t.Helper()
	srv := natstest.Run(t)
	nc := natstest.Connect(t, srv.URL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Duplicates: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	ap, err := NewAsyncPublisher(nc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ap.Close)
	return &asyncEnv{srv: srv, nc: nc, js: js, ap: ap}
}

// silentOn subscribes on another connection to subj and never answers: a publish there
// gets no acknowledgement (and no "no responders" either).
func silentOn(t *testing.T, url, subj string) {
	t.Helper()
	nc := natstest.Connect(t, url)
	if _, err := nc.Subscribe(subj, func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// wait blocks until p's result is set (notify is the channel it was published with).
func wait(t *testing.T, p *Pending, notify <-chan struct{}, within time.Duration) (jetstream.PubAck, error) {
	t.Helper()
	deadline := time.After(within)
	for {
		if ack, err, ok := p.Result(); ok {
			return ack, err
		}
		select {
		case <-notify:
		case <-deadline:
			t.Fatalf("no result for %s within %s", p.Msg().Subject, within)
		}
	}
}

func TestAsyncPublishAcknowledged(t *testing.T) {
	e := newAsyncEnv(t, AsyncOptions{AckTimeout: 10 * time.Second})
	notify := make(chan struct{}, 1)
	var ps []*Pending
	for i := range 50 {
		p, err := e.ap.Publish(&nats.Msg{Subject: fmt.Sprintf("t.%d", i%3), Data: []byte("x")}, notify)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	for i, p := range ps {
		ack, err := wait(t, p, notify, 10*time.Second)
		if err != nil || ack.Stream != "T" || ack.Sequence != uint64(i+1) || ack.Duplicate {
			t.Fatalf("publish %d: %+v, %v; want stream T, seq %d", i, ack, err, i+1)
		}
		e.ap.Release(p)
	}
	if n := e.ap.Pending(); n != 0 {
		t.Errorf("%d pending after every acknowledgement", n)
	}
}

func TestAsyncPublishDuplicate(t *testing.T) {
	e := newAsyncEnv(t, AsyncOptions{AckTimeout: 10 * time.Second})
	notify := make(chan struct{}, 1)
	send := func() jetstream.PubAck {
		h := nats.Header{}
		h.Set(nats.MsgIdHdr, "id-1")
		p, err := e.ap.Publish(&nats.Msg{Subject: "t.a", Header: h, Data: []byte("x")}, notify)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := wait(t, p, notify, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		e.ap.Release(p)
		return ack
	}
	first, second := send(), send()
	if first.Duplicate || !second.Duplicate || second.Sequence != first.Sequence || second.Stream != "T" {
		t.Errorf("acks %+v then %+v; want the second a duplicate of the first", first, second)
	}
}

// TestAsyncPublishAPIError: a refusal is the *jetstream.APIError nats.go's
// PublishMsgAsync gives for the same publish (the publisher classifies by its code and
// description: pressure.go, quarantine.go, onewriter.go).
func TestAsyncPublishAPIError(t *testing.T) {
	e := newAsyncEnv(t, AsyncOptions{AckTimeout: 10 * time.Second})
	js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	fenced := func() *nats.Msg {
		h := nats.Header{}
		h.Set(jetstream.ExpectedLastSubjSeqHeader, "42")
		return &nats.Msg{Subject: "t.fenced", Header: h, Data: []byte("x")}
	}
	fut, err := js.PublishMsgAsync(fenced())
	if err != nil {
		t.Fatal(err)
	}
	var want error
	select {
	case <-fut.Ok():
		t.Fatal("nats.go: a fenced publish on an empty subject was acknowledged")
	case want = <-fut.Err():
	case <-time.After(10 * time.Second):
		t.Fatal("nats.go: no answer")
	}
	notify := make(chan struct{}, 1)
	p, err := e.ap.Publish(fenced(), notify)
	if err != nil {
		t.Fatal(err)
	}
	_, got := wait(t, p, notify, 10*time.Second)
	var gotAPI, wantAPI *jetstream.APIError
	if !errors.As(got, &gotAPI) || !errors.As(want, &wantAPI) {
		t.Fatalf("got %T %v, nats.go %T %v; want *jetstream.APIError from both", got, got, want, want)
	}
	if *gotAPI != *wantAPI || gotAPI.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Errorf("got %+v, nats.go %+v", *gotAPI, *wantAPI)
	}
}

// TestAsyncPublishFails: a publish without acknowledgement fails with nats.go's error,
// not before nats.go's would.
func TestAsyncPublishFails(t *testing.T) {
	tests := []struct {
		name    string
		subject string        // "quiet.>" has a subscriber that never answers; no stream has "nostream.>"
		want    error         //
		after   time.Duration // the earliest the failure may come
	}{
		{"ack timeout", "quiet.a", jetstream.ErrAsyncPublishTimeout, 300 * time.Millisecond},
		// As nats.go: asked twice more, 250 ms apart, before giving up.
		{"no responders", "nostream.a", jetstream.ErrNoStreamResponse, 2 * noRespondersWait},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newAsyncEnv(t, AsyncOptions{AckTimeout: 300 * time.Millisecond})
			silentOn(t, e.srv.URL(), "quiet.>")
			notify := make(chan struct{}, 1)
			start := time.Now()
			p, err := e.ap.Publish(&nats.Msg{Subject: tt.subject, Data: []byte("x")}, notify)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := wait(t, p, notify, 10*time.Second); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			if d := time.Since(start); d < tt.after {
				t.Errorf("failed after %s, before %s", d, tt.after)
			}
			if n := e.ap.Pending(); n != 0 {
				t.Errorf("%d pending after the failure", n)
			}
			// The next publish is acknowledged as usual.
			p, err = e.ap.Publish(&nats.Msg{Subject: "t.after", Data: []byte("x")}, notify)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := wait(t, p, notify, 10*time.Second); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestAsyncPublishReconnectFailsPending(t *testing.T) {
	e := newAsyncEnv(t, AsyncOptions{AckTimeout: time.Minute})
	silentOn(t, e.srv.URL(), "quiet.>")
	notify := make(chan struct{}, 1)
	var ps []*Pending
	for range 5 {
		p, err := e.ap.Publish(&nats.Msg{Subject: "quiet.a", Data: []byte("x")}, notify)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	e.srv.Restart()
	for _, p := range ps {
		if _, err := wait(t, p, notify, 10*time.Second); !errors.Is(err, nats.ErrDisconnected) {
			t.Fatalf("got %v, want nats.ErrDisconnected", err)
		}
		e.ap.Release(p)
	}
	// After the reconnection, publishing works again through the same subscription.
	deadline := time.Now().Add(20 * time.Second)
	for {
		p, err := e.ap.Publish(&nats.Msg{Subject: "t.back", Data: []byte("x")}, notify)
		if err == nil {
			var ack jetstream.PubAck
			if ack, err = wait(t, p, notify, 20*time.Second); err == nil && ack.Stream == "T" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no acknowledgement after the reconnection: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // the server's stream recovering: poll
	}
}

// TestAsyncPublishNoRespondersThenStream: a stream that appears while a publish waits
// to be retried (its leader elected, in a cluster) takes it.
func TestAsyncPublishNoRespondersThenStream(t *testing.T) {
	e := newAsyncEnv(t, AsyncOptions{AckTimeout: 10 * time.Second})
	notify := make(chan struct{}, 1)
	p, err := e.ap.Publish(&nats.Msg{Subject: "late.a", Data: []byte("x")}, notify)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "LATE", Subjects: []string{"late.>"}}); err != nil {
		t.Fatal(err)
	}
	ack, err := wait(t, p, notify, 10*time.Second)
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Skip("the stream took longer than both retries to appear (a loaded machine)")
	}
	if err != nil || ack.Stream != "LATE" {
		t.Fatalf("got %+v, %v; want acknowledged by LATE", ack, err)
	}
}

func TestAsyncPublishStall(t *testing.T) {
	e := newAsyncEnv(t, AsyncOptions{AckTimeout: 500 * time.Millisecond, MaxPending: 2, StallWait: 100 * time.Millisecond})
	silentOn(t, e.srv.URL(), "quiet.>")
	notify := make(chan struct{}, 1)
	for range 2 {
		if _, err := e.ap.Publish(&nats.Msg{Subject: "quiet.a", Data: []byte("x")}, notify); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if _, err := e.ap.Publish(&nats.Msg{Subject: "t.a", Data: []byte("x")}, notify); !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
		t.Fatalf("third publish at max pending 2: %v, want ErrTooManyStalledMsgs", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("stall gave up after %s, before the stall wait", d)
	}
	// A publish stalled until the two time out goes then.
	stalled := newAsyncEnv(t, AsyncOptions{AckTimeout: 300 * time.Millisecond, MaxPending: 2, StallWait: 10 * time.Second})
	silentOn(t, stalled.srv.URL(), "quiet.>")
	for range 2 {
		if _, err := stalled.ap.Publish(&nats.Msg{Subject: "quiet.a", Data: []byte("x")}, notify); err != nil {
			t.Fatal(err)
		}
	}
	p, err := stalled.ap.Publish(&nats.Msg{Subject: "t.a", Data: []byte("x")}, notify)
	if err != nil {
		t.Fatalf("publish stalled until the pending ones timed out: %v", err)
	}
	ack, err := wait(t, p, notify, 10*time.Second)
	if err != nil || ack.Stream != "T" {
		t.Errorf("got %+v, %v", ack, err)
	}
}

// TestAsyncPublishConcurrent: publishers on several goroutines, each reading its own
// records in publish order on its own notification channel, records reused.
func TestAsyncPublishConcurrent(t *testing.T) {
	e := newAsyncEnv(t, AsyncOptions{AckTimeout: 30 * time.Second, MaxPending: 64})
	const workers, each = 6, 300
	var mu sync.Mutex
	seqs := map[uint64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			notify := make(chan struct{}, 1)
			var inFlight []*Pending
			drain := func(keep int) error {
				for len(inFlight) > keep {
					p := inFlight[0]
					inFlight = inFlight[1:]
					for !p.Done() {
						select {
						case <-notify:
						case <-time.After(30 * time.Second):
							return errors.New("no acknowledgement within 30 s")
						}
					}
					ack, err, _ := p.Result()
					if err != nil {
						return err
					}
					mu.Lock()
					dup := seqs[ack.Sequence]
					seqs[ack.Sequence] = true
					mu.Unlock()
					if dup {
						return fmt.Errorf("sequence %d acknowledged twice", ack.Sequence)
					}
					e.ap.Release(p)
				}
				return nil
			}
			for i := range each {
				h := nats.Header{}
				h.Set(nats.MsgIdHdr, fmt.Sprintf("%d-%d", w, i))
				p, err := e.ap.Publish(&nats.Msg{Subject: fmt.Sprintf("t.%d", w), Header: h, Data: []byte("x")}, notify)
				if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
					if err := drain(0); err != nil {
						errs <- err
						return
					}
					p, err = e.ap.Publish(&nats.Msg{Subject: fmt.Sprintf("t.%d", w), Header: h, Data: []byte("x")}, notify)
				}
				if err != nil {
					errs <- err
					return
				}
				inFlight = append(inFlight, p)
				if err := drain(8); err != nil {
					errs <- err
					return
				}
			}
			if err := drain(0); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(seqs) != workers*each {
		t.Errorf("%d sequences acknowledged, want %d", len(seqs), workers*each)
	}
}

// TestAsyncPublisherEnds: closing the publisher, or its connection (also when the
// publisher itself is never closed), fails what is pending and what is published next,
// and leaves nothing of the publisher running.
func TestAsyncPublisherEnds(t *testing.T) {
	tests := []struct {
		name string
		end  func(*nats.Conn, *AsyncPublisher)
		want error
	}{
		{"publisher closed", func(_ *nats.Conn, ap *AsyncPublisher) { ap.Close(); ap.Close() }, ErrPublisherClosed},
		{"connection closed", func(nc *nats.Conn, _ *AsyncPublisher) { nc.Close() }, nats.ErrConnectionClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := natstest.Run(t)
			silentOn(t, srv.URL(), "quiet.>")
			before := goleak.IgnoreCurrent()
			nc, err := nats.Connect(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			ap, err := NewAsyncPublisher(nc, AsyncOptions{AckTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			notify := make(chan struct{}, 1)
			p, err := ap.Publish(&nats.Msg{Subject: "quiet.a", Data: []byte("x")}, notify)
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			tt.end(nc, ap)
			if _, err := wait(t, p, notify, 10*time.Second); !errors.Is(err, tt.want) {
				t.Errorf("pending publish: %v, want %v", err, tt.want)
			}
			if _, err := ap.Publish(&nats.Msg{Subject: "t.a"}, notify); !errors.Is(err, tt.want) {
				t.Errorf("publish after: %v, want %v", err, tt.want)
			}
			nc.Close()
			goleak.VerifyNone(t, before)
		})
	}
}

func TestParseAck(t *testing.T) {
	a := &AsyncPublisher{}
	tests := []struct {
		in      string
		want    jetstream.PubAck
		wantErr error
		code    jetstream.ErrorCode
	}{
		{in: `{"stream":"PISYNC","seq":12}`, want: jetstream.PubAck{Stream: "PISYNC", Sequence: 12}},
		{in: `{"stream":"PISYNC","seq":12,"duplicate": true}`, want: jetstream.PubAck{Stream: "PISYNC", Sequence: 12, Duplicate: true}},
		{in: `{"stream":"PISYNC","seq":7,"duplicate":true}`, want: jetstream.PubAck{Stream: "PISYNC", Sequence: 7, Duplicate: true}},
		{in: `{"stream":"S","domain":"hub","seq":3}`, want: jetstream.PubAck{Stream: "S", Domain: "hub", Sequence: 3}},
		// Forms the hand parser leaves to encoding/json.
		{in: `{"stream":"S","seq":3,"val":"5"}`, want: jetstream.PubAck{Stream: "S", Sequence: 3, Value: "5"}},
		{in: `{ "stream": "S", "seq": 4 }`, want: jetstream.PubAck{Stream: "S", Sequence: 4}},
		{in: `{"stream":"S\u0041","seq":5}`, want: jetstream.PubAck{Stream: "SA", Sequence: 5}},
		{in: `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 0"}}`, code: 10071},
		{in: `{"stream":"","seq":1}`, wantErr: jetstream.ErrInvalidJSAck},
		{in: `{}`, wantErr: jetstream.ErrInvalidJSAck},
		{in: `not json`, wantErr: jetstream.ErrInvalidJSAck},
		{in: `{"stream":"S","seq":99999999999999999999999}`, wantErr: jetstream.ErrInvalidJSAck},
	}
	for _, tt := range tests {
		got, err := a.parseAckLocked([]byte(tt.in))
		switch {
		case tt.code != 0:
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != tt.code || apiErr.Code != 400 || apiErr.Description != "wrong last sequence: 0" {
				t.Errorf("%s: %v, want an APIError with code %d", tt.in, err, tt.code)
			}
		case tt.wantErr != nil:
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("%s: %+v, %v; want %v", tt.in, got, err, tt.wantErr)
			}
		case err != nil || got != tt.want:
			t.Errorf("%s: %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

// TestParseAckNoAllocation: the server's success form costs no allocation once the
// stream's name is known.
func TestParseAckNoAllocation(t *testing.T) {
	a := &AsyncPublisher{}
	b := []byte(`{"stream":"PISYNC","seq":123456,"duplicate": true}`)
	if _, err := a.parseAckLocked(b); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = a.parseAckLocked(b) }); n != 0 {
		t.Errorf("%v allocations per acknowledgement parsed, want 0", n)
	}
}

// BenchmarkAsyncPublish publishes and reads back acknowledgements in publish order
// with a window of 256, through this type ("core") and through nats.go's
// PublishMsgAsync ("natsgo"); allocs/op count the in-process server's too.
func BenchmarkAsyncPublish(b *testing.B) {
	for _, side := range []string{"core", "natsgo"} {
		b.Run(side, func(b *testing.B) {
			srv := natstest.Run(b)
			nc := natstest.Connect(b, srv.URL())
			js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(30*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.MemoryStorage}); err != nil {
				b.Fatal(err)
			}
			ap, err := NewAsyncPublisher(nc, AsyncOptions{AckTimeout: 30 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer ap.Close()
			msg := &nats.Msg{Subject: "t.a", Data: make([]byte, 256)}
			const window = 256
			notify := make(chan struct{}, 1)
			var ring []*Pending
			var futs []jetstream.PubAckFuture
			b.ReportAllocs()
			for b.Loop() {
				if side == "core" {
					p, err := ap.Publish(msg, notify)
					if err != nil {
						b.Fatal(err)
					}
					ring = append(ring, p)
					if len(ring) >= window {
						p := ring[0]
						ring = ring[1:]
						for !p.Done() {
							<-notify
						}
						ap.Release(p)
					}
					continue
				}
				f, err := js.PublishMsgAsync(msg)
				if err != nil {
					b.Fatal(err)
				}
				futs = append(futs, f)
				if len(futs) >= window {
					f := futs[0]
					futs = futs[1:]
					select {
					case <-f.Ok():
					case err := <-f.Err():
						b.Fatal(err)
					}
				}
			}
		})
	}
}
