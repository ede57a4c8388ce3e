// Package logx decides what reaches a log line and how often. It keeps secrets out of
// logs and messages (the credentials of NATS URLs hidden, configured secrets replaced by
// "***" in text, errors and zap log lines), and it rate-limits the lines of a failure
// that repeats (Run).
package logx

import (
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// SplitUserinfo splits a URL into its scheme (with "://", if any), the credentials
// before the last '@' (user[:password] or a token) and the rest. It works on text
// that does not parse as a URL, which is where credentials would otherwise leak.
func SplitUserinfo(u string) (scheme, userinfo, rest string) {
	rest = u
	if i := strings.Index(u, "://"); i >= 0 {
		scheme, rest = u[:i+3], u[i+3:]
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		return scheme, rest[:at], rest[at+1:]
	}
	return scheme, "", rest
}

// URL hides the credentials (user, password or token) in a comma-separated list of
// URLs before it reaches a log or a message, also in URLs that do not parse.
func URL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if scheme, userinfo, rest := SplitUserinfo(p); userinfo != "" {
			parts[i] = scheme + "***@" + rest
		}
	}
	return strings.Join(parts, ",")
}

// Secrets returns the values to scrub for a password, a token and a comma-separated
// list of URLs: each as given, and as it appears quoted or URL-decoded.
func Secrets(password, token, urls string) []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if q := strconv.Quote(s); q[1:len(q)-1] != s {
			out = append(out, q[1:len(q)-1])
		}
		if d, err := url.PathUnescape(s); err == nil && d != s {
			out = append(out, d)
		}
	}
	add(password)
	add(token)
	for _, u := range strings.Split(urls, ",") {
		_, userinfo, _ := SplitUserinfo(strings.TrimSpace(u))
		add(userinfo)
		if user, pass, ok := strings.Cut(userinfo, ":"); ok {
			add(pass)
		} else {
			add(user) // a token
		}
	}
	return out
}

// MinSecretLen is the length from which a secret is scrubbed.
const MinSecretLen = 4

// Scrubber replaces secrets by "***" in text, errors and log lines.
type Scrubber struct{ secrets []string }

// NewScrubber returns a Scrubber for the given secrets; those shorter than MinSecretLen and
// empty ones are ignored.
func NewScrubber(secrets []string) *Scrubber {
	s := &Scrubber{}
	seen := map[string]bool{}
	for _, v := range secrets {
		// A secret of a few bytes protects nothing, and replacing it everywhere would
		// garble every log line.
		if len(v) >= MinSecretLen && !seen[v] {
			seen[v] = true
			s.secrets = append(s.secrets, v)
		}
	}
	// Longest first, so that a secret containing another is replaced whole.
	sort.Slice(s.secrets, func(i, j int) bool { return len(s.secrets[i]) > len(s.secrets[j]) })
	return s
}

// String returns text with every secret replaced by "***".
func (s *Scrubber) String(text string) string {
	for _, v := range s.secrets {
		text = strings.ReplaceAll(text, v, "***")
	}
	return text
}

// Error returns err with its message scrubbed; errors.Is and errors.As still see the
// original chain.
func (s *Scrubber) Error(err error) error {
	if err == nil {
		return nil
	}
	if msg := s.String(err.Error()); msg != err.Error() {
		return &scrubbedError{msg: msg, err: err}
	}
	return err
}

type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }
