package recovery

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/pisync/pisync/internal/session"
)

// ErrUnsafePath is wrapped when the mirror's metadata would place a file outside the
// chosen root (a source path with "..", an absolute one, an id with a separator): the
// conversation is refused rather than written elsewhere.
var ErrUnsafePath = errors.New("unsafe output path")

// ErrOutsideRoots is wrapped when the mirror's metadata places a file outside the roots
// recovery may write under (--root): whoever can write the owner's heads must not choose
// where files and directories appear. The conversation is refused.
var ErrOutsideRoots = errors.New("outside the roots")

// target is where one conversation's file goes: a root directory that every write is
// confined to and a path relative to it. targetFor checks the path by its text; the
// writes then go through os.Root, which resolves every element under the root
// (openat-style) and refuses a symbolic link leading out of it, also one that appears
// between the check and the write.
type target struct {
	root string // absolute, clean
	rel  string // local to root: no "..", not absolute
}

func (t target) path() string { return filepath.Join(t.root, t.rel) }

// targetFor decides where plan is written. Without out, it is the root and relative path
// recorded in the heads metadata, which must lie under one of roots (absolute, clean);
// the writes are then confined to that root. With out, it is Pi's layout under out:
// --<encoded cwd>--/<timestamp>_<id>.jsonl, keeping the mirrored file name when it is
// one of Pi's for this conversation (the harness names the file from another clock read
// than the header timestamp, so the original name is the better one).
func targetFor(p *Plan, out string, roots []string) (target, error) {
	if out == "" {
		if p.Root == "" {
			return homeFor(p, roots)
		}
		if !filepath.IsAbs(p.Root) || strings.ContainsRune(p.Root, 0) {
			return target{}, fmt.Errorf("%w: the recorded root %q is not absolute; use --out DIR", ErrUnsafePath, p.Root)
		}
		rel := filepath.FromSlash(p.Source)
		if err := checkRel(rel); err != nil {
			return target{}, fmt.Errorf("%w: source path %q: %v", ErrUnsafePath, p.Source, err)
		}
		recorded := filepath.Join(filepath.Clean(p.Root), rel)
		root, ok := rootOf(recorded, roots)
		if !ok {
			return target{}, fmt.Errorf("%w: the mirror places the file at %s, outside the roots (%s); add its root with --root, or use --out DIR",
				ErrOutsideRoots, recorded, strings.Join(roots, ", "))
		}
		below, err := filepath.Rel(root, recorded)
		if err != nil {
			return target{}, fmt.Errorf("%w: %s: %v", ErrOutsideRoots, recorded, err)
		}
		return confined(root, below)
	}
	root, err := filepath.Abs(out)
	if err != nil {
		return target{}, fmt.Errorf("--out %s: %w", out, err)
	}
	rel, err := layoutRel(p)
	if err != nil {
		return target{}, err
	}
	return confined(root, rel)
}

// layoutRel is where Pi's layout rule puts the file under a root:
// --<encoded cwd>--/<timestamp>_<id>.jsonl, keeping the mirrored file name when it is one
// of Pi's for this conversation (the harness names the file from another clock read than
// the header timestamp, so the original name is the better one).
func layoutRel(p *Plan) (string, error) {
	dir := session.DirName(p.Header.Cwd)
	name := path.Base(p.Source)
	if p.Source == "" || !session.IsFileNameOf(name, p.Header.ID) {
		name = session.FileName(p.Header.Timestamp, p.Header.ID)
	}
	for _, elem := range []string{dir, name} {
		if err := checkElem(elem); err != nil {
			return "", fmt.Errorf("%w: %q: %v", ErrUnsafePath, elem, err)
		}
	}
	rel := filepath.Join(dir, name)
	if err := checkRel(rel); err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrUnsafePath, rel, err)
	}
	return rel, nil
}

// homeFor places a conversation whose head is missing or does not decode: under the one
// root given, at the path its lines were mirrored from (each message records it), else
// where Pi's layout rule puts it from its header (or the id and cwd recovery made one
// from). With several roots nothing says which was its own.
func homeFor(p *Plan, roots []string) (target, error) {
	if len(roots) != 1 || !filepath.IsAbs(roots[0]) {
		return target{}, fmt.Errorf("%w: the mirror does not record the file's root (no usable head), and %d roots were given; give the one to restore into with a single --root, or use --out DIR",
			ErrUnsafePath, len(roots))
	}
	root := filepath.Clean(roots[0])
	if rel := filepath.FromSlash(p.Source); p.Source != "" && checkRel(rel) == nil {
		return confined(root, rel)
	}
	if p.Header.Cwd == "" {
		return target{}, fmt.Errorf("%w: no usable head, no recorded source path, and no cwd in the header: Pi's layout rule cannot place it; use --out DIR", ErrUnsafePath)
	}
	rel, err := layoutRel(p)
	if err != nil {
		return target{}, err
	}
	return confined(root, rel)
}

// rootOf returns the deepest of roots that path (absolute, clean) lies strictly below.
// Roots that are not absolute are ignored.
func rootOf(path string, roots []string) (string, bool) {
	var best string
	for _, r := range roots {
		if !filepath.IsAbs(r) {
			continue
		}
		r = filepath.Clean(r)
		if rel, err := filepath.Rel(r, path); err == nil && filepath.IsLocal(rel) && len(r) > len(best) {
			best = r
		}
	}
	return best, best != ""
}

// confined is the target rel under root, checked once more as a whole: whatever the
// checks above let through, a path that is not strictly below root is refused.
func confined(root, rel string) (target, error) {
	t := target{root: root, rel: rel}
	p := t.path()
	if !filepath.IsAbs(root) || !filepath.IsLocal(rel) || !strings.HasPrefix(p, strings.TrimSuffix(root, string(filepath.Separator))+string(filepath.Separator)) {
		return target{}, fmt.Errorf("%w: %q is not below %q", ErrUnsafePath, p, root)
	}
	return t, nil
}

// checkRel accepts a path that stays under its root, written the one clean way (no
// ".", ".." or empty elements, which a recorded path never has), with elements a file
// system takes, naming a session file.
func checkRel(rel string) error {
	switch {
	case !filepath.IsLocal(rel):
		return errors.New("leaves the root (absolute, empty or with \"..\")")
	case rel != filepath.Clean(rel):
		return errors.New("is not a clean path (\".\", \"..\" or empty elements)")
	case strings.ContainsRune(rel, 0):
		return errors.New("contains a NUL byte")
	case !session.IsFileName(rel):
		return errors.New("is not a .jsonl file")
	}
	for _, e := range strings.Split(rel, string(filepath.Separator)) {
		if len(e) > maxNameLen {
			return errors.New("has an element longer than a file name may be")
		}
	}
	return nil
}

// maxNameLen is the longest file name the usual file systems take (NAME_MAX).
const maxNameLen = 255

// checkElem accepts one path element: no separator, not "." or "..".
func checkElem(e string) error {
	switch {
	case e == "" || e == "." || e == "..":
		return errors.New("not a file name")
	case strings.ContainsAny(e, `/\`+"\x00"):
		return errors.New("contains a path separator or NUL")
	case len(e) > maxNameLen:
		return errors.New("longer than a file name may be")
	}
	return nil
}
