package natstest

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Cluster is a 3-node JetStream cluster on loopback, in the test process.
type Cluster struct {
	Nodes []*Server
	t     testing.TB
}

// RunCluster starts n JetStream servers routed to each other and waits until they have
// elected a meta leader.
func RunCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := NewCluster(t, n)
	for _, s := range c.Nodes {
		s.Start()
	}
	c.WaitMetaLeader(30 * time.Second)
	return c
}

// NewCluster configures n JetStream servers routed to each other and starts none of
// them: the test starts each (Server.Start) when it wants, e.g. one first, so that the
// cluster has no meta leader until a second one joins.
func NewCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	dir := t.TempDir()
	clusterPorts := make([]int, n)
	for i := range clusterPorts {
		clusterPorts[i] = FreePort(t)
	}
	var routes []*url.URL
	for _, p := range clusterPorts {
		u, _ := url.Parse(fmt.Sprintf("nats://127.0.0.1:%d", p))
		routes = append(routes, u)
	}
	c := &Cluster{t: t}
	for i := range n {
		opts := server.Options{
			ServerName: fmt.Sprintf("node-%c", 'a'+i),
			Host:       "127.0.0.1",
			Port:       FreePort(t),
			JetStream:  true,
			StoreDir:   filepath.Join(dir, fmt.Sprintf("node-%d", i)),
			NoSigs:     true,
			NoLog:      true,
			MaxPayload: 1 << 20,
			Routes:     routes,
			Cluster: server.ClusterOpts{
				Name: "pisync-test",
				Host: "127.0.0.1",
				Port: clusterPorts[i],
			},
		}
		c.Nodes = append(c.Nodes, &Server{opts: opts, t: t})
	}
	t.Cleanup(c.Stop)
	return c
}

// URLs is the comma-separated client URL list of the running nodes.
func (c *Cluster) URLs() string {
	var us []string
	for _, s := range c.Nodes {
		us = append(us, s.URL())
	}
	return strings.Join(us, ",")
}

// WaitMetaLeader waits until a JetStream meta leader is known.
func (c *Cluster) WaitMetaLeader(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, s := range c.Nodes {
			if s.Server == nil || !s.JetStreamIsLeader() {
				continue
			}
			// A leader alone cannot place an R3 stream: every peer must be known and
			// current ("no suitable peers for placement" otherwise).
			if c.peersCurrent(s) {
				return
			}
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	c.t.Fatalf("no JetStream meta leader with every peer current after %v", timeout)
}

func (c *Cluster) peersCurrent(leader *Server) bool {
	info, err := leader.Jsz(nil)
	if err != nil || info.Meta == nil {
		return false
	}
	running := 0
	for _, n := range c.Nodes {
		if n.Server != nil {
			running++
		}
	}
	current := 0
	for _, p := range info.Meta.Replicas {
		if p.Current && !p.Offline {
			current++
		}
	}
	return current >= running-1
}

// StreamLeader returns the node leading stream (account $G), or nil.
func (c *Cluster) StreamLeader(stream string) *Server {
	for _, s := range c.Nodes {
		if s.Server != nil && s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return s
		}
	}
	return nil
}

// StreamFollower returns a running node that replicates stream (an R3 stream on a
// 3-node cluster: every node does) without leading it, once the stream has a leader; the
// test fails if it has none within timeout.
func (c *Cluster) StreamFollower(stream string, timeout time.Duration) *Server {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if leader := c.StreamLeader(stream); leader != nil {
			for _, node := range c.Nodes {
				if node != leader && node.Server != nil {
					return node
				}
			}
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	c.t.Fatalf("stream %s: no leader with a running follower after %v", stream, timeout)
	return nil
}

// Stop shuts every node down.
func (c *Cluster) Stop() {
	for _, s := range c.Nodes {
		s.Stop()
	}
}
