// Package embedded runs the nats-server with JetStream that `pisync run` starts when no
// NATS URL is given, so that a fresh machine needs nothing else.
package embedded

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
)

// Start starts a nats-server with JetStream listening on host:port, with its store in
// storeDir (created 0700: it holds a copy of every mirrored session), and waits until
// it accepts connections. The server has no authentication and no TLS: callers listen
// on loopback (IsLoopback) unless told otherwise. Shutdown is the caller's.
func Start(log *zap.Logger, host string, port int, storeDir string) (*server.Server, error) {
	if err := os.MkdirAll(storeDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", storeDir, err)
	}
	opts := &server.Options{
		ServerName: "pisync-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   storeDir,
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
		return nil, fmt.Errorf("embedded nats-server on %s did not start (is the port in use?)", net.JoinHostPort(host, fmt.Sprint(port)))
	}
	log.Info("embedded nats-server started", zap.String("listen", ns.ClientURL()), zap.String("store", opts.StoreDir))
	return ns, nil
}

// IsLoopback reports whether a listen host is a loopback address. An empty host or an
// unspecified address (0.0.0.0, ::) listens on every interface.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
