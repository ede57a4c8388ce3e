// Package rootlock keeps two pisync processes of one host from writing into one session
// root: `pisync run` mirrors what the root's files gain, `pisync recover --follow` writes
// the mirror's lines into them, and both on one root would take the follower's lines for
// new ones. Each takes an exclusive lock per root in a directory of the user's (not in
// the root: Pi owns it), and refuses a root that overlaps one another process holds.
//
// The locks are advisory file locks (flock, LockFileEx): the kernel drops them when the
// process ends, however it ends, so a crash never leaves a root locked.
package rootlock

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gofrs/flock"
)

// DirEnv names the environment variable that moves the lock directory (default: pisync's
// folder in the user's cache directory).
const DirEnv = "PISYNC_LOCK_DIR"

// Holder is who holds a root.
type Holder struct {
	Root    string `json:"root"`    // absolute, symbolic links resolved
	Command string `json:"command"` // e.g. "pisync run"
	PID     int    `json:"pid"`
}

// HeldError is the refusal to lock a root that overlaps one another process holds.
type HeldError struct {
	Root string // the root asked for
	By   Holder // the holder of it, or of a root inside or around it
}

func (e *HeldError) Error() string {
	where := "the same root"
	switch {
	case e.By.Root == e.Root:
	case within(e.Root, e.By.Root):
		where = "a root that contains it (" + e.By.Root + ")"
	default:
		where = "a root inside it (" + e.By.Root + ")"
	}
	who := e.By.Command
	if e.By.PID > 0 {
		who = fmt.Sprintf("%s (pid %d)", who, e.By.PID)
	}
	return fmt.Sprintf("%s: %s already writes %s on this host; pisync run and pisync recover --follow never share a root (stop one first: see \"A warm standby\" in the README)",
		e.Root, who, where)
}

// Lock is a root held.
type Lock struct {
	fl   *flock.Flock
	info string
}

// Dir is the directory the locks live in.
func Dir() (string, error) {
	if d := os.Getenv(DirEnv); d != "" {
		return d, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("root locks: %w (set %s)", err, DirEnv)
	}
	return filepath.Join(cache, "pisync", "roots"), nil
}

// Acquire locks root for command, or fails with a *HeldError when another process holds
// it, or a root inside or around it.
func Acquire(root, command string) (*Lock, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("root locks: %w", err)
	}
	abs, err := canonical(root)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(abs))
	name := filepath.Join(dir, hex.EncodeToString(sum[:12]))
	fl := flock.New(name + ".lock")
	ok, err := fl.TryLock()
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", abs, err)
	}
	if !ok {
		by := readHolder(name + ".json")
		by.Root = abs
		return nil, &HeldError{Root: abs, By: by}
	}
	l := &Lock{fl: fl, info: name + ".json"}
	if by, held := overlapping(dir, name, abs); held {
		l.Release()
		return nil, &HeldError{Root: abs, By: by}
	}
	b, _ := json.Marshal(Holder{Root: abs, Command: command, PID: os.Getpid()})
	if err := os.WriteFile(l.info, b, 0o600); err != nil {
		l.Release()
		return nil, fmt.Errorf("lock %s: %w", abs, err)
	}
	return l, nil
}

// Release unlocks the root.
func (l *Lock) Release() {
	if l == nil || l.fl == nil {
		return
	}
	_ = l.fl.Unlock()
	l.fl = nil
}

// overlapping finds another held lock of dir whose root contains abs or lies inside it.
func overlapping(dir, own, abs string) (Holder, bool) {
	locks, _ := filepath.Glob(filepath.Join(dir, "*.lock"))
	for _, lock := range locks {
		name := strings.TrimSuffix(lock, ".lock")
		if name == own {
			continue
		}
		h := readHolder(name + ".json")
		if h.Root == "" || !(within(abs, h.Root) || within(h.Root, abs)) {
			continue
		}
		fl := flock.New(lock)
		ok, err := fl.TryLock()
		if err == nil && ok {
			_ = fl.Unlock() // a holder that ended: its lock is free
			continue
		}
		return h, true
	}
	return Holder{}, false
}

func readHolder(path string) Holder {
	var h Holder
	if b, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(b, &h)
	}
	if h.Command == "" {
		h.Command = "another pisync"
	}
	return h
}

// within reports whether path is dir or lies inside it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// canonical is root made absolute with its symbolic links resolved (as far as it
// exists), so that two spellings of one directory take one lock.
func canonical(root string) (string, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("root %s: %w", root, err)
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("root %s: %w", root, err)
	}
	return abs, nil
}
