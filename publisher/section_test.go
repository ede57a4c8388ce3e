package publisher

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

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
	if _, err := digestSection(f, 4, 20); !errors.Is(err, watcher.ErrReopen) {
		t.Fatalf("short digest: %v, want ErrReopen", err)
	}
	if d, err := digestSection(f, 0, 10); err != nil || len(d) != 64 {
		t.Fatalf("digest: %q %v", d, err)
	}
}
