// Package natsconn dials NATS with pisync's connection policy: retries with backoff
// until a deadline, warnings that do not repeat, a hint naming the flag to check, and
// reconnection forever once connected, spread by exponential backoff with full jitter
// (Backoff) and counted in Prometheus metrics.
package natsconn

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/logx"
)

// WarnEvery spaces the warnings of a connection that keeps failing the same way;
// every attempt is logged at debug level.
const WarnEvery = time.Minute

// Dial connects to url (a comma-separated list, credentials allowed) with the given
// options (which may replace the Reconnect policy) and pisync's reconnection policy, retrying with backoff until ctx ends or
// timeout passes (timeout 0: until ctx ends). m may be nil. The error names the URL
// with its credentials hidden and, for the usual causes, the flag to look at.
func Dial(ctx context.Context, url, name string, timeout time.Duration, log *zap.Logger, m *Metrics, extra ...nats.Option) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		Reconnect.Option(),
		nats.ReconnectBufSize(16 << 20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			m.disconnected()
			if err != nil { // nil: our own Close, no news
				log.Warn("disconnected from NATS", zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			m.reconnected()
			log.Info("reconnected to NATS", zap.String("url", nc.ConnectedUrlRedacted()))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("NATS error", zap.Error(err))
		}),
	}
	opts = append(opts, extra...)
	// The first connection waits at most 10 s between attempts: a daemon started by hand
	// should not look hung. Its waits grow for certain (×1.5, ±50 % jitter), so that the
	// retries of one daemon thin out; a fleet started at once is spread by the jitter
	// all the same. Reconnects use full jitter (Reconnect), where the fleet's return
	// after an outage is what must spread.
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 200 * time.Millisecond
	bo.MaxInterval = 10 * time.Second
	bo.MaxElapsedTime = 0 // the deadline is tctx's: the last wait is cut short, not skipped
	tctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		tctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	r := &retryLog{log: log, url: logx.URL(url)}
	nc, err := backoff.RetryNotifyWithData(func() (*nats.Conn, error) {
		nc, err := nats.Connect(url, opts...)
		r.last = err
		return nc, err
	}, backoff.WithContext(bo, tctx), r.failed)
	if err != nil {
		switch {
		case r.last == nil || errors.Is(err, r.last):
		case ctx.Err() != nil: // stopped: say what failed before
			err = fmt.Errorf("%w; the last attempt failed: %w", err, r.last)
		default:
			err = fmt.Errorf("no connection within %v (--connect-timeout): %w", timeout, r.last)
		}
		if h := Hint(err); h != "" {
			return nil, fmt.Errorf("connect to NATS at %s: %w (%s)", r.url, err, h)
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w", r.url, err)
	}
	if r.attempts > 0 {
		log.Info("connected to NATS", zap.String("url", nc.ConnectedUrlRedacted()), zap.Int("failed_attempts", r.attempts))
	}
	m.up()
	return nc, nil
}

// retryLog logs failed connection attempts: the first one and each new error as a
// warning, the same error again at most every WarnEvery, and every attempt at debug
// level with the wait before the next one.
type retryLog struct {
	log      *zap.Logger
	url      string
	last     error
	attempts int
	warned   string
	warnedAt time.Time
}

func (r *retryLog) failed(err error, wait time.Duration) {
	r.attempts++
	r.log.Debug("NATS connection attempt failed", zap.String("url", r.url), zap.Int("attempt", r.attempts),
		zap.Duration("retry_in", wait), zap.Error(err))
	// The same cause can fail in several ways (a refused client certificate is an alert
	// or a broken pipe, depending on who is faster): the hint names the cause.
	hint := Hint(err)
	cause := hint
	if cause == "" {
		cause = err.Error()
	}
	msg := "cannot reach NATS yet; retrying with backoff"
	switch {
	case cause != r.warned:
		r.warned = cause
	case time.Since(r.warnedAt) >= WarnEvery:
		msg = "still cannot reach NATS; retrying with backoff"
	default:
		return
	}
	r.warnedAt = time.Now()
	fields := []zap.Field{zap.String("url", r.url), zap.Int("attempts", r.attempts), zap.Duration("retry_in", wait), zap.Error(err)}
	if hint != "" {
		fields = append(fields, zap.String("hint", hint))
	}
	r.log.Warn(msg, fields...)
}

// Hint says which flag to look at for the usual causes of a failed connection, or ""
// when it does not know the cause.
func Hint(err error) string {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	text := strings.ToLower(err.Error())
	switch {
	case errors.As(err, &unknownCA):
		return "the server's certificate is not signed by a CA this client trusts: give the CA with --tls-ca"
	case errors.As(err, &hostname):
		return "the server's certificate is not valid for the host dialled: dial a name it carries, or set --tls-server-name"
	case errors.As(err, &invalid):
		return "the server's certificate is not valid (expired, or not for a server)"
	case strings.Contains(text, "remote error: tls:"), strings.Contains(text, "closed by remote after tls handshake"):
		// With TLS 1.3 the server checks the client's certificate after the handshake:
		// the client reads its alert, or finds the connection closed, whichever comes
		// first; one hint for both keeps the warnings of a retry loop to one. A
		// certificate of a CA the server does not name is not even sent.
		return "the server refused the client certificate, or got none: set --tls-cert and --tls-key to a valid certificate of a CA the server trusts"
	case strings.Contains(text, "secure connection not available"):
		return "TLS is configured (--tls-*) but the server does not offer it"
	case strings.Contains(text, "secure connection required"):
		return "the server requires TLS: use a tls:// URL, or set --tls-ca"
	case strings.Contains(text, "authorization violation"), strings.Contains(text, "authentication"):
		return "the server refused the credentials: check --nats-user and PISYNC_NATS_PASSWORD, PISYNC_NATS_TOKEN, --nats-nkey or --nats-creds"
	}
	return ""
}
