package logx

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestURL: credentials in URLs are hidden, also where the URL does not parse.
func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://alice:s3cret@h:4222":                    "nats://***@h:4222",
		"tls://tok3n@h:4222, nats://h2:4222":            "tls://***@h:4222, nats://h2:4222",
		"alice:s3cret@h:4222":                           "***@h:4222",
		"nats://alice:s3cr%zzet@h:4222":                 "nats://***@h:4222",
		"nats://alice:pa/ss@word@h:4222":                "nats://***@h:4222",
		"nats://h:4222":                                 "nats://h:4222",
		"nats://a:b@h1:4222,nats://c:d@h2:4222,h3:4222": "nats://***@h1:4222,nats://***@h2:4222,h3:4222",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestScrubber: whatever carries a configured secret near the connection — a log
// message, a string, error or stringer field, a field added with With, an error
// returned — shows "***" instead, as given, URL-decoded or quoted; errors.Is still
// sees the original error.
func TestScrubber(t *testing.T) {
	s := NewScrubber(Secrets("", "tok\"en-123", "nats://acme-alice:p%40ss-in-url@h:4222,nats://tok-in-url-123@h2:4222"))
	core, logs := observer.New(zapcore.DebugLevel)
	log := s.Logger(zap.New(core)).With(zap.String("ctx", "p@ss-in-url"))
	base := errors.New("server said tok-in-url-123")
	log.Warn("message with tok\"en-123",
		zap.String("s", "p%40ss-in-url"), zap.Error(base), zap.Stringer("st", stringerOf("tok\\\"en-123")),
		zap.ByteString("b", []byte("acme-alice:p%40ss-in-url")))
	text := fmt.Sprint(logs.AllUntimed())
	for _, secret := range []string{"p%40ss-in-url", "p@ss-in-url", "tok-in-url-123", "tok\"en-123", `tok\"en-123`} {
		if strings.Contains(text, secret) {
			t.Errorf("the log shows %q: %s", secret, text)
		}
	}
	if !strings.Contains(text, "message with ***") || !strings.Contains(text, "server said ***") {
		t.Errorf("scrubbed too much or too little: %s", text)
	}
	err := s.Error(fmt.Errorf("wrapped: %w", base))
	if strings.Contains(err.Error(), "tok-in-url-123") || !errors.Is(err, base) {
		t.Errorf("error %q (is the original: %v)", err, errors.Is(err, base))
	}
	if got := NewScrubber([]string{"abc", ""}).String("abc"); got != "abc" {
		t.Errorf("a secret of 3 bytes is scrubbed: %q", got)
	}
	if s.Error(nil) != nil {
		t.Error("Error(nil) is not nil")
	}
}

type stringerOf string

func (s stringerOf) String() string { return string(s) }
