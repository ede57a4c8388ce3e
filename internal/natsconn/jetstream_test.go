package natsconn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// TestNotReady: what a cluster coming up answers is waited for; an answer that will not
// change is not.
func TestNotReady(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{fmt.Errorf("bind stream S: %w", context.DeadlineExceeded), true},
		{nats.ErrTimeout, true},
		{nats.ErrNoResponders, true},
		{nats.ErrConnectionReconnecting, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{fmt.Errorf("create stream S: %w", &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement"}), true},
		{jetstream.ErrStreamNotFound, false},
		{&jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "stream name already in use"}, false},
		{context.Canceled, false},
		{errors.New("permissions violation"), false},
	} {
		if got := NotReady(tc.err); got != tc.want {
			t.Errorf("NotReady(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestJetStreamWaitDo: an unready answer is retried until the operation succeeds, with
// the reason shown meanwhile; any other error ends the wait at once; the timeout ends it
// with the last attempt's error.
func TestJetStreamWaitDo(t *testing.T) {
	w := NewJetStreamWait(zap.NewNop(), nil)
	calls := 0
	var seen string
	err := w.Do(context.Background(), time.Minute, "step", func(context.Context) error {
		if calls++; calls < 3 {
			return nats.ErrNoResponders
		}
		seen = w.Reason()
		return nil
	})
	if err != nil || calls != 3 || seen == "" || w.Reason() != "" {
		t.Errorf("Do: %v after %d calls, reason while waiting %q, after %q", err, calls, seen, w.Reason())
	}

	calls = 0
	err = w.Do(context.Background(), time.Minute, "step", func(context.Context) error {
		calls++
		return jetstream.ErrStreamNotFound
	})
	if !errors.Is(err, jetstream.ErrStreamNotFound) || calls != 1 {
		t.Errorf("Do of a lasting refusal: %v after %d calls, want ErrStreamNotFound after 1", err, calls)
	}

	err = w.Do(context.Background(), 500*time.Millisecond, "step", func(context.Context) error {
		return nats.ErrNoResponders
	})
	if !errors.Is(err, nats.ErrNoResponders) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do past its timeout: %v, want the deadline and the last error", err)
	}
}

// TestRetry: a read retried while JetStream is not ready, never cut short, and given up
// at once for any other error or once the wait is over.
func TestRetry(t *testing.T) {
	w := NewJetStreamWait(zap.NewNop(), nil)
	ctx := context.Background()
	calls := 0
	err := w.Retry(ctx, time.Minute, "list", func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); ok {
			t.Error("an attempt was given a deadline")
		}
		if calls++; calls < 3 {
			return fmt.Errorf("list heads: %w", context.DeadlineExceeded)
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("not ready twice, then ready: %v after %d calls", err, calls)
	}
	calls = 0
	permanent := errors.New("no such stream")
	if err := w.Retry(ctx, time.Minute, "list", func(context.Context) error { calls++; return permanent }); !errors.Is(err, permanent) || calls != 1 {
		t.Fatalf("another error: %v after %d calls", err, calls)
	}
	err = w.Retry(ctx, 300*time.Millisecond, "list", func(context.Context) error { return nats.ErrNoResponders })
	if err == nil || !strings.Contains(err.Error(), "JetStream not ready after") {
		t.Fatalf("never ready: %v", err)
	}
}
