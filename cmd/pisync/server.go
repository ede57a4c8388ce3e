package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/embedded"
	"github.com/pisync/pisync/internal/logx"
	"github.com/pisync/pisync/internal/natsconn"
)

// This file wires the connection flags to the packages that do the work: embedded
// (the local server), natsconn (dialing and its metrics) and redact (secrets).

// startEmbedded starts a nats-server with JetStream on a store under the state directory.
// The server has no authentication and no TLS, so it listens on loopback only: another
// --nats-listen address is refused unless --nats-listen-public says it is meant, and even
// then warned about.
func (c *connFlags) startEmbedded(log *zap.Logger) (*server.Server, error) {
	host, port, err := parseHostPort(c.natsListen)
	if err != nil {
		return nil, fmt.Errorf("%w: --nats-listen %v", errUsage, err)
	}
	if !embedded.IsLoopback(host) {
		if !c.listenPublic {
			return nil, fmt.Errorf("%w: --nats-listen %s is not a loopback address: the embedded server has no authentication and no TLS, "+
				"so anyone reaching it could read and change every mirrored session; add --nats-listen-public if that is meant, "+
				"or run a NATS server with accounts and TLS (deploy/nats) and give its URL with --nats", errUsage, c.natsListen)
		}
		log.Warn("the embedded nats-server listens on a non-loopback address without authentication or TLS: whoever reaches it can read and change every mirrored session",
			zap.String("listen", c.natsListen))
	}
	return embedded.Start(log, host, port, filepath.Join(c.stateDir, "jetstream"))
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

// connect dials NATS with the connection flags (URL, credentials, TLS), retrying with
// backoff until ctx ends or timeout passes (timeout 0: until ctx ends). Once connected,
// the client reconnects forever by itself. Every log line of the connection and the
// error returned have the configured secrets replaced by "***".
func (c *connFlags) connect(ctx context.Context, name string, timeout time.Duration, log *zap.Logger, m *natsconn.Metrics, extra ...nats.Option) (*nats.Conn, error) {
	s := logx.NewScrubber(c.secrets())
	log = s.Logger(log)
	opts, err := c.natsOptions(log)
	if err != nil {
		return nil, s.Error(err)
	}
	nc, err := natsconn.Dial(ctx, c.url(), name, timeout, log, m, append(opts, extra...)...)
	return nc, s.Error(err)
}

// secrets are the values that must never appear in a log line or a message: password,
// token and the credentials of the URLs, as given and as decoded or quoted.
func (c *connFlags) secrets() []string {
	return logx.Secrets(c.password.value, c.token.value, c.natsURL)
}
