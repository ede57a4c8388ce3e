package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// startEmbedded starts a nats-server with JetStream on a store under the state directory.
// The server has no authentication and no TLS, so it listens on loopback only: another
// --nats-listen address is refused unless --nats-listen-public says it is meant, and even
// then warned about.
func (c *connFlags) startEmbedded(log *zap.Logger) (*server.Server, error) {
	host, port, err := parseHostPort(c.natsListen)
	if err != nil {
		return nil, fmt.Errorf("%w: --nats-listen %v", errUsage, err)
	}
	if !isLoopback(host) {
		if !c.listenPublic {
			return nil, fmt.Errorf("%w: --nats-listen %s is not a loopback address: the embedded server has no authentication and no TLS, "+
				"so anyone reaching it could read and change every mirrored session; add --nats-listen-public if that is meant, "+
				"or run a NATS server with accounts and TLS (deploy/nats) and give its URL with --nats", errUsage, c.natsListen)
		}
		log.Warn("the embedded nats-server listens on a non-loopback address without authentication or TLS: whoever reaches it can read and change every mirrored session",
			zap.String("listen", c.natsListen))
	}
	store := filepath.Join(c.stateDir, "jetstream")
	if err := os.MkdirAll(store, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", store, err)
	}
	opts := &server.Options{
		ServerName: "pisync-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   store,
		NoSigs:     true,
		NoLog:      true,
		// Session lines up to the blob threshold (512 KiB) plus headers fit in 1 MiB.
		MaxPayload: 1 << 20,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded nats-server on %s did not start (is the port in use?)", c.natsListen)
	}
	log.Info("embedded nats-server started", zap.String("listen", ns.ClientURL()), zap.String("store", opts.StoreDir))
	return ns, nil
}

// isLoopback reports whether a listen host is a loopback address. An empty host or an
// unspecified address (0.0.0.0, ::) listens on every interface.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// secureStateDir makes the state directory private (0700): it holds checkpoints and,
// with the embedded server, a copy of every mirrored session. It warns only when it
// cannot (a directory owned by someone else).
func secureStateDir(log *zap.Logger, dir string) {
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm()&0o077 == 0 {
		return
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		log.Warn("the state directory is accessible by other users and holds a copy of every mirrored session; chmod 700 it",
			zap.String("path", dir), zap.String("mode", fmt.Sprintf("%#o", fi.Mode().Perm())), zap.Error(err))
		return
	}
	log.Info("state directory made private", zap.String("path", dir), zap.String("was", fmt.Sprintf("%#o", fi.Mode().Perm())))
}

// natsMetrics describe the connection.
type natsMetrics struct {
	connected  prometheus.Gauge
	reconnects prometheus.Counter
	disconnect prometheus.Counter
}

func newNATSMetrics(reg prometheus.Registerer) *natsMetrics {
	m := &natsMetrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pisync_nats_connected",
			Help: "1 when the connection to NATS is up, 0 otherwise.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pisync_nats_reconnects_total",
			Help: "Reconnections to NATS after a disconnection.",
		}),
		disconnect: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pisync_nats_disconnects_total",
			Help: "Disconnections from NATS.",
		}),
	}
	reg.MustRegister(m.connected, m.reconnects, m.disconnect)
	return m
}

// connect dials NATS with the connection flags (URL, credentials, TLS), retrying with
// backoff until ctx ends or timeout passes (timeout 0: until ctx ends). Once connected,
// the client reconnects forever by itself. Every log line of the connection and the
// error returned have the configured secrets replaced by "***".
func (c *connFlags) connect(ctx context.Context, name string, timeout time.Duration, log *zap.Logger, m *natsMetrics, extra ...nats.Option) (*nats.Conn, error) {
	s := newScrubber(c.secrets())
	log = s.logger(log)
	opts, err := c.natsOptions(log)
	if err != nil {
		return nil, s.error(err)
	}
	nc, err := dial(ctx, c.url(), name, timeout, log, m, append(opts, extra...)...)
	return nc, s.error(err)
}

// connectWarnEvery spaces the warnings of a connection that keeps failing the same way;
// every attempt is logged at debug level.
const connectWarnEvery = time.Minute

// dial connects to url with the given options and pisync's reconnection policy.
func dial(ctx context.Context, url, name string, timeout time.Duration, log *zap.Logger, m *natsMetrics, extra ...nats.Option) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.ReconnectBufSize(16 << 20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if m != nil {
				m.connected.Set(0)
				m.disconnect.Inc()
			}
			if err != nil { // nil: our own Close, no news
				log.Warn("disconnected from NATS", zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			if m != nil {
				m.connected.Set(1)
				m.reconnects.Inc()
			}
			log.Info("reconnected to NATS", zap.String("url", nc.ConnectedUrlRedacted()))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("NATS error", zap.Error(err))
		}),
	}
	opts = append(opts, extra...)
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
	r := &retryLog{log: log, url: redactURL(url)}
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
		if h := connectHint(err); h != "" {
			return nil, fmt.Errorf("connect to NATS at %s: %w (%s)", r.url, err, h)
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w", r.url, err)
	}
	if r.attempts > 0 {
		log.Info("connected to NATS", zap.String("url", nc.ConnectedUrlRedacted()), zap.Int("failed_attempts", r.attempts))
	}
	if m != nil {
		m.connected.Set(1)
	}
	return nc, nil
}

// retryLog logs failed connection attempts: the first one and each new error as a
// warning, the same error again at most every connectWarnEvery, and every attempt at
// debug level with the wait before the next one.
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
	hint := connectHint(err)
	cause := hint
	if cause == "" {
		cause = err.Error()
	}
	msg := "cannot reach NATS yet; retrying with backoff"
	switch {
	case cause != r.warned:
		r.warned = cause
	case time.Since(r.warnedAt) >= connectWarnEvery:
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

// connectHint says which flag to look at for the usual causes of a failed connection.
func connectHint(err error) string {
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

// splitUserinfo splits a URL into its scheme (with "://", if any), the credentials
// before the last '@' (user[:password] or a token) and the rest. It works on text
// that does not parse as a URL, which is where credentials would otherwise leak.
func splitUserinfo(u string) (scheme, userinfo, rest string) {
	rest = u
	if i := strings.Index(u, "://"); i >= 0 {
		scheme, rest = u[:i+3], u[i+3:]
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		return scheme, rest[:at], rest[at+1:]
	}
	return scheme, "", rest
}

// redactURL hides the credentials in URLs (user, password or token) before they reach a
// log or a message, also in URLs that do not parse.
func redactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if scheme, userinfo, rest := splitUserinfo(p); userinfo != "" {
			parts[i] = scheme + "***@" + rest
		}
	}
	return strings.Join(parts, ",")
}

// secrets are the values that must never appear in a log line or a message: password,
// token and the credentials of the URLs, as given and as decoded or quoted.
func (c *connFlags) secrets() []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if q := strconv.Quote(s); q[1:len(q)-1] != s {
			out = append(out, q[1:len(q)-1])
		}
		if d, err := url.PathUnescape(s); err == nil && d != s {
			out = append(out, d)
		}
	}
	add(c.password.value)
	add(c.token.value)
	for _, u := range strings.Split(c.natsURL, ",") {
		_, userinfo, _ := splitUserinfo(strings.TrimSpace(u))
		add(userinfo)
		if user, pass, ok := strings.Cut(userinfo, ":"); ok {
			add(pass)
		} else {
			add(user) // a token
		}
	}
	return out
}

// minSecretLen is the length from which a secret is scrubbed.
const minSecretLen = 4

// scrubber replaces secrets by "***" in text, errors and log lines.
type scrubber struct{ secrets []string }

func newScrubber(secrets []string) *scrubber {
	s := &scrubber{}
	seen := map[string]bool{}
	for _, v := range secrets {
		// A secret of a few bytes protects nothing, and replacing it everywhere would
		// garble every log line.
		if len(v) >= minSecretLen && !seen[v] {
			seen[v] = true
			s.secrets = append(s.secrets, v)
		}
	}
	// Longest first, so that a secret containing another is replaced whole.
	sort.Slice(s.secrets, func(i, j int) bool { return len(s.secrets[i]) > len(s.secrets[j]) })
	return s
}

func (s *scrubber) scrub(text string) string {
	for _, v := range s.secrets {
		text = strings.ReplaceAll(text, v, "***")
	}
	return text
}

// error returns err with its message scrubbed; errors.Is and errors.As still see the
// original chain.
func (s *scrubber) error(err error) error {
	if err == nil {
		return nil
	}
	if msg := s.scrub(err.Error()); msg != err.Error() {
		return &scrubbedError{msg: msg, err: err}
	}
	return err
}

type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// logger wraps log so that messages and string and error fields are scrubbed.
func (s *scrubber) logger(log *zap.Logger) *zap.Logger {
	if len(s.secrets) == 0 {
		return log
	}
	return log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return &scrubCore{Core: c, s: s} }))
}

type scrubCore struct {
	zapcore.Core
	s *scrubber
}

func (c *scrubCore) With(fields []zapcore.Field) zapcore.Core {
	return &scrubCore{Core: c.Core.With(c.fields(fields)), s: c.s}
}

func (c *scrubCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *scrubCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	e.Message = c.s.scrub(e.Message)
	return c.Core.Write(e, c.fields(fields))
}

// fields scrubs the field types a secret can travel in; pisync logs nothing else near
// a connection.
func (c *scrubCore) fields(fields []zapcore.Field) []zapcore.Field {
	out := make([]zapcore.Field, len(fields))
	for i, f := range fields {
		switch f.Type {
		case zapcore.StringType:
			f.String = c.s.scrub(f.String)
		case zapcore.ByteStringType:
			if b, ok := f.Interface.([]byte); ok {
				f = zap.String(f.Key, c.s.scrub(string(b)))
			}
		case zapcore.ErrorType:
			if err, ok := f.Interface.(error); ok && err != nil {
				f = zap.String(f.Key, c.s.scrub(err.Error()))
			}
		case zapcore.StringerType:
			if st, ok := f.Interface.(fmt.Stringer); ok && st != nil {
				f = zap.String(f.Key, c.s.scrub(st.String()))
			}
		}
		out[i] = f
	}
	return out
}
