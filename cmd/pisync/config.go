package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"

	"github.com/pisync/pisync/internal/logx"
)

// envName is the variable that sets a flag: PISYNC_ and the flag name in upper case.
func envName(flagName string) string {
	return "PISYNC_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its PISYNC_* variable, so
// that the command line wins over the environment, which wins over the default.
func applyEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if sv, isSecret := f.Value.(*secretFlag); isSecret {
			sv.setFromEnv(v)
			return
		}
		if lv, isList := f.Value.(*listFlag); isList {
			lv.values = nil
			for _, part := range filepath.SplitList(v) {
				if part != "" {
					lv.values = append(lv.values, part)
				}
			}
			return
		}
		if serr := f.Value.Set(v); serr != nil {
			err = fmt.Errorf("%w: %s=%q: %v", errUsage, envName(f.Name), v, serr)
		}
	})
	return err
}

// listFlag is a repeatable flag; its variable holds a path list (':'-separated).
type listFlag struct {
	values   []string
	defaults []string
	set      bool
}

func (l *listFlag) String() string { return strings.Join(l.get(), string(filepath.ListSeparator)) }
func (l *listFlag) Set(v string) error {
	if !l.set {
		l.values, l.set = nil, true
	}
	l.values = append(l.values, v)
	return nil
}
func (l *listFlag) get() []string {
	if len(l.values) == 0 {
		return l.defaults
	}
	return l.values
}

// registerRoots declares --root as every command has it: repeatable, PISYNC_ROOT a
// ':'-separated list, the Pi CLI's root by default. what says what the roots are for.
func registerRoots(fs *flag.FlagSet, roots *listFlag, what string) {
	roots.defaults = []string{filepath.Join(homeDir(), ".pi", "agent", "sessions")}
	fs.Var(roots, "root", what+" (repeatable; PISYNC_ROOT takes a ':'-separated list)")
}

// parseFlags parses args, then the environment, and refuses stray arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q; try 'pisync %s -h'", errUsage, fs.Arg(0), fs.Name())
	}
	return applyEnv(fs)
}

func homeDir() string {
	if h, err := os.UserHomeDir(); err == nil {
		return h
	}
	return "."
}

func defaultOwner() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if v := os.Getenv("USER"); v != "" {
		return v
	}
	return "unknown"
}

// connFlags are the flags every command uses to reach the mirror: where NATS is, who
// pisync is there (tenant, owner) and how it authenticates and encrypts (natsOptions).
type connFlags struct {
	natsURL      string
	natsListen   string
	listenPublic bool
	stateDir     string
	tenant       string
	owner        string
	prefix       string
	connectTO    time.Duration

	// Credentials: at most one of user (and password), token, nkey seed file, creds file.
	user      string
	password  secretFlag
	token     secretFlag
	nkeyFile  string
	credsFile string
	// TLS: the CA that signs the servers' certificates, a client certificate and key
	// (mutual TLS), and the name the server certificate must carry.
	tlsCA, tlsCert, tlsKey, tlsServerName string

	warned map[string]bool // warnings given once per process
}

func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.natsURL, "nats", "", "NATS server URL(s), comma-separated; empty: the embedded server")
	fs.StringVar(&c.natsListen, "nats-listen", "127.0.0.1:4222", "where the embedded server listens (run), or is reached (other commands); loopback unless --nats-listen-public")
	fs.BoolVar(&c.listenPublic, "nats-listen-public", false, "let the embedded server listen on a non-loopback --nats-listen address (it has no authentication and no TLS)")
	fs.StringVar(&c.stateDir, "state-dir", filepath.Join(homeDir(), ".local", "state", "pisync"), "state directory: checkpoints, verification verdicts and the embedded server's store")
	fs.StringVar(&c.tenant, "tenant", "default", "tenant this daemon publishes under")
	fs.StringVar(&c.owner, "owner", defaultOwner(), "owner this daemon publishes under")
	fs.StringVar(&c.prefix, "prefix", "pisync", "name prefix of the stream, buckets and subjects")
	fs.DurationVar(&c.connectTO, "connect-timeout", 10*time.Second, "how long to wait for NATS at start, and again for its JetStream")
	fs.StringVar(&c.user, "nats-user", "", "NATS user name (with --nats-password)")
	fs.Var(&c.password, "nats-password", "NATS password; prefer the variable PISYNC_NATS_PASSWORD (a command line is visible to every local user)")
	fs.Var(&c.token, "nats-token", "NATS authentication token; prefer the variable PISYNC_NATS_TOKEN")
	fs.StringVar(&c.nkeyFile, "nats-nkey", "", "file holding the NKey seed of the NATS user (keep it mode 0600)")
	fs.StringVar(&c.credsFile, "nats-creds", "", "NATS credentials file: user JWT and NKey seed (keep it mode 0600)")
	fs.StringVar(&c.tlsCA, "tls-ca", "", "PEM file of the CA certificates that sign the NATS servers' certificates (default: the system's)")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "PEM file of the client certificate for mutual TLS (with --tls-key)")
	fs.StringVar(&c.tlsKey, "tls-key", "", "PEM file of the client certificate's private key (keep it mode 0600)")
	fs.StringVar(&c.tlsServerName, "tls-server-name", "", "name the servers' certificates must carry (default: the host of the URL)")
}

// url is the NATS URL to dial: the configured one, or the embedded server's address.
func (c *connFlags) url() string {
	if c.natsURL != "" {
		return c.natsURL
	}
	return "nats://" + c.natsListen
}

// secretFlag holds a secret given by flag or variable. It never prints its value, and it
// remembers whether the command line set it (visible to every local user in ps).
type secretFlag struct {
	value    string
	fromArgs bool
}

func (s *secretFlag) String() string { return "" }
func (s *secretFlag) Set(v string) error {
	s.value, s.fromArgs = v, true
	return nil
}

// setFromEnv sets the value from a PISYNC_* variable.
func (s *secretFlag) setFromEnv(v string) { s.value, s.fromArgs = v, false }

// natsOptions checks the credential and TLS flags and turns them into client options.
// Contradictory flags, a URL that does not parse and a file that cannot be used are usage
// errors, found before any dial (a bad file would otherwise fail every retry the same
// way). A secret given on the command line, and a secret file that other users may
// read, are warned about once, with the flag and the path, never the content.
func (c *connFlags) natsOptions(log *zap.Logger) ([]nats.Option, error) {
	if err := checkURLs(c.url()); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	var ways []string
	if c.user != "" || c.password.value != "" {
		ways = append(ways, "--nats-user/--nats-password")
	}
	if c.token.value != "" {
		ways = append(ways, "--nats-token")
	}
	if c.nkeyFile != "" {
		ways = append(ways, "--nats-nkey")
	}
	if c.credsFile != "" {
		ways = append(ways, "--nats-creds")
	}
	if urlCredentials(c.natsURL) {
		ways = append(ways, "credentials in the --nats URL")
	}
	tlsSet := c.tlsCA != "" || c.tlsCert != "" || c.tlsKey != "" || c.tlsServerName != ""
	switch {
	case c.natsURL == "" && (len(ways) > 0 || tlsSet):
		return nil, fmt.Errorf("%w: credentials and --tls-* flags are for a NATS server given with --nats; "+
			"the embedded server (no --nats) has neither authentication nor TLS", errUsage)
	case len(ways) > 1:
		return nil, fmt.Errorf("%w: %s: give one way to authenticate", errUsage, strings.Join(ways, " and "))
	case c.password.value != "" && c.user == "":
		return nil, fmt.Errorf("%w: --nats-password needs --nats-user", errUsage)
	case (c.tlsCert == "") != (c.tlsKey == ""):
		return nil, fmt.Errorf("%w: --tls-cert and --tls-key go together", errUsage)
	}
	for _, s := range []struct {
		f    *secretFlag
		name string
	}{{&c.password, "nats-password"}, {&c.token, "nats-token"}} {
		if s.f.fromArgs && s.f.value != "" {
			c.warnOnce(log, "args:"+s.name, "a secret on the command line is visible to every user of this host (ps, /proc); set it in the environment instead",
				zap.String("flag", "--"+s.name), zap.String("variable", envName(s.name)))
		}
	}

	var opts []nats.Option
	switch {
	case c.user != "":
		opts = append(opts, nats.UserInfo(c.user, c.password.value))
	case c.token.value != "":
		opts = append(opts, nats.Token(c.token.value))
	case c.nkeyFile != "":
		c.warnShared(log, "--nats-nkey", c.nkeyFile)
		o, err := nats.NkeyOptionFromSeed(c.nkeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: --nats-nkey %s: %v", errUsage, c.nkeyFile, err)
		}
		opts = append(opts, o)
	case c.credsFile != "":
		c.warnShared(log, "--nats-creds", c.credsFile)
		if err := checkCreds(c.credsFile); err != nil {
			return nil, fmt.Errorf("%w: --nats-creds %s: %v", errUsage, c.credsFile, err)
		}
		// Read again at every (re)connection, so that a rotated file is picked up.
		opts = append(opts, nats.UserCredentials(c.credsFile))
	}

	if !tlsSet {
		return opts, nil
	}
	// Setting any TLS flag makes TLS mandatory: the client refuses a server without it.
	opts = append(opts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.tlsServerName}))
	if c.tlsCA != "" {
		pem, err := os.ReadFile(c.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("%w: --tls-ca: %v", errUsage, err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: --tls-ca %s: no PEM certificate in it", errUsage, c.tlsCA)
		}
		opts = append(opts, nats.RootCAs(c.tlsCA)) // read again at every connection
	}
	if c.tlsCert != "" {
		c.warnShared(log, "--tls-key", c.tlsKey)
		if _, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey); err != nil {
			return nil, fmt.Errorf("%w: --tls-cert %s, --tls-key %s: %v", errUsage, c.tlsCert, c.tlsKey, err)
		}
		opts = append(opts, nats.ClientCert(c.tlsCert, c.tlsKey)) // read again at every connection
	}
	return opts, nil
}

// checkCreds checks that a credentials file holds a user JWT and an NKey seed.
func checkCreds(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	defer clear(b)
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return fmt.Errorf("no user NKey seed: %v", err)
	}
	kp.Wipe()
	// Without the decoration, ParseDecoratedJWT returns the whole text: check its form.
	if jwt, err := nkeys.ParseDecoratedJWT(b); err != nil || strings.Count(jwt, ".") != 2 {
		return errors.New("no user JWT")
	}
	return nil
}

// warnShared warns once when a file holding a secret is open to other users.
func (c *connFlags) warnShared(log *zap.Logger, flagName, path string) {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm()&0o077 == 0 {
		return
	}
	c.warnOnce(log, "mode:"+path, "a file holding a secret is accessible by other users; chmod 600 it",
		zap.String("flag", flagName), zap.String("path", path), zap.String("mode", fmt.Sprintf("%#o", fi.Mode().Perm())))
}

func (c *connFlags) warnOnce(log *zap.Logger, key, msg string, fields ...zap.Field) {
	if c.warned[key] {
		return
	}
	if c.warned == nil {
		c.warned = map[string]bool{}
	}
	c.warned[key] = true
	log.Warn(msg, fields...)
}

// checkURLs parses each comma-separated NATS URL the way the client will. The error
// names the URL with its credentials hidden; a URL that parses once they are taken out
// had its credentials badly escaped, which the message says rather than quoting them.
func checkURLs(urls string) error {
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			return errors.New("--nats: an empty URL in the list")
		}
		full := u
		if !strings.Contains(u, "://") {
			full = "nats://" + u
		}
		if _, err := url.Parse(full); err == nil {
			continue
		}
		scheme, _, rest := logx.SplitUserinfo(full)
		if _, err := url.Parse(scheme + rest); err != nil {
			return fmt.Errorf("--nats %s: not a URL: %v", logx.URL(u), errors.Unwrap(err))
		}
		// Without its credentials the URL parses: they are what is wrong.
		return fmt.Errorf("--nats %s: the user or password is not escaped for a URL (%%→%%25, @→%%40, :→%%3A, /→%%2F); or use --nats-user and PISYNC_NATS_PASSWORD", logx.URL(u))
	}
	return nil
}

// urlCredentials reports whether any of the URLs carries a user, password or token.
func urlCredentials(urls string) bool {
	for _, u := range strings.Split(urls, ",") {
		if _, userinfo, _ := logx.SplitUserinfo(strings.TrimSpace(u)); userinfo != "" {
			return true
		}
	}
	return false
}

func parseHostPort(s string) (string, int, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", 0, fmt.Errorf("%q: want HOST:PORT", s)
	}
	port, err := strconv.Atoi(s[i+1:])
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", s)
	}
	return strings.Trim(s[:i], "[]"), port, nil
}
