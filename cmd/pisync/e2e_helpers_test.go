package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// startTestDaemon runs the daemon in-process with the given command-line flags.
func startTestDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	var f runFlags
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	f.register(fs)
	args = append([]string{"--http-addr", "", "--tenant", "t1", "--owner", "alice"}, args...)
	if err := parseFlags(fs, args); err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t, zaptest.Level(testLogLevel()))
	d, err := startDaemon(context.Background(), &f, log)
	if err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	return d
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	pause := 10 * time.Millisecond
	for time.Now().Before(deadline) {
		var ok bool
		if ok, why = cond(); ok {
			return
		}
		time.Sleep(pause) // polling interval of a poll-with-deadline, growing to 500 ms
		pause = min(2*pause, 500*time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, why)
}

// streamMsg is one message of the raw stream.
type streamMsg struct {
	subject string
	msgID   string
	line    mirror.Line
	data    []byte
	seq     uint64
}

// readStream reads every message of the entries stream, in stream order.
func readStream(t testing.TB, nc *nats.Conn) []streamMsg {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var out []streamMsg
	// A cluster that just lost or regained a node may answer "no responders" or time out
	// for a moment, on the stream info or on creating the consumer: read it all again.
	waitFor(t, 60*time.Second, "the whole stream", func() (bool, string) {
		var err error
		if out, err = readStreamOnce(t, js); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return out
}

// readStreamOnce reads the stream once; an API error is returned for a retry, a message
// the mirror cannot parse fails the test.
func readStreamOnce(t testing.TB, js jetstream.JetStream) ([]streamMsg, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, mirror.DefaultNames().Stream())
	if err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream info: %w", err)
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("ordered consumer: %w", err)
	}
	var out []streamMsg
	for uint64(len(out)) < info.State.Msgs {
		batch, err := cons.Fetch(int(min(500, info.State.Msgs-uint64(len(out)))), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			return nil, fmt.Errorf("fetch after %d messages: %w", len(out), err)
		}
		for m := range batch.Messages() {
			meta, _ := m.Metadata()
			l, err := mirror.ParseLine(m.Headers())
			if err != nil {
				t.Fatalf("message %d: %v", meta.Sequence.Stream, err)
			}
			out = append(out, streamMsg{subject: m.Subject(), msgID: m.Headers().Get(nats.MsgIdHdr), line: l,
				data: append([]byte(nil), m.Data()...), seq: meta.Sequence.Stream})
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("fetch after %d messages: %w", len(out), err)
		}
	}
	return out, nil
}

// duplicates lists the (conversation, generation, entry) keys that appear more than once.
func duplicates(msgs []streamMsg) []string {
	seen := map[string]int{}
	for _, m := range msgs {
		seen[m.msgID]++
	}
	var dups []string
	for id, n := range seen {
		if n > 1 {
			dups = append(dups, fmt.Sprintf("%s ×%d", id, n))
		}
	}
	sort.Strings(dups)
	return dups
}

// sessionFiles lists the *.jsonl files under root.
func sessionFiles(t testing.TB, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".jsonl") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// mirrorMatches checks that the newest generation of the file's conversation holds
// exactly the file's complete lines, byte for byte, in order.
func mirrorMatches(ctx context.Context, r *mirror.Reader, path string) (bool, string) {
	content, err := os.ReadFile(path)
	if err != nil {
		return false, err.Error()
	}
	lines := session.SplitLines(content)
	if len(lines) == 0 {
		return true, ""
	}
	lead := session.Identify(filepath.Base(path), lines[:min(len(lines), session.LeadLines)], len(lines) > session.LeadLines)
	if lead.Kind != session.LeadHeader && lead.Kind != session.LeadHeaderless {
		return true, "" // not a session (or not yet): nothing to mirror
	}
	c, err := r.Conv(lead.Header.ID)
	if err != nil {
		return false, err.Error()
	}
	if named, _, ok := session.ParseFileName(filepath.Base(path)); ok && named != lead.Header.ID {
		// A fresh header of another id over a session's file: mirrored as a generation
		// of the session its name bears.
		if n, err := r.Count(ctx, c); err == nil && n == 0 {
			if c, err = r.Conv(named); err != nil {
				return false, err.Error()
			}
		}
	}
	g, err := r.ReadGeneration(ctx, c, 0)
	if err != nil {
		return false, fmt.Sprintf("%s: %v", path, err)
	}
	if len(g.Msgs) != len(lines) {
		return false, fmt.Sprintf("%s: mirror has %d lines, file %d", path, len(g.Msgs), len(lines))
	}
	for i, m := range g.Msgs {
		if m.Ordinal != int64(i) {
			return false, fmt.Sprintf("%s: ordinal %d at %d", path, m.Ordinal, i)
		}
		data := m.Data
		if m.Kind == mirror.KindBlob {
			rc, err := r.Blob(ctx, m.SHA256)
			if err != nil {
				return false, err.Error()
			}
			data, err = io.ReadAll(rc)
			rc.Close()
			if err != nil {
				return false, err.Error()
			}
		}
		if !bytes.Equal(data, lines[i]) {
			return false, fmt.Sprintf("%s line %d differs", path, i+1)
		}
		sum := sha256.Sum256(lines[i])
		if m.SHA256 != hex.EncodeToString(sum[:]) {
			return false, fmt.Sprintf("%s line %d: digest header wrong", path, i+1)
		}
	}
	return true, ""
}

// newReader opens the mirror's read API for the test owner.
func newReader(t testing.TB, nc *nats.Conn, tenant, owner string) *mirror.Reader {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	o, err := mirror.NewOwner(tenant, owner)
	if err != nil {
		t.Fatal(err)
	}
	// Right after a cluster node was killed the JetStream API may answer "no responders"
	// for a moment: retry until the deadline.
	var r *mirror.Reader
	waitFor(t, 30*time.Second, "the mirror's read API", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		r, err = mirror.NewReader(ctx, js, mirror.DefaultNames(), o)
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return r
}

// allMirrored waits until every session file under root is mirrored exactly.
func allMirrored(t testing.TB, r *mirror.Reader, root string, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, "every line mirrored", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, p := range sessionFiles(t, root) {
			if ok, why := mirrorMatches(ctx, r, p); !ok {
				return false, why
			}
		}
		return true, ""
	})
}

// testLogLevel is warn, or debug with PISYNC_TEST_DEBUG=1.
func testLogLevel() zapcore.Level {
	if os.Getenv("PISYNC_TEST_DEBUG") != "" {
		return zap.DebugLevel
	}
	return zap.WarnLevel
}

// requireNoDuplicateAcks checks that the daemon never had a publish acknowledged as a
// duplicate: on the normal path, and after a restart past the duplicate window, the
// resume protocol, not the window, must be what keeps lines from being sent twice.
func requireNoDuplicateAcks(t *testing.T, d *daemon) {
	t.Helper()
	if n := metricValue(t, d, "pisync_publish_duplicates_total", nil); n != 0 {
		t.Errorf("%v publishes acknowledged as duplicates, want 0", n)
	}
}

// requireExactlyOnce checks the whole stream: no (conversation, generation, entry) twice,
// and exactly as many messages as the files have complete lines, plus extra lines
// written without a File to count them.
func requireExactlyOnce(t *testing.T, nc *nats.Conn, files []*sessiontest.File, extra int) []streamMsg {
	t.Helper()
	msgs := readStream(t, nc)
	if dups := duplicates(msgs); len(dups) > 0 {
		t.Fatalf("%d duplicates in the stream, e.g. %v", len(dups), dups[:min(5, len(dups))])
	}
	total := extra
	for _, f := range files {
		total += len(f.Lines)
	}
	if len(msgs) != total {
		t.Fatalf("stream holds %d messages, the files %d complete lines", len(msgs), total)
	}
	return msgs
}
