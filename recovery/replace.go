package recovery

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrTargetChanged is wrapped when the file at a target changed between its inspection
// and the rename that replaces it (lines appended, rewritten, replaced, created): it may
// hold lines the mirror lacks, so the conversation is refused, as for any such file.
var ErrTargetChanged = errors.New("the target changed")

// tailCheck is how many bytes at the end of a file its state covers: what an append or a
// rewrite of the last lines changes even when the size and modification time do not.
const tailCheck = 4096

// fileState is what a file is at one moment, compared before and after: its size, its
// modification time, and the digest of its last tailCheck bytes.
type fileState struct {
	size  int64
	mtime int64 // UnixNano
	tail  [sha256.Size]byte
}

// stateOf reads the state of f through its descriptor, and its identity (for
// os.SameFile).
func stateOf(f *os.File) (os.FileInfo, fileState, error) {
	info, err := f.Stat()
	if err != nil {
		return nil, fileState{}, err
	}
	st := fileState{size: info.Size(), mtime: info.ModTime().UnixNano()}
	buf := make([]byte, min(st.size, tailCheck))
	if _, err := f.ReadAt(buf, st.size-int64(len(buf))); err != nil {
		return nil, fileState{}, err // io.EOF: shorter than a moment ago
	}
	st.tail = sha256.Sum256(buf)
	return info, st, nil
}

// inspected is a file found at a target, kept open from its inspection until the commit is
// settled, and what it was when inspected.
type inspected struct {
	f    *os.File // nil: none
	id   os.FileInfo
	want fileState
}

func (h *inspected) close() {
	if h.f != nil {
		h.f.Close()
		h.f = nil
	}
}

// unchanged fails with ErrTargetChanged unless the held file is as inspected.
func (h *inspected) unchanged(path string) error {
	_, now, err := stateOf(h.f)
	if err != nil || now != h.want {
		return fmt.Errorf("%w: %s was written to since it was inspected (%d bytes then, %d now)", ErrTargetChanged, path, h.want.size, now.size)
	}
	return nil
}

// testHook, when set by a test, is called at each step of a commit (commit, checked,
// renamed, settle), so that a test can write to the target in each window.
var testHook func(step string, t target)

func hook(step string, t target) {
	if testHook != nil {
		testHook(step, t)
	}
}

// sibling is a fresh name beside rel: prefix, rel's base name, ".pisync-", a random
// part, suffix. Names that do not end in .jsonl are ignored by the daemon and by Pi.
func sibling(rel, prefix, suffix string) string {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:]) // crypto/rand does not fail on supported platforms
	return filepath.Join(filepath.Dir(rel), prefix+filepath.Base(rel)+".pisync-"+hex.EncodeToString(rnd[:])+suffix)
}

// place puts the durable temporary file at its target: without replacing anything when
// there was no file there at the inspection, else through replace. On failure it aborts.
func (s *staged) place() error {
	hook("commit", s.t)
	if s.old.f != nil {
		return s.replace()
	}
	root := s.made.root
	// A hard link fails when the target exists: a rename that replaces nothing.
	err := root.Link(s.tmp, s.t.rel)
	if err == nil {
		_ = root.Remove(s.tmp)
		return nil
	}
	if !errors.Is(err, fs.ErrExist) {
		// No hard links on this file system: check, then rename.
		if _, serr := root.Lstat(s.t.rel); errors.Is(serr, fs.ErrNotExist) {
			if err = root.Rename(s.tmp, s.t.rel); err == nil {
				return nil
			}
		} else if serr == nil {
			err = fs.ErrExist
		}
	}
	s.abort()
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: rename into %s: a file is there now, none was when it was inspected; recover it again", ErrTargetChanged, s.t.path())
	}
	return fmt.Errorf("rename into %s: %w", s.t.path(), err)
}

// replace renames the temporary file over the file that was at the target when it was
// inspected, and only over that file, unchanged: the same file (by identity), with the
// same size, modification time and tail.
//
// A rename is not conditional, so the check comes as late as it can, and the replaced
// file keeps a second name (bak) until the commit is settled: a writer that appended to
// it between the check and the rename, or that had it open across the rename, wrote
// into that file, and settle puts it back. On failure before the rename it aborts.
func (s *staged) replace() error {
	root, rel := s.made.root, s.t.rel
	bak := sibling(rel, ".", ".replaced")
	if err := root.Link(rel, bak); err != nil {
		s.abort()
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s was removed since it was inspected; recover it again", ErrTargetChanged, s.t.path())
		}
		return fmt.Errorf("keep %s while it is replaced: %w (on a file system without hard links, move it aside to recover it)", s.t.path(), err)
	}
	fail := func(err error) error {
		_ = root.Remove(bak)
		s.abort()
		return err
	}
	for _, name := range []string{rel, bak} {
		if info, err := root.Stat(name); err != nil || !os.SameFile(info, s.old.id) {
			return fail(fmt.Errorf("%w: %s was replaced since it was inspected; recover it again", ErrTargetChanged, s.t.path()))
		}
	}
	if err := s.old.unchanged(s.t.path()); err != nil {
		return fail(err)
	}
	hook("checked", s.t)
	if err := root.Rename(s.tmp, rel); err != nil {
		return fail(fmt.Errorf("rename into %s: %w", s.t.path(), err))
	}
	s.bak = bak
	hook("renamed", s.t)
	return s.settle(false)
}

// settle checks that the file replaced has not changed since it was checked; if it has,
// lines were written to it that the path no longer shows, and it is put back. It is
// called right after the rename, and once more when the directory is synced (final),
// after which the replaced file's second name goes.
func (s *staged) settle(final bool) error {
	if s.bak == "" {
		return nil
	}
	if err := s.old.unchanged(s.t.path()); err != nil {
		return s.putBack(err)
	}
	if final {
		_ = s.made.root.Remove(s.bak)
		s.bak = ""
	}
	return nil
}

// putBack renames the replaced file back over the rebuilt one, after giving the rebuilt
// one a name of its own, since a writer may have appended to it since the rename. If
// none did, that name goes, and the conversation is refused (ErrTargetChanged);
// otherwise it stays, and the error names it. Nothing written by anyone is lost.
func (s *staged) putBack(cause error) error {
	root, rel, path := s.made.root, s.t.rel, s.t.path()
	kept := sibling(rel, "", "-rebuilt")
	if err := root.Link(rel, kept); err != nil {
		if err := keepCopy(root, kept, s.f); err != nil {
			kept = ""
		}
	}
	if err := root.Rename(s.bak, rel); err != nil {
		visible := sibling(rel, "", "-replaced")
		if root.Rename(s.bak, visible) == nil {
			s.bak = ""
			return fmt.Errorf("%v, but putting it back failed (%v): it is kept at %s, with what was written to it", cause, err, filepath.Join(s.t.root, visible))
		}
		return fmt.Errorf("%v, but putting it back failed (%v): it is kept at %s, with what was written to it", cause, err, filepath.Join(s.t.root, s.bak))
	}
	s.bak = ""
	_ = syncDir(root, filepath.Dir(rel))
	keptInfo, keptErr := root.Lstat(kept)
	rebuiltInfo, now, err := stateOf(s.f)
	if kept != "" && keptErr == nil && err == nil && os.SameFile(keptInfo, rebuiltInfo) && now == s.rebuilt {
		_ = root.Remove(kept)
		return fmt.Errorf("%w, during the rename: it is back as it was, with what was written to it, and the conversation was not recovered; recover it again once nothing writes to it", cause)
	}
	if kept == "" {
		return fmt.Errorf("%v, during the rename: it is back as it was, with what was written to it; the rebuilt file may have been written to meanwhile, and could not be kept", cause)
	}
	return fmt.Errorf("%v, during the rename, and the rebuilt file was written to as well: %s is back as it was, with what was written to it; the rebuilt file, with what was written to it, is kept at %s: merge them by hand",
		cause, path, filepath.Join(s.t.root, kept))
}

// keepCopy writes what f holds to name under root: the fallback when a second name
// cannot be made.
func keepCopy(root *os.Root, name string, f *os.File) error {
	out, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, io.NewSectionReader(f, 0, 1<<62))
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = root.Remove(name)
	}
	return err
}
