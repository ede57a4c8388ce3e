package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
)

// secCA is a certificate authority made for one test.
type secCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
	n    int64
}

func newSecCA(t *testing.T, name string) *secCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &secCA{cert: cert, key: key, dir: t.TempDir(), n: 1}
	writePEM(t, ca.file(), "CERTIFICATE", der, 0o644)
	return ca
}

// file is the CA certificate's PEM file.
func (ca *secCA) file() string { return filepath.Join(ca.dir, "ca.pem") }

// issue makes a certificate for name (a server's DNS name, or a client's common name)
// and returns its certificate and key files (the key mode 0600).
func (ca *secCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	return ca.issueWith(t, name, usage, func(*x509.Certificate) {})
}

// issueWith is issue with the template changed by edit.
func (ca *secCA) issueWith(t *testing.T, name string, usage x509.ExtKeyUsage, edit func(*x509.Certificate)) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca.n++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.n), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.DNSNames = []string{name} // no IP: dialling 127.0.0.1 needs --tls-server-name
	}
	edit(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = filepath.Join(ca.dir, fmt.Sprintf("%s-%d-cert.pem", name, ca.n))
	keyFile = filepath.Join(ca.dir, fmt.Sprintf("%s-%d-key.pem", name, ca.n))
	writePEM(t, certFile, "CERTIFICATE", der, 0o644)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder, 0o600)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		t.Fatal(err)
	}
}

// urlOf is the server's URL with scheme (nats, tls).
func urlOf(s *natstest.Server, scheme string) string { return scheme + "://" + s.Addr() }

// mutualTLS makes a server require a certificate of ca from every client.
func mutualTLS(t *testing.T, ca *secCA, serverName string) func(*server.Options) {
	cert, key := ca.issue(t, serverName, x509.ExtKeyUsageServerAuth)
	return func(o *server.Options) {
		cfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key, CaFile: ca.file(), Verify: true})
		if err != nil {
			t.Fatal(err)
		}
		o.TLSConfig, o.TLS, o.TLSVerify, o.TLSTimeout = cfg, true, true, 2
	}
}

// connFlagsOf parses command-line flags into connection flags, as every command does.
func connFlagsOf(t *testing.T, args ...string) *connFlags {
	t.Helper()
	var c connFlags
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.register(fs)
	if err := parseFlags(fs, args); err != nil {
		t.Fatal(err)
	}
	return &c
}

// TestTLSMutual: with the CA, a client certificate and the server name, mTLS works, for
// a connection and for the daemon, which mirrors through it. A missing or foreign client
// certificate, an untrusted server, a name mismatch and a server without TLS each fail
// with an error that says what is wrong and which flag to look at.
func TestTLSMutual(t *testing.T) {
	ca, other := newSecCA(t, "pisync test CA"), newSecCA(t, "someone else's CA")
	srv := natstest.RunWith(t, mutualTLS(t, ca, "nats.test"))
	plain := natstest.Run(t)
	cert, key := ca.issue(t, "acme-alice", x509.ExtKeyUsageClientAuth)
	foreignCert, foreignKey := other.issue(t, "acme-alice", x509.ExtKeyUsageClientAuth)
	expiredCert, expiredKey := ca.issueWith(t, "acme-alice", x509.ExtKeyUsageClientAuth, func(c *x509.Certificate) {
		c.NotBefore, c.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)
	})
	url := urlOf(srv, "tls")
	good := []string{"--nats", url, "--tls-ca", ca.file(), "--tls-cert", cert, "--tls-key", key, "--tls-server-name", "nats.test"}

	c := connFlagsOf(t, good...)
	nc, err := c.connect(context.Background(), "test", 5*time.Second, zaptest.NewLogger(t), nil)
	if err != nil {
		t.Fatalf("mutual TLS: %v", err)
	}
	st, err := nc.TLSConnectionState()
	if err != nil || !st.HandshakeComplete || len(st.VerifiedChains) == 0 {
		t.Fatalf("TLS state %+v, %v", st, err)
	}
	nc.Close()

	root := t.TempDir()
	writeSessions(t, mrand.New(mrand.NewPCG(3, 4)), root, 3, 5)
	d := startTestDaemon(t, append(good, "--root", root, "--state-dir", t.TempDir())...)
	nc, err = c.connect(context.Background(), "test reader", 5*time.Second, zaptest.NewLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	allMirrored(t, newReader(t, nc, "t1", "alice"), root, 30*time.Second)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		want []string // in the error, in this order
	}{
		{"no client certificate", []string{"--nats", url, "--tls-ca", ca.file(), "--tls-server-name", "nats.test"},
			[]string{"tls", "or got none: set --tls-cert and --tls-key"}},
		{"client certificate of another CA", []string{"--nats", url, "--tls-ca", ca.file(), "--tls-cert", foreignCert, "--tls-key", foreignKey, "--tls-server-name", "nats.test"},
			[]string{"tls", "or got none: set --tls-cert and --tls-key"}},
		{"expired client certificate", []string{"--nats", url, "--tls-ca", ca.file(), "--tls-cert", expiredCert, "--tls-key", expiredKey, "--tls-server-name", "nats.test"},
			[]string{"tls", "refused the client certificate", "--tls-cert"}},
		{"server of an untrusted CA", []string{"--nats", url, "--tls-ca", other.file(), "--tls-cert", cert, "--tls-key", key, "--tls-server-name", "nats.test"},
			[]string{"x509", "--tls-ca"}},
		{"server name mismatch", []string{"--nats", url, "--tls-ca", ca.file(), "--tls-cert", cert, "--tls-key", key},
			[]string{"127.0.0.1", "--tls-server-name"}},
		{"server without TLS", []string{"--nats", plain.URL(), "--tls-ca", ca.file()},
			[]string{"secure connection not available", "does not offer it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := connFlagsOf(t, tc.args...)
			start := time.Now()
			nc, err := c.connect(context.Background(), "test", 1500*time.Millisecond, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), nil)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if took := time.Since(start); took < time.Second {
				t.Errorf("gave up after %v, before --connect-timeout", took)
			}
			msg, rest := err.Error(), err.Error()
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error %q lacks %q", msg, w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

// TestTLSUsageErrors: contradictory or unusable connection flags are usage errors,
// found before anything is dialled.
func TestTLSUsageErrors(t *testing.T) {
	ca := newSecCA(t, "pisync test CA")
	cert, _ := ca.issue(t, "c", x509.ExtKeyUsageClientAuth)
	_, otherKey := ca.issue(t, "d", x509.ExtKeyUsageClientAuth)
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nats-user", "u"}, "the embedded server (no --nats) has neither"},
		{[]string{"--tls-ca", ca.file()}, "the embedded server (no --nats) has neither"},
		{[]string{"--nats", "nats://h:4222", "--nats-user", "u", "--nats-token", "x"}, "give one way to authenticate"},
		{[]string{"--nats", "nats://u:p@h:4222", "--nats-user", "u"}, "credentials in the --nats URL"},
		{[]string{"--nats", "nats://h:4222", "--nats-password", "pass-word"}, "--nats-password needs --nats-user"},
		{[]string{"--nats", "nats://h:4222", "--tls-cert", cert}, "--tls-cert and --tls-key go together"},
		{[]string{"--nats", "nats://h:4222", "--tls-cert", cert, "--tls-key", otherKey}, "private key does not match"},
		{[]string{"--nats", "nats://h:4222", "--tls-ca", notPEM}, "no PEM certificate"},
		{[]string{"--nats", "nats://h:4222", "--tls-ca", filepath.Join(t.TempDir(), "missing.pem")}, "no such file"},
		{[]string{"--nats", "nats://h:4222", "--nats-creds", notPEM}, "no user NKey seed"},
		{[]string{"--nats", "nats://h:4222", "--nats-nkey", notPEM}, "--nats-nkey"},
		{[]string{"--nats", "nats://alice:s3%zzcret@h:4222"}, "not escaped"},
		{[]string{"--nats", "nats://h:4222,"}, "empty URL"},
	} {
		c := connFlagsOf(t, tc.args...)
		_, err := c.connect(context.Background(), "test", time.Second, zap.NewNop(), nil)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v; want a usage error saying %q", tc.args, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3%zzcret") {
			t.Errorf("%q: the error shows the password: %v", tc.args, err)
		}
	}
}

// startLoggedDaemon runs the daemon in-process like startTestDaemon, logging everything
// at debug level (JSON, as in production) into sink, with the recent-log ring that the
// status page shows.
func startLoggedDaemon(t *testing.T, sink io.Writer, args ...string) *daemon {
	t.Helper()
	var f runFlags
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	f.register(fs)
	if err := parseFlags(fs, append([]string{"--tenant", "t1", "--owner", "alice"}, args...)); err != nil {
		t.Fatal(err)
	}
	log, err := newLogger("debug", "json", sink)
	if err != nil {
		t.Fatal(err)
	}
	d, err := startDaemon(context.Background(), &f, withRecentLog(log))
	if err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	return d
}

// secretCase is one way of authenticating, with the secrets it must never show.
type secretCase struct {
	name    string
	server  func(*server.Options)
	args    []string          // the daemon's and the commands' connection flags
	env     map[string]string // PISYNC_* variables
	secrets []string
	warn    string   // a warning the daemon must log (once)
	wrong   []string // connection flags with a wrong secret, for status
	wrongS  string   // that wrong secret
}

// TestTLSSecretsNeverShown runs the daemon with each kind of credential (password by
// variable with mutual TLS, token on the command line, credentials in the URL, an NKey
// seed file, a JWT credentials file), mirrors a session, makes it lose and regain the
// server, reads /metrics, /status.json and the status page, runs status with wrong
// credentials and with a URL that does not parse, and checks that no secret appears
// in any log line, page or message.
func TestTLSSecretsNeverShown(t *testing.T) {
	ca := newSecCA(t, "pisync test CA")
	cert, key := ca.issue(t, "pisync", x509.ExtKeyUsageClientAuth)
	random := func(prefix string) string {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		return prefix + hex.EncodeToString(b)
	}
	password, token, urlPassword := random("pw-"), random("tok-"), random("url%pw-")
	nkeyFile, nkeySeed, nkeyPub := writeNKey(t)
	credsFile, credsSeed, operator := writeCreds(t)

	cases := []secretCase{
		{name: "password by variable, mutual TLS",
			server: func(o *server.Options) {
				mutualTLS(t, ca, "nats.test")(o)
				o.Users = []*server.User{{Username: "acme-alice", Password: password}}
			},
			args: []string{"--nats-user", "acme-alice", "--tls-ca", ca.file(), "--tls-cert", cert, "--tls-key", key, "--tls-server-name", "nats.test"},
			env:  map[string]string{"PISYNC_NATS_PASSWORD": password}, secrets: []string{password},
			wrong:  []string{"--nats-user", "acme-alice", "--nats-password", password + "-wrong", "--tls-ca", ca.file(), "--tls-cert", cert, "--tls-key", key, "--tls-server-name", "nats.test"},
			wrongS: password + "-wrong"},
		{name: "token on the command line",
			server: func(o *server.Options) { o.Authorization = token },
			args:   []string{"--nats-token", token}, secrets: []string{token},
			warn:  "a secret on the command line is visible to every user of this host",
			wrong: []string{"--nats-token", "x" + token}, wrongS: "x" + token},
		{name: "credentials in the URL",
			server: func(o *server.Options) {
				o.Users = []*server.User{{Username: "acme-alice", Password: urlPassword}}
			},
			args: []string{"--nats-url-credentials"}, secrets: []string{urlPassword, strings.ReplaceAll(urlPassword, "%", "%25")},
			wrong: []string{"--nats-url-credentials-wrong"}, wrongS: urlPassword},
		{name: "NKey seed file",
			server: func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: nkeyPub}} },
			args:   []string{"--nats-nkey", nkeyFile}, secrets: []string{nkeySeed},
			warn: "a file holding a secret is accessible by other users"},
		{name: "JWT credentials file",
			server: operator,
			args:   []string{"--nats-creds", credsFile}, secrets: []string{credsSeed}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { testSecretsNeverShown(t, tc) })
	}
}

func testSecretsNeverShown(t *testing.T, tc secretCase) {
	srv := natstest.RunWith(t, tc.server)
	scheme := "nats"
	if srv.Options().TLS {
		scheme = "tls"
	}
	conn := func(args []string) []string {
		u := urlOf(srv, scheme)
		switch {
		case len(args) == 1 && args[0] == "--nats-url-credentials":
			return []string{"--nats", strings.Replace(u, "://", "://acme-alice:"+strings.ReplaceAll(tc.secrets[0], "%", "%25")+"@", 1)}
		case len(args) == 1 && args[0] == "--nats-url-credentials-wrong":
			return []string{"--nats", strings.Replace(u, "://", "://acme-alice:"+tc.secrets[0]+"@", 1)} // a bare % does not parse
		}
		return append([]string{"--nats", u}, args...)
	}
	for k, v := range tc.env {
		t.Setenv(k, v)
	}
	root := t.TempDir()
	writeSessions(t, mrand.New(mrand.NewPCG(5, 6)), root, 2, 4)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	var logs daemontest.Output
	d := startLoggedDaemon(t, &logs, append(conn(tc.args), "--root", root, "--state-dir", t.TempDir(), "--http-addr", httpAddr)...)
	stopped := false
	defer func() {
		if !stopped {
			_ = d.stop()
		}
	}()
	waitFor(t, 30*time.Second, "sessions mirrored", func() (bool, string) {
		p := d.pub.Progress()
		for _, r := range p.Roots {
			return r.Sessions == 2 && r.Mirrored == 2, fmt.Sprintf("%+v", r)
		}
		return false, "no root yet"
	})
	// Lose the server and get it back: disconnection and reconnection are logged.
	srv.Stop()
	waitFor(t, 10*time.Second, "disconnection seen", func() (bool, string) { return !d.nc.IsConnected(), "still connected" })
	srv.Start()
	waitFor(t, 30*time.Second, "reconnection", func() (bool, string) { return d.nc.IsConnected(), "not yet" })

	var pages []string
	for _, p := range []string{"/metrics", "/status.json", "/", "/readyz"} {
		resp, err := http.Get("http://" + httpAddr + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		pages = append(pages, p+":\n"+string(b))
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true

	// The commands: status with the right credentials, then with wrong ones.
	var out, errOut bytes.Buffer
	code := exitCode(StatusCommand(context.Background(), append(conn(tc.args), "--root", root, "--tenant", "t1", "--owner", "alice"), &out, &errOut), &errOut)
	if code != exitOK {
		t.Fatalf("status: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	wrongOut := ""
	if tc.wrong != nil {
		var wout, werr bytes.Buffer
		code := exitCode(StatusCommand(context.Background(), append(conn(tc.wrong), "--root", root, "--connect-timeout", "1s"), &wout, &werr), &werr)
		if code == exitOK {
			t.Errorf("status with wrong credentials: exit 0")
		}
		wrongOut = wout.String() + werr.String()
		if strings.Contains(wrongOut, tc.wrongS) { // a wrong secret may be a right one elsewhere
			t.Errorf("status with wrong credentials shows them:\n%s", wrongOut)
		}
		if len(tc.wrong) == 1 && !strings.Contains(wrongOut, "not escaped") {
			t.Errorf("status with a URL that does not parse: %s", wrongOut)
		}
	}

	all := map[string]string{"logs": logs.String(), "pages": strings.Join(pages, "\n"), "status": out.String() + errOut.String(), "status with wrong credentials": wrongOut}
	for what, text := range all {
		for _, s := range tc.secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s show the secret %q:\n%s", what, s, text)
			}
		}
	}
	if !strings.Contains(logs.String(), "disconnected from NATS") || !strings.Contains(logs.String(), "reconnected to NATS") {
		t.Errorf("the logs lack the disconnection and reconnection that were to be checked:\n%s", logs.String())
	}
	if tc.warn != "" {
		if n := strings.Count(logs.String(), tc.warn); n != 1 {
			t.Errorf("warning %q logged %d times, want once:\n%s", tc.warn, n, logs.String())
		}
	}
}

// writeNKey writes a user NKey seed file readable by everyone (which is warned about).
func writeNKey(t *testing.T) (file, seed, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	s, _ := kp.Seed()
	p, _ := kp.PublicKey()
	file = filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(file, append(s, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	return file, string(s), p
}

// writeCreds makes an operator, an account with JetStream and a user, writes the user's
// credentials file (mode 0600) and returns the server configuration that trusts them.
func writeCreds(t *testing.T) (file, seed string, configure func(*server.Options)) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	ojwt, err := oc.Encode(okp)
	must(err)
	oclaims, err := jwt.DecodeOperatorClaims(ojwt)
	must(err)
	account := func(js bool) (nkeys.KeyPair, string, string) {
		akp, err := nkeys.CreateAccount()
		must(err)
		apub, _ := akp.PublicKey()
		ac := jwt.NewAccountClaims(apub)
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		ajwt, err := ac.Encode(okp)
		must(err)
		return akp, apub, ajwt
	}
	_, syspub, sysjwt := account(false)
	akp, apub, ajwt := account(true)
	ukp, err := nkeys.CreateUser()
	must(err)
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	ujwt, err := uc.Encode(akp)
	must(err)
	s, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(ujwt, s)
	must(err)
	file = filepath.Join(t.TempDir(), "user.creds")
	must(os.WriteFile(file, creds, 0o600))
	return file, string(s), func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{oclaims}
		r := &server.MemAccResolver{}
		must(r.Store(apub, ajwt))
		must(r.Store(syspub, sysjwt))
		o.AccountResolver = r
		o.SystemAccount = syspub
	}
}

// TestTLSBadCertificateRetries: the daemon given a client certificate the server does
// not accept does not exit: it logs the handshake error once, with what to check,
// and retries with growing intervals (each attempt at debug level) until stopped. Its
// HTTP endpoints are not up meanwhile, so it is never ready. `pisync status` with the
// same certificate gives up after --connect-timeout with exit 1 and the TLS error.
func TestTLSBadCertificateRetries(t *testing.T) {
	ca, other := newSecCA(t, "pisync test CA"), newSecCA(t, "someone else's CA")
	srv := natstest.RunWith(t, mutualTLS(t, ca, "nats.test"))
	cert, key := other.issue(t, "acme-alice", x509.ExtKeyUsageClientAuth)
	conn := []string{"--nats", urlOf(srv, "tls"), "--tls-ca", ca.file(), "--tls-cert", cert, "--tls-key", key, "--tls-server-name", "nats.test"}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))

	var f runFlags
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	f.register(fs)
	if err := parseFlags(fs, append(conn, "--root", t.TempDir(), "--state-dir", t.TempDir(), "--http-addr", httpAddr)); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		d, err := startDaemon(ctx, &f, zap.New(core))
		if d != nil {
			_ = d.stop()
		}
		done <- err
	}()

	attempts := func() []observer.LoggedEntry {
		return logs.FilterMessage("NATS connection attempt failed").AllUntimed()
	}
	waitFor(t, 20*time.Second, "6 attempts", func() (bool, string) {
		return len(attempts()) >= 6, fmt.Sprintf("%d attempts", len(attempts()))
	})
	select {
	case err := <-done:
		t.Fatalf("the daemon gave up after %v: %v", time.Since(start), err)
	default:
	}
	// While NATS is retried the daemon is alive but not ready: a liveness probe must not
	// restart it, a readiness probe must keep traffic away.
	if resp, err := http.Get("http://" + httpAddr + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz while NATS is retried: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if resp, err := http.Get("http://" + httpAddr + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz while NATS is retried: %v %v, want 503", resp, err)
	} else {
		resp.Body.Close()
	}
	var waits []time.Duration
	for _, e := range attempts() {
		waits = append(waits, e.ContextMap()["retry_in"].(time.Duration))
	}
	// Exponential backoff (×1.5, ±50 % jitter, from 200 ms): the sixth wait is at least
	// 0.5×200 ms×1.5⁵ ≈ 760 ms, the first at most 300 ms.
	if waits[5] <= 2*waits[0] || waits[5] < 700*time.Millisecond {
		t.Errorf("retry intervals do not grow: %v", waits)
	}
	warns := logs.FilterLevelExact(zapcore.WarnLevel).AllUntimed()
	if len(warns) != 1 {
		t.Errorf("%d warnings for %d attempts failing the same way, want 1: %v", len(warns), len(attempts()), warns)
	} else {
		m := warns[0].ContextMap()
		if e, _ := m["error"].(string); !strings.Contains(e, "tls") || !strings.Contains(fmt.Sprint(m["hint"]), "--tls-cert") {
			t.Errorf("the warning does not say what failed and what to check: %v", m)
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "tls") {
			t.Errorf("stopped: %v; want the cancellation and the last TLS error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not stop")
	}

	var out, errOut bytes.Buffer
	start = time.Now()
	code := exitCode(StatusCommand(context.Background(), append(conn, "--connect-timeout", "2s", "--root", t.TempDir()), &out, &errOut), &errOut)
	took := time.Since(start)
	if code != exitFail || !strings.Contains(errOut.String(), "within 2s (--connect-timeout): ") || !strings.Contains(errOut.String(), "tls") ||
		!strings.Contains(errOut.String(), "--tls-cert") {
		t.Errorf("status with a bad certificate: exit %d\n%s", code, errOut.String())
	}
	if took < 2*time.Second || took > 15*time.Second {
		t.Errorf("status gave up after %v, with --connect-timeout 2s", took)
	}
}

// TestTLSSecretFileModes: a key, seed or credentials file that other users may read is
// warned about once, with its path and never its content; a 0600 one is not.
func TestTLSSecretFileModes(t *testing.T) {
	ca := newSecCA(t, "pisync test CA")
	cert, key := ca.issue(t, "c", x509.ExtKeyUsageClientAuth)
	keyPEM, _ := os.ReadFile(key)
	core, logs := observer.New(zapcore.DebugLevel)
	c := connFlagsOf(t, "--nats", "tls://h:4222", "--tls-cert", cert, "--tls-key", key)
	if _, err := c.natsOptions(zap.New(core)); err != nil {
		t.Fatal(err)
	}
	if n := logs.Len(); n != 0 {
		t.Fatalf("warnings for a 0600 key: %v", logs.AllUntimed())
	}
	if err := os.Chmod(key, 0o640); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.natsOptions(zap.New(core)); err != nil {
			t.Fatal(err)
		}
	}
	all := logs.AllUntimed()
	if len(all) != 1 || all[0].ContextMap()["path"] != key || all[0].ContextMap()["flag"] != "--tls-key" {
		t.Fatalf("want one warning naming --tls-key and %s: %v", key, all)
	}
	if strings.Contains(fmt.Sprint(all), strings.TrimSpace(string(keyPEM))[40:80]) {
		t.Fatal("the warning shows the key")
	}
}

// TestTLSEmbeddedLoopbackOnly: the embedded server listens on loopback by default; a
// non-loopback --nats-listen is refused as a usage error unless --nats-listen-public,
// and then warned about.
func TestTLSEmbeddedLoopbackOnly(t *testing.T) {
	for _, tc := range []struct {
		host   string
		public bool
		ok     bool
	}{
		{"127.0.0.1", false, true},
		{"0.0.0.0", false, false},
		{"", false, false},
		{"0.0.0.0", true, true},
	} {
		listen := net.JoinHostPort(tc.host, fmt.Sprint(natstest.FreePort(t)))
		c := connFlagsOf(t, "--nats-listen", listen, "--state-dir", filepath.Join(t.TempDir(), "state"))
		c.listenPublic = tc.public
		core, logs := observer.New(zapcore.InfoLevel)
		ns, err := c.startEmbedded(zap.New(core))
		if ns != nil {
			if tc.ok && tc.host == "127.0.0.1" && !strings.HasPrefix(ns.ClientURL(), "nats://127.0.0.1:") {
				t.Errorf("listening on %s", ns.ClientURL())
			}
			ns.Shutdown()
			ns.WaitForShutdown()
		}
		warned := logs.FilterLevelExact(zapcore.WarnLevel).Len() > 0
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s (public %v): %v", listen, tc.public, err)
		case !tc.ok && (!errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--nats-listen-public")):
			t.Errorf("%s: %v; want a usage error naming --nats-listen-public", listen, err)
		case tc.ok && warned != tc.public:
			t.Errorf("%s (public %v): warned %v", listen, tc.public, warned)
		}
	}
	var f runFlags
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	f.register(fs)
	if f.conn.natsListen != "127.0.0.1:4222" || f.conn.listenPublic {
		t.Errorf("default --nats-listen %q, public %v", f.conn.natsListen, f.conn.listenPublic)
	}

	// The store is private: created 0700, and an existing state directory open to
	// others is made private (root may chmod anything here, so no warning is expected).
	for _, mode := range []os.FileMode{0, 0o755} {
		state := filepath.Join(t.TempDir(), "state")
		if mode != 0 {
			if err := os.Mkdir(state, mode); err != nil {
				t.Fatal(err)
			}
			_ = os.Chmod(state, mode) // whatever the umask
		}
		c := connFlagsOf(t, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t)), "--state-dir", state)
		core, logs := observer.New(zapcore.WarnLevel)
		ns, err := c.startEmbedded(zap.New(core))
		if err != nil {
			t.Fatal(err)
		}
		ns.Shutdown()
		ns.WaitForShutdown()
		secureStateDir(zap.New(core), state) // what startDaemon does for every mode
		dirs := map[string]os.FileMode{filepath.Join(state, "jetstream"): 0o700, state: 0o700}
		for d, want := range dirs {
			if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != want {
				t.Errorf("%s: %v, %v; want mode %v", d, fi.Mode().Perm(), err, want)
			}
		}
		if warned := logs.FilterMessageSnippet("state directory is accessible by other users").Len(); warned != 0 {
			t.Errorf("state directory of mode %v: %d warnings, though it could be made private", mode, warned)
		}
	}
}
