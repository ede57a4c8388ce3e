package recovery

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/pisync/pisync/session"
)

// ErrUnsafePath is wrapped when the mirror's metadata would place a file outside the
// chosen root (a source path with "..", an absolute one, an id with a separator): the
// conversation is refused rather than written elsewhere.
var ErrUnsafePath = errors.New("unsafe output path")

// target is where one conversation's file goes: a root directory that every write is
// confined to (through os.Root, which also refuses symbolic links leading out of it)
// and a path relative to it.
type target struct {
	root string // absolute, clean
	rel  string // local to root: no "..", not absolute
}

func (t target) path() string { return filepath.Join(t.root, t.rel) }

// targetFor decides where plan is written. Without out, it is the root and relative path
// recorded in the heads metadata. With out, it is Pi's layout under out:
// --<encoded cwd>--/<timestamp>_<id>.jsonl, keeping the mirrored file name when it is
// one of Pi's for this conversation (the harness names the file from another clock read
// than the header timestamp, so the original name is the better one).
func targetFor(p *Plan, out string) (target, error) {
	if out == "" {
		if p.Root == "" {
			return target{}, fmt.Errorf("%w: the mirror does not record the file's root; use --out DIR", ErrUnsafePath)
		}
		if !filepath.IsAbs(p.Root) {
			return target{}, fmt.Errorf("%w: the recorded root %q is not absolute; use --out DIR", ErrUnsafePath, p.Root)
		}
		rel := filepath.FromSlash(p.Source)
		if err := checkRel(rel); err != nil {
			return target{}, fmt.Errorf("%w: source path %q: %v", ErrUnsafePath, p.Source, err)
		}
		return target{root: filepath.Clean(p.Root), rel: rel}, nil
	}
	root, err := filepath.Abs(out)
	if err != nil {
		return target{}, fmt.Errorf("--out %s: %w", out, err)
	}
	dir := session.DirName(p.Header.Cwd)
	name := path.Base(p.Source)
	if p.Source == "" || !strings.HasSuffix(name, "_"+p.Header.ID+".jsonl") {
		name = session.FileName(p.Header.Timestamp, p.Header.ID)
	}
	for _, elem := range []string{dir, name} {
		if err := checkElem(elem); err != nil {
			return target{}, fmt.Errorf("%w: %q: %v", ErrUnsafePath, elem, err)
		}
	}
	rel := filepath.Join(dir, name)
	if err := checkRel(rel); err != nil {
		return target{}, fmt.Errorf("%w: %q: %v", ErrUnsafePath, rel, err)
	}
	return target{root: root, rel: rel}, nil
}

// checkRel accepts a path that stays under its root and names a session file.
func checkRel(rel string) error {
	switch {
	case !filepath.IsLocal(rel):
		return errors.New("leaves the root (absolute, empty or with \"..\")")
	case strings.ContainsRune(rel, 0):
		return errors.New("contains a NUL byte")
	case !strings.HasSuffix(rel, ".jsonl"):
		return errors.New("is not a .jsonl file")
	}
	return nil
}

// checkElem accepts one path element: no separator, not "." or "..".
func checkElem(e string) error {
	switch {
	case e == "" || e == "." || e == "..":
		return errors.New("not a file name")
	case strings.ContainsAny(e, `/\`+"\x00"):
		return errors.New("contains a path separator or NUL")
	case len(e) > 255:
		return errors.New("longer than a file name may be")
	}
	return nil
}
