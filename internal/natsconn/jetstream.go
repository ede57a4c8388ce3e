package natsconn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// JetStreamWait waits for JetStream to answer once connected. A connection is not
// enough: a cluster that is coming up (no metadata leader yet) or a server restarted a
// moment ago accepts clients before its JetStream answers, and a command that gave up on
// its first request would fail (or, for a fleet restarted after an outage, crash-loop at
// once). It logs one line per change of state and shows the state in its metrics.
type JetStreamWait struct {
	log *zap.Logger
	m   *Metrics

	mu     sync.Mutex
	reason string // why JetStream is not ready; "" once it answered, or before asking
}

// NewJetStreamWait returns a JetStreamWait logging to log; m may be nil.
func NewJetStreamWait(log *zap.Logger, m *Metrics) *JetStreamWait {
	return &JetStreamWait{log: log, m: m}
}

// The waits between attempts: short at first (a leader election takes seconds), at most
// 5 s, so that the command goes on soon after JetStream is back.
const (
	jsFirstWait = 200 * time.Millisecond
	jsMaxWait   = 5 * time.Second
	// jsAttemptTimeout bounds one attempt (the request of a leaderless cluster is never
	// answered); it grows with the attempts, so that a slow cluster gets its time.
	jsAttemptTimeout    = 2 * time.Second
	jsMaxAttemptTimeout = 10 * time.Second
)

// Do runs op until it succeeds, fails for a reason other than JetStream not being ready
// (NotReady), ctx ends, or timeout passes (0: until ctx ends), with exponential backoff
// between attempts. Each attempt runs under a deadline of its own. The error of the last
// attempt is returned, saying how long JetStream was waited for.
func (w *JetStreamWait) Do(ctx context.Context, timeout time.Duration, what string, op func(context.Context) error) error {
	start := time.Now()
	tctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		tctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = jsFirstWait, jsMaxWait, 0
	attempts := 0
	var last error
	err := backoff.RetryNotify(func() error {
		attempts++
		actx, cancel := context.WithTimeout(tctx, min(jsAttemptTimeout*time.Duration(attempts), jsMaxAttemptTimeout))
		defer cancel()
		err := op(actx)
		last = err
		if err != nil && tctx.Err() == nil && !NotReady(err) {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(bo, tctx), func(err error, wait time.Duration) {
		w.notReady(what, err, attempts, wait)
	})
	if err == nil {
		w.ready(what, attempts, time.Since(start))
		return nil
	}
	if last != nil && !errors.Is(err, last) {
		err = fmt.Errorf("%w; the last attempt failed: %w", err, last)
	}
	if NotReady(err) || tctx.Err() != nil {
		return fmt.Errorf("%s: JetStream not ready after %v: %w", what, time.Since(start).Round(time.Millisecond), err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Retry runs op again while it fails because JetStream is not ready (NotReady), for as
// long as timeout from the first attempt (0: until ctx ends), with the backoff of Do.
// Unlike Do it never cuts an attempt short: op is a read whose length grows with what it
// reads (every head of an owner), bounded by its own requests' timeouts.
func (w *JetStreamWait) Retry(ctx context.Context, timeout time.Duration, what string, op func(context.Context) error) error {
	start := time.Now()
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = jsFirstWait, jsMaxWait, timeout
	attempts := 0
	err := backoff.RetryNotify(func() error {
		attempts++
		err := op(ctx)
		if err != nil && ctx.Err() == nil && !NotReady(err) {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(bo, ctx), func(err error, wait time.Duration) {
		w.notReady(what, err, attempts, wait)
	})
	if err == nil {
		w.ready(what, attempts, time.Since(start))
		return nil
	}
	if NotReady(err) {
		return fmt.Errorf("%s: JetStream not ready after %v: %w", what, time.Since(start).Round(time.Millisecond), err)
	}
	return err
}

// Reason says why JetStream is not ready, "" when it answered (or was not asked yet, or
// w is nil).
func (w *JetStreamWait) Reason() string {
	if w == nil {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reason
}

func (w *JetStreamWait) notReady(what string, err error, attempts int, wait time.Duration) {
	w.m.jetStreamNotReady()
	w.mu.Lock()
	first := w.reason == ""
	w.reason = err.Error()
	w.mu.Unlock()
	if first {
		w.log.Warn("JetStream not ready; waiting with backoff", zap.String("step", what), zap.Error(err),
			zap.Duration("retry_in", wait))
		return
	}
	w.log.Debug("JetStream still not ready", zap.String("step", what), zap.Int("attempt", attempts), zap.Error(err),
		zap.Duration("retry_in", wait))
}

func (w *JetStreamWait) ready(what string, attempts int, waited time.Duration) {
	w.m.jetStreamReady()
	w.mu.Lock()
	was := w.reason
	w.reason = ""
	w.mu.Unlock()
	if was != "" {
		w.log.Info("JetStream ready", zap.String("step", what), zap.Int("attempts", attempts), zap.Duration("waited", waited))
	}
}

// NotReady reports whether err says that JetStream cannot answer yet, as opposed to an
// answer that will not change: no reply in time (a cluster without a metadata or stream
// leader, a server busy restoring its streams), no responders, a connection being
// re-established, or the server's "temporarily unavailable", "no suitable peers" (a
// cluster whose nodes are still coming up) and "stream offline".
func NotReady(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) {
		return true
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case jsClusterNotAvail, jsClusterNoPeers, jsStreamOffline:
			return true
		}
	}
	return false
}

// JetStream's codes of an unready cluster (nats-server errors.json).
const (
	jsClusterNoPeers  jetstream.ErrorCode = 10005 // JSClusterNoPeersErrF: no suitable peers for placement
	jsClusterNotAvail jetstream.ErrorCode = 10008 // JSClusterNotAvailErr: JetStream system temporarily unavailable
	jsStreamOffline   jetstream.ErrorCode = 10118 // JSStreamOfflineErr
)
