package rootlock

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAcquire(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "sessions")
	for _, d := range []string{root, filepath.Join(root, "--home-dev-app--"), filepath.Join(base, "other")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		other string // the root a second process asks for while root is held
		held  string // "" = granted; else what the refusal says
	}{
		{"the same root", root, "pisync run (pid"},
		{"the same root through a symbolic link", link, "the same root"},
		{"the same root spelled with a trailing dot", root + "/.", "the same root"},
		{"a root inside it", filepath.Join(root, "--home-dev-app--"), "a root that contains it"},
		{"a root around it", base, "a root inside it"},
		{"a sibling", filepath.Join(base, "other"), ""},
		{"a root not made yet beside it", filepath.Join(base, "later"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(DirEnv, t.TempDir())
			l, err := Acquire(root, "pisync run")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release()
			l2, err := Acquire(tc.other, "pisync recover --follow")
			if tc.held == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				l2.Release()
				return
			}
			var held *HeldError
			if !errors.As(err, &held) || !strings.Contains(err.Error(), tc.held) || !strings.Contains(err.Error(), "never share a root") {
				t.Fatalf("got %v, want a refusal saying %q", err, tc.held)
			}
			// Released, the root is free again.
			l.Release()
			l3, err := Acquire(tc.other, "pisync recover --follow")
			if err != nil {
				t.Fatalf("after release: %v", err)
			}
			l3.Release()
		})
	}
}

// TestAcquireAfterHolderEnded: a lock file left by a process that ended (its lock is
// gone with it) holds nothing.
func TestAcquireAfterHolderEnded(t *testing.T) {
	t.Setenv(DirEnv, t.TempDir())
	root := t.TempDir()
	l, err := Acquire(root, "pisync run")
	if err != nil {
		t.Fatal(err)
	}
	l.Release() // the files stay, as after a crash
	inner := filepath.Join(root, "inner")
	l2, err := Acquire(inner, "pisync recover --follow")
	if err != nil {
		t.Fatalf("a released root still refuses a root inside it: %v", err)
	}
	l2.Release()
}
