package publisher

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// Back-pressure from the cluster. A stream or account at its limit (discard new), a
// server short of storage, or acknowledgements slower than the ack timeout are not the
// line's fault: they refuse every line alike and go away when the cluster has room
// again. Such a refusal never quarantines a line. Every refused line is resent with its
// message id by its file's reconciliation, so nothing is lost or stored twice.
//
// A full cluster stores nothing until it has room: the whole host slows down. New
// publishes wait at a gate, one probe goes through per pause, the pause grows
// (retryBackoff) while the probes are refused, and the first probe acknowledged opens
// the gate for everyone. Slow acknowledgements are reported the same way but hold
// nothing back beyond the files that timed out (each on its own backoff, as any
// failure): the cluster is storing, only late, and one probe per pause would turn an
// election of a few seconds into minutes of a trickle.

// The reasons of back-pressure (the reason label of the metrics).
const (
	pressureMaxBytes        = "max_bytes"              // the stream's max_bytes, discard new
	pressureMaxMsgs         = "max_msgs"               // the stream's max_msgs, discard new
	pressureMaxMsgsSubject  = "max_msgs_per_subject"   // one conversation at the stream's per-subject limit
	pressureAccount         = "account_limit"          // the account's storage limit
	pressureResources       = "insufficient_resources" // the server's own storage or memory limit
	pressureSlowAcks        = "slow_acks"              // connected, but the acknowledgement came later than the ack timeout
	jsStoreFailed           = 10077                    // JSStreamStoreFailedF: the store refused the message ({err})
	jsAccountResources      = 10002                    // JSAccountResourcesExceededErr
	jsInsufficientResources = 10023                    // JSInsufficientResourcesErr
	jsStorageResources      = 10047                    // JSStorageResourcesExceededErr
	jsMemoryResources       = 10028                    // JSMemoryResourcesExceededErr
)

// pressureReasons are exported at 0 from the start, so that an alert can tell "none"
// from "no data".
var pressureReasons = []string{pressureMaxBytes, pressureMaxMsgs, pressureMaxMsgsSubject,
	pressureAccount, pressureResources, pressureSlowAcks}

// clusterPressure names the reason when err says the cluster has no room for any line
// now, "" otherwise. connected tells a slow acknowledgement from one lost in an outage
// (the outage has its own metrics and alert).
func clusterPressure(err error, connected bool) string {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsStoreFailed:
			// The description is the store's error; the order matters, "maximum messages
			// per subject exceeded" contains "maximum messages".
			d := apiErr.Description
			switch {
			case strings.Contains(d, "maximum bytes exceeded"):
				return pressureMaxBytes
			case strings.Contains(d, "maximum messages per subject exceeded"):
				return pressureMaxMsgsSubject
			case strings.Contains(d, "maximum messages exceeded"):
				return pressureMaxMsgs
			}
		case jsAccountResources:
			return pressureAccount
		case jsInsufficientResources, jsStorageResources, jsMemoryResources:
			return pressureResources
		}
		return ""
	}
	if connected && (errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded)) {
		return pressureSlowAcks
	}
	return ""
}

// hostWide reports whether a reason concerns the whole host, not only one conversation:
// a conversation at its per-subject limit is retried on its own file's backoff, and
// neither reported as the host's back-pressure nor stops the others.
func hostWide(reason string) bool {
	return reason != "" && reason != pressureMaxMsgsSubject
}

// holdsHost reports whether a reason closes the gate: the cluster stores nothing more
// until it has room (see above for slow acknowledgements).
func holdsHost(reason string) bool {
	return hostWide(reason) && reason != pressureSlowAcks
}

// Backpressure is the cluster's back-pressure as the status page shows it.
type Backpressure struct {
	Active       bool       `json:"active"`
	Reason       string     `json:"reason,omitempty"`
	Error        string     `json:"error,omitempty"` // the server's last refusal
	Since        *time.Time `json:"since,omitempty"`
	PauseSeconds float64    `json:"pause_seconds"` // between probes, growing while they are refused (0: nothing held back)
	Probes       int64      `json:"probes"`        // publishes let through to test the cluster, this episode
	Throttled    int64      `json:"throttled"`     // publishes refused for lack of room, this episode
	Episodes     int64      `json:"episodes"`      // since start
}

// gate holds the host's publishes back while the cluster pushes back.
//
// Epochs tell a probe's answer from the answers to the publishes already in flight when
// the cluster began to refuse: the epoch moves on at every pause decided, each publish
// carries the epoch it was sent in, and only a publish sent in the current epoch can
// lengthen the pause (refused) or open the gate (acknowledged). A window of 1,024 lines
// refused at once is one step of the backoff, not ten.
type gate struct {
	m   *Metrics
	log *zap.Logger

	active atomic.Bool   // the cluster pushes back (reported)
	closed atomic.Bool   // and publishes wait at the gate: the fast path of every publish
	epoch  atomic.Uint64 // read by every publish

	mu      sync.Mutex
	reason  string
	lastErr string
	since   time.Time
	until   time.Time // no probe before
	pause   time.Duration
	bo      *retryBackoff
	changed chan struct{} // closed (and replaced) when the gate opens or the pause changes

	probes, throttled, episodes int64
}

func newGate(m *Metrics, log *zap.Logger, retryMax time.Duration) *gate {
	return &gate{m: m, log: log, bo: newRetryBackoff(retryMax), changed: make(chan struct{})}
}

// current is the epoch a publish sent now carries.
func (g *gate) current() uint64 { return g.epoch.Load() }

// refused records a publish sent in epoch the cluster refused for reason (host-wide):
// the gate closes, and if no pause was decided since the publish was sent, the next
// pause is decided, longer than the last.
func (g *gate) refused(reason string, err error, epoch uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	g.throttled++
	g.lastErr = err.Error()
	if g.active.Load() && epoch != g.epoch.Load() {
		return // in flight before the current pause was decided: the same refusal again
	}
	if !g.active.Load() {
		g.active.Store(true)
		g.since, g.probes, g.throttled = now, 0, 1
		g.episodes++
		g.bo.reset()
		what := "the cluster has no room for more lines; publishing slows down, nothing is dropped or quarantined"
		if !holdsHost(reason) {
			what = "the cluster acknowledges lines later than the ack timeout; they are checked and resent, nothing is dropped or quarantined"
		}
		g.log.Warn(what, zap.String("reason", reason), zap.Error(err))
	}
	if reason != g.reason {
		if g.reason != "" {
			g.m.backpressure.WithLabelValues(g.reason).Set(0)
		}
		g.reason = reason
		g.m.backpressure.WithLabelValues(reason).Set(1)
	}
	holds := holdsHost(reason)
	g.closed.Store(holds)
	if holds {
		g.pause = g.bo.next()
		g.until = now.Add(g.pause)
	} else {
		g.pause = 0
	}
	g.epoch.Add(1)
	g.m.probePause.Set(g.pause.Seconds())
	g.log.Debug("cluster still refuses; next probe after a longer pause", zap.String("reason", reason),
		zap.Duration("pause", g.pause), zap.Int64("probes", g.probes))
	g.signal()
}

// acknowledged opens the gate when a publish sent in the current epoch (a probe, or
// anything sent since) is acknowledged: the cluster takes lines again.
func (g *gate) acknowledged(epoch uint64) {
	if !g.active.Load() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.active.Load() || epoch != g.epoch.Load() {
		return // an answer to a publish sent before the last refusal proves nothing
	}
	g.open()
}

// answered ends a report of slow acknowledgements when the mirror answers a
// reconciliation's question in time: the lines that timed out were stored, and nothing
// may be left to publish (hence no acknowledgement to wait for). A closed gate waits
// for an acknowledgement: a full cluster answers questions too.
func (g *gate) answered() {
	if !g.active.Load() || g.closed.Load() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active.Load() && !g.closed.Load() {
		g.open()
	}
}

// open ends the back-pressure; the caller holds g.mu.
func (g *gate) open() {
	g.active.Store(false)
	g.closed.Store(false)
	g.m.backpressure.WithLabelValues(g.reason).Set(0)
	g.m.probePause.Set(0)
	g.log.Info("the cluster takes lines again; publishing resumes at full speed", zap.String("reason", g.reason),
		zap.Duration("after", time.Since(g.since).Round(time.Millisecond)), zap.Int64("throttled", g.throttled),
		zap.Int64("probes", g.probes))
	g.reason, g.pause = "", 0
	g.signal()
}

func (g *gate) signal() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// wait returns at once while the gate is open. While it is closed it waits for the gate
// to open, or for the end of the pause: then the caller is the probe, and the others
// wait one more pause for its answer.
func (g *gate) wait(ctx context.Context, closing <-chan struct{}) error {
	for g.closed.Load() {
		g.mu.Lock()
		if !g.closed.Load() {
			g.mu.Unlock()
			return nil
		}
		now := time.Now()
		if !now.Before(g.until) {
			g.until = now.Add(g.pause)
			g.probes++
			g.mu.Unlock()
			return nil
		}
		t := time.NewTimer(g.until.Sub(now))
		changed := g.changed
		g.mu.Unlock()
		select {
		case <-t.C:
		case <-changed:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-closing:
			t.Stop()
			return errors.New("publisher closing")
		}
	}
	return nil
}

// state is the gate as the status page shows it.
func (g *gate) state() Backpressure {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := Backpressure{Active: g.active.Load(), Episodes: g.episodes}
	if !b.Active {
		return b
	}
	since := g.since.UTC()
	b.Reason, b.Error, b.Since = g.reason, g.lastErr, &since
	b.PauseSeconds, b.Probes, b.Throttled = g.pause.Seconds(), g.probes, g.throttled
	return b
}

// Backpressure reports whether the cluster holds publishing back, and why.
func (p *Publisher) Backpressure() Backpressure { return p.gate.state() }
