package publisher

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/watcher"
)

// TestShortSectionIsReopen pins issue 13 item 7: a line re-read after the file shrank
// (rewritten under it) was padded with zeros and published; a short section must ask
// the watcher to reopen the file instead.
func TestShortSectionIsReopen(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.jsonl")
	if err := os.WriteFile(p, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if b, err := readSection(f, 2, 8); err != nil || !bytes.Equal(b, []byte("23456789")) {
		t.Fatalf("whole section: %q %v", b, err)
	}
	if b, err := readSection(f, 4, 20); !errors.Is(err, watcher.ErrReopen) || b != nil {
		t.Fatalf("short section: %q %v, want ErrReopen and no bytes", b, err)
	}
	if _, _, err := digestSection(f, 4, 20); !errors.Is(err, watcher.ErrReopen) {
		t.Fatalf("short digest: %v, want ErrReopen", err)
	}
	if prefix, d, err := digestSection(f, 0, 10); err != nil || d != sha256.Sum256([]byte("0123456789")) || string(prefix) != "0123456789" {
		t.Fatalf("digest: %q %x %v", prefix, d, err)
	}
}

// TestDigestSectionPastPrefix: a section longer than the prefix kept for its envelope is
// hashed whole, and cut short past the prefix is still ErrReopen.
func TestDigestSectionPastPrefix(t *testing.T) {
	content := bytes.Repeat([]byte("0123456789abcdef"), (session.LinePrefixKeep+1000)/16)
	p := filepath.Join(t.TempDir(), "s.jsonl")
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prefix, d, err := digestSection(f, 3, int64(len(content)-3))
	if err != nil || d != sha256.Sum256(content[3:]) || !bytes.Equal(prefix, content[3:3+session.LinePrefixKeep]) {
		t.Fatalf("digest: %d bytes of prefix, %x, %v", len(prefix), d, err)
	}
	if _, _, err := digestSection(f, 3, int64(len(content))); !errors.Is(err, watcher.ErrReopen) {
		t.Fatalf("short digest past the prefix: %v, want ErrReopen", err)
	}
}
