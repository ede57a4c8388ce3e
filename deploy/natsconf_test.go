package deploy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// natsFiles are the configuration files of deploy/nats.
var natsFiles = []string{
	"node-a.conf", "node-b.conf", "node-c.conf", "common.conf", "cluster.conf",
	"accounts-shared.conf", "accounts-per-tenant.conf",
}

// Placeholders that a deployment adapts and the tests replace.
const (
	tlsPlaceholder   = "/etc/nats/tls/"
	storePlaceholder = "/var/lib/nats/jetstream"
	perTenantInclude = "include ./accounts-per-tenant.conf"
	sharedInclude    = "include ./accounts-shared.conf"
)

// layout is one of the two account layouts of deploy/nats.
type layout string

const (
	perTenant layout = "accounts-per-tenant"
	shared    layout = "accounts-shared"
)

// renderNATS copies deploy/nats into dir with the certificate directory, the store and
// the accounts layout substituted; nothing else of the files changes.
func renderNATS(t *testing.T, dir, tlsDir, storeDir string, l layout) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range natsFiles {
		s := readFile(t, "nats/"+f)
		s = strings.ReplaceAll(s, tlsPlaceholder, filepath.ToSlash(tlsDir)+"/")
		s = strings.ReplaceAll(s, storePlaceholder, filepath.ToSlash(storeDir))
		if l == shared {
			s = strings.ReplaceAll(s, perTenantInclude, sharedInclude)
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

var passwordVar = regexp.MustCompile(`\$(NATS_PASSWORD_[A-Z0-9_]+)`)

// setPasswords gives every password variable of the account files a random value in the
// environment, where nats-server reads it.
func setPasswords(t *testing.T) {
	t.Helper()
	for _, f := range []string{"nats/accounts-shared.conf", "nats/accounts-per-tenant.conf"} {
		for _, m := range passwordVar.FindAllStringSubmatch(readFile(t, f), -1) {
			if os.Getenv(m[1]) != "" {
				continue // set by the caller, or by an enclosing test
			}
			b := make([]byte, 12)
			if _, err := rand.Read(b); err != nil {
				t.Fatal(err)
			}
			t.Setenv(m[1], hex.EncodeToString(b))
		}
	}
}

// password is the password of a user of the account files: the variable named after it.
func password(t *testing.T, user string) string {
	t.Helper()
	v := "NATS_PASSWORD_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_"))
	p := os.Getenv(v)
	if p == "" {
		t.Fatalf("user %s: %s not set (is the user in the account files?)", user, v)
	}
	return p
}

// loadOptions parses a configuration file with nats-server's own parser, in the strict
// mode of `nats-server -t`: warnings (unknown fields, …) fail the test as errors do.
func loadOptions(t *testing.T, path string) *server.Options {
	t.Helper()
	opts := &server.Options{}
	if err := opts.ProcessConfigFile(path); err != nil {
		t.Fatalf("%s: %v", filepath.Base(path), err)
	}
	return opts
}

// testPKI is a CA made for one test, issuing node certificates like gen-certs.sh does.
type testPKI struct {
	cert  *x509.Certificate
	key   *ecdsa.PrivateKey
	pem   []byte
	count int64
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{Organization: []string{"pisync"}, CommonName: "pisync NATS test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), count: 1}
}

// issue writes ca.pem, server-cert.pem and server-key.pem for node into dir: the files
// and names that common.conf and cluster.conf expect under /etc/nats/tls/.
func (p *testPKI) issue(t *testing.T, dir, node string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.count++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.count),
		Subject:      pkix.Name{Organization: []string{"pisync"}, CommonName: node + ".nats.internal"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{node + ".nats.internal", node, "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"ca.pem":          p.pem,
		"server-cert.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"server-key.pem":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// caFile writes the CA certificate for clients.
func (p *testPKI) caFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(f, p.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// freePort finds a free loopback port.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// onLoopback moves a parsed node onto free loopback ports, monitoring off; it returns
// the client URL.
func onLoopback(t *testing.T, opts *server.Options) string {
	t.Helper()
	opts.Host, opts.Port = "127.0.0.1", freePort(t)
	opts.HTTPHost, opts.HTTPPort = "", 0
	opts.NoSigs, opts.NoLog = true, os.Getenv("PISYNC_TEST_NATS_LOG") == ""
	return fmt.Sprintf("tls://127.0.0.1:%d", opts.Port)
}

// startServer starts a parsed configuration in-process.
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	s, err := tryStartServer(t, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryStartServer starts a server that is shut down at the end of the test, or says why
// it did not become ready (a port taken meanwhile, for one).
func tryStartServer(t *testing.T, opts *server.Options) (*server.Server, error) {
	t.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats-server %s: %w", opts.ServerName, err)
	}
	if !opts.NoLog {
		s.ConfigureLogger()
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("nats-server %s not ready", opts.ServerName)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s, nil
}

// violations records the permission errors the server sends to one connection.
type violations struct {
	mu   sync.Mutex
	seen []string // "Publish to <subject>" / "Subscription to <subject>"
}

var violationRE = regexp.MustCompile(`Permissions Violation for (Publish|Subscription) to "([^"]+)"`)

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if m := violationRE.FindStringSubmatch(err.Error()); m != nil {
		v.mu.Lock()
		v.seen = append(v.seen, m[1]+" to "+m[2])
		v.mu.Unlock()
	}
}

func (v *violations) all() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.seen...)
}

// settled returns the refusals of everything nc did before the call. It is a positive
// barrier, not a pause: it publishes to a subject no user may publish to and waits for
// that refusal; the server answers one connection in order and nats.go hands its errors
// over in order, so the refusals of all earlier work have arrived once this one has.
func (v *violations) settled(t *testing.T, nc *nats.Conn) []string {
	t.Helper()
	sentinel := "pisync-test.sentinel." + nats.NewInbox()[len("_INBOX."):]
	if err := nc.Publish(sentinel, nil); err != nil {
		t.Fatal(err)
	}
	v.expect(t, "Publish", "the sentinel publish", func(s string) bool { return s == sentinel })
	v.mu.Lock()
	defer v.mu.Unlock()
	kept := v.seen[:0]
	for _, s := range v.seen {
		if s != "Publish to "+sentinel { // the barrier's own refusal is no finding
			kept = append(kept, s)
		}
	}
	v.seen = kept
	return append([]string(nil), kept...)
}

// expect waits for the server to refuse op ("Publish" or "Subscription") on a subject
// that match accepts.
func (v *violations) expect(t *testing.T, op string, what string, match func(subject string) bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range v.all() {
			if rest, ok := strings.CutPrefix(s, op+" to "); ok && match(rest) {
				return
			}
		}
		time.Sleep(20 * time.Millisecond) // polling interval of a poll-with-deadline
	}
	t.Errorf("server did not refuse %s (%s); refusals seen: %q", what, op, v.all())
}

// connect opens a TLS connection as user and records its permission errors.
func connect(t *testing.T, url, caFile, user string, extra ...nats.Option) (*nats.Conn, *violations) {
	t.Helper()
	v := &violations{}
	opts := append([]nats.Option{
		nats.UserInfo(user, password(t, user)),
		nats.RootCAs(caFile),
		nats.Name("deploy test " + user),
		nats.ErrorHandler(v.handler),
		nats.MaxReconnects(0),
	}, extra...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc, v
}

// TestNATSConfigsParse parses every file of deploy/nats with nats-server's parser, each
// node file with both account layouts, and builds a server from each node's options.
func TestNATSConfigsParse(t *testing.T) {
	setPasswords(t)
	for f, want := range map[string]string{
		"nats/common.conf":  tlsPlaceholder,
		"nats/cluster.conf": tlsPlaceholder,
		"nats/node-a.conf":  perTenantInclude,
		"nats/node-b.conf":  perTenantInclude,
		"nats/node-c.conf":  perTenantInclude,
	} {
		if !strings.Contains(readFile(t, f), want) {
			t.Fatalf("%s no longer contains %q, which the tests substitute; update them together", f, want)
		}
	}
	if !strings.Contains(readFile(t, "nats/common.conf"), storePlaceholder) {
		t.Fatalf("common.conf no longer contains %q", storePlaceholder)
	}
	pki := newPKI(t)
	root := t.TempDir()
	tlsDir := filepath.Join(root, "tls")
	pki.issue(t, tlsDir, "node-a")
	for _, l := range []layout{perTenant, shared} {
		dir := filepath.Join(root, string(l))
		renderNATS(t, dir, tlsDir, filepath.Join(root, "js"), l)
		for _, f := range natsFiles {
			t.Run(string(l)+"/"+f, func(t *testing.T) {
				opts := loadOptions(t, filepath.Join(dir, f))
				if !strings.HasPrefix(f, "node-") {
					return
				}
				node := strings.TrimSuffix(f, ".conf")
				if opts.ServerName != node || !opts.JetStream || opts.Cluster.Name != "pisync" ||
					len(opts.Routes) != 3 || opts.TLSConfig == nil || opts.Cluster.TLSConfig == nil {
					t.Fatalf("%s: server_name %q, jetstream %v, cluster %q, %d routes, client TLS %v, route TLS %v",
						f, opts.ServerName, opts.JetStream, opts.Cluster.Name, len(opts.Routes),
						opts.TLSConfig != nil, opts.Cluster.TLSConfig != nil)
				}
				if opts.MaxPayload != 1<<20 {
					t.Errorf("max_payload %d; pisync's blob threshold assumes 1 MiB", opts.MaxPayload)
				}
				if opts.SystemAccount != "SYS" || len(opts.Accounts) < 2 {
					t.Errorf("system account %q, %d accounts", opts.SystemAccount, len(opts.Accounts))
				}
				s, err := server.NewServer(opts)
				if err != nil {
					t.Fatalf("%s: options refused by the server: %v", f, err)
				}
				s.Shutdown()
			})
		}
	}
}

// TestGenCerts runs gen-certs.sh and checks that what it makes is what the cluster
// needs: one certificate per node, signed by the CA, for server and client use, valid
// for the node's name and loopback.
func TestGenCerts(t *testing.T) {
	requireTool(t, "openssl", "apt-get install -y openssl")
	bash := requireTool(t, "bash", "apt-get install -y bash")
	out := t.TempDir()
	if b, err := exec.Command(bash, "nats/gen-certs.sh", out).CombinedOutput(); err != nil {
		t.Fatalf("gen-certs.sh: %v\n%s", err, b)
	}
	ca := readPEMCert(t, filepath.Join(out, "ca.pem"))
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for _, node := range []string{"node-a", "node-b", "node-c"} {
		cert := readPEMCert(t, filepath.Join(out, node, "server-cert.pem"))
		for _, name := range []string{node + ".nats.internal", "127.0.0.1"} {
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("%s certificate for %s: %v", node, name, err)
				}
			}
		}
		if _, err := os.Stat(filepath.Join(out, node, "server-key.pem")); err != nil {
			t.Error(err)
		}
		if b, err := os.ReadFile(filepath.Join(out, node, "ca.pem")); err != nil || !strings.Contains(string(b), "BEGIN CERTIFICATE") {
			t.Errorf("%s/ca.pem: %v", node, err)
		}
	}
}

func readPEMCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}
