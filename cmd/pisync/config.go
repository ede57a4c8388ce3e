package main

import (
	"flag"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
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

// connFlags are the flags every command uses to reach the mirror.
type connFlags struct {
	natsURL    string
	natsListen string
	stateDir   string
	tenant     string
	owner      string
	prefix     string
	connectTO  time.Duration
}

func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.natsURL, "nats", "", "NATS server URL(s), comma-separated; empty: the embedded server")
	fs.StringVar(&c.natsListen, "nats-listen", "127.0.0.1:4222", "where the embedded server listens (run), or is reached (other commands)")
	fs.StringVar(&c.stateDir, "state-dir", filepath.Join(homeDir(), ".local", "state", "pisync"), "state directory: checkpoints and the embedded server's store")
	fs.StringVar(&c.tenant, "tenant", "default", "tenant this daemon publishes under")
	fs.StringVar(&c.owner, "owner", defaultOwner(), "owner this daemon publishes under")
	fs.StringVar(&c.prefix, "prefix", "pisync", "name prefix of the stream, buckets and subjects")
	fs.DurationVar(&c.connectTO, "connect-timeout", 10*time.Second, "how long to wait for NATS at start")
}

// url is the NATS URL to dial: the configured one, or the embedded server's address.
func (c *connFlags) url() string {
	if c.natsURL != "" {
		return c.natsURL
	}
	return "nats://" + c.natsListen
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
