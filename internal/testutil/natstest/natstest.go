// Package natstest starts real nats-servers for tests: a single JetStream server embedded
// in the test process, restartable on the same store and port, and a 3-node cluster on
// loopback. No test of pisync's correctness runs against a mock of NATS.
package natstest

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Server is one embedded nats-server with JetStream.
type Server struct {
	*server.Server
	opts server.Options
	t    testing.TB
}

// Run starts a JetStream server on a free loopback port with its store in a temporary
// directory; it is shut down when the test ends. The port is the one the server's own
// listener was given (not one found free a moment before, which another process's
// connection could take meanwhile), and a restart binds it again.
func Run(t testing.TB) *Server {
	t.Helper()
	return RunWith(t, nil)
}

// RunWith is Run with options of the test's choosing (TLS, users, accounts…) set by
// configure on top of Run's.
func RunWith(t testing.TB, configure func(*server.Options)) *Server {
	t.Helper()
	opts := server.Options{
		ServerName: "natstest",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   filepath.Join(t.TempDir(), "js"),
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: 1 << 20,
	}
	if configure != nil {
		configure(&opts)
	}
	s := &Server{opts: opts, t: t}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	opts := s.opts
	ns, err := server.NewServer(&opts)
	if err != nil {
		s.t.Fatalf("nats-server: %v", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(20 * time.Second) {
		s.t.Fatalf("nats-server on port %d not ready", s.opts.Port)
	}
	if s.opts.Port == server.RANDOM_PORT {
		s.opts.Port = ns.Addr().(*net.TCPAddr).Port // the port of every restart
	}
	s.Server = ns
}

// URL is the client URL.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.opts.Port) }

// Addr is host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.opts.Port) }

// Options are the options the server was started with.
func (s *Server) Options() server.Options { return s.opts }

// StoreDir is the JetStream store directory.
func (s *Server) StoreDir() string { return s.opts.StoreDir }

// Stop shuts the server down and waits; it is idempotent.
func (s *Server) Stop() {
	if s.Server != nil {
		s.Server.Shutdown()
		s.Server.WaitForShutdown()
		s.Server = nil
	}
}

// Restart starts the server again on the same port and store.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Start starts a stopped server again on the same port and store, for a test that does
// something while it is down.
func (s *Server) Start() {
	s.t.Helper()
	s.start()
}

// Connect dials url and closes the connection when the test ends.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
