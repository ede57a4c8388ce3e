package main

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// startEmbedded starts a nats-server with JetStream on a store under the state directory,
// listening on listen (loopback by default), so that a fresh machine needs nothing else.
func startEmbedded(listen, stateDir string, log *zap.Logger) (*server.Server, error) {
	host, port, err := parseHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("%w: --nats-listen %v", errUsage, err)
	}
	opts := &server.Options{
		ServerName: "pisync-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(stateDir, "jetstream"),
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
		return nil, fmt.Errorf("embedded nats-server on %s did not start (is the port in use?)", listen)
	}
	log.Info("embedded nats-server started", zap.String("listen", ns.ClientURL()), zap.String("store", opts.StoreDir))
	return ns, nil
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

// connect dials NATS, retrying with backoff until ctx ends or timeout passes (timeout 0:
// until ctx ends). Once connected, the client reconnects forever by itself.
func connect(ctx context.Context, url, name string, timeout time.Duration, log *zap.Logger, m *natsMetrics, extra ...nats.Option) (*nats.Conn, error) {
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
	bo.MaxElapsedTime = timeout
	var lastErr error
	nc, err := backoff.RetryWithData(func() (*nats.Conn, error) {
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			if lastErr == nil {
				log.Warn("cannot reach NATS yet; retrying", zap.String("url", redactURL(url)), zap.Error(err))
			}
			lastErr = err
			return nil, err
		}
		return nc, nil
	}, backoff.WithContext(bo, ctx))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", redactURL(url), err)
	}
	if m != nil {
		m.connected.Set(1)
	}
	return nc, nil
}

// redactURL hides credentials embedded in URLs before they reach a log.
func redactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			u.User = url.User("***")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
