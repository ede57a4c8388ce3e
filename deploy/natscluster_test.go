package deploy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/mirror"
)

// startCluster renders and starts the nodes on fresh ports; on an error the nodes it
// started are shut down.
func startCluster(t *testing.T, pki *testPKI, root string, nodes []string, attempt int) ([]*server.Server, []string, error) {
	t.Helper()
	clusterPorts := make([]int, len(nodes))
	var routes []*url.URL
	for i := range nodes {
		clusterPorts[i] = freePort(t)
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", clusterPorts[i])})
	}
	optsOf := make([]*server.Options, len(nodes))
	urls := make([]string, len(nodes))
	for i, node := range nodes {
		dir := filepath.Join(root, fmt.Sprintf("%s-%d", node, attempt))
		pki.issue(t, filepath.Join(dir, "tls"), node)
		renderNATS(t, filepath.Join(dir, "conf"), filepath.Join(dir, "tls"), filepath.Join(dir, "jetstream"), perTenant)
		opts := loadOptions(t, filepath.Join(dir, "conf", node+".conf"))
		urls[i] = onLoopback(t, opts)
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", clusterPorts[i]
		opts.Routes = routes
		optsOf[i] = opts
	}
	var servers []*server.Server
	for _, opts := range optsOf {
		s, err := tryStartServer(t, opts)
		if err != nil {
			for _, s := range servers {
				s.Shutdown() // also at cleanup: a second shutdown does nothing
			}
			return nil, nil, err
		}
		servers = append(servers, s)
	}
	return servers, urls, nil
}

// TestNATSClusterR3 starts the three node files of deploy/nats in-process on loopback
// (certificates made for the test, ports moved to free ones, everything else as
// written: route TLS with verification, JetStream, the per-tenant accounts) and checks
// that they form a cluster that provisions pisync's objects with 3 replicas, stores
// lines and serves them back from another node.
func TestNATSClusterR3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	setPasswords(t)
	pki := newPKI(t)
	caFile := pki.caFile(t)
	root := t.TempDir()
	nodes := []string{"node-a", "node-b", "node-c"}
	// The ports are free when chosen but may be taken before the servers listen (other
	// test binaries run beside this one): a node that cannot listen starts the cluster
	// again on fresh ports.
	var servers []*server.Server
	var urls []string
	for attempt := 1; ; attempt++ {
		var err error
		servers, urls, err = startCluster(t, pki, root, nodes, attempt)
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("attempt %d: %v; again on fresh ports", attempt, err)
	}
	waitUntil(t, 30*time.Second, "routes between the 3 nodes", func() error {
		for i, s := range servers {
			if n := s.NumRoutes(); n < 2 {
				return fmt.Errorf("%s has %d routes", nodes[i], n)
			}
		}
		return nil
	})

	nc, _ := connect(t, urls[0], caFile, "acme-admin")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := mirror.DefaultNames()
	waitUntil(t, 60*time.Second, "provisioning with 3 replicas", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return mirror.Provision(ctx, js, names, mirror.Config{Replicas: 3})
	})
	owner, err := mirror.NewOwner("acme", "alice")
	if err != nil {
		t.Fatal(err)
	}
	conv, err := mirror.NewConv(owner, "c0ffee00-0000-4000-8000-000000000001")
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]byte
	var seqs []uint64
	for i := range 20 {
		line := fmt.Appendf(nil, `{"type":"message","id":"%08x","parentId":null,"timestamp":"2025-01-01T00:00:00Z"}`, i+1)
		msg := names.NewMsg(conv, mirror.Line{Kind: mirror.KindEntry, EntryID: fmt.Sprintf("%08x", i+1),
			EntryType: "message", Ordinal: int64(i + 1), Generation: 1, SHA256: sha(line), Format: "v3",
			Host: "test", Source: "s.jsonl"}, line)
		var ack *jetstream.PubAck
		waitUntil(t, 20*time.Second, "publish", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			ack, err = js.PublishMsg(ctx, msg)
			return err
		})
		lines, seqs = append(lines, line), append(seqs, ack.Sequence)
	}

	// Read back through another node, once all three replicas are current.
	nc3, _ := connect(t, urls[2], caFile, "acme-admin")
	js3, err := jetstream.New(nc3)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	waitUntil(t, 30*time.Second, "3 current replicas", func() error {
		s, err := js3.Stream(ctx, names.Stream())
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
			return fmt.Errorf("replicas %d, cluster %+v", info.Config.Replicas, info.Cluster)
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current {
				return fmt.Errorf("replica %s not current", r.Name)
			}
		}
		if info.State.Msgs != uint64(len(lines)) {
			return fmt.Errorf("%d messages, want %d", info.State.Msgs, len(lines))
		}
		return nil
	})
	s, err := js3.Stream(ctx, names.Stream())
	if err != nil {
		t.Fatal(err)
	}
	for i, seq := range seqs {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		if !bytes.Equal(m.Data, lines[i]) || m.Subject != names.Subject(conv) {
			t.Fatalf("message %d: %s on %s", seq, m.Data, m.Subject)
		}
	}
	for _, bucket := range []string{"KV_" + names.HeadsBucket(), "OBJ_" + names.BlobsBucket()} {
		st, err := js3.Stream(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("%s: %d replicas", bucket, r)
		}
	}
}

// waitUntil retries fn until it succeeds or the timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(200 * time.Millisecond) // polling interval of a poll-with-deadline
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
