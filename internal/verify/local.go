package verify

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/mirror"
)

// LocalFile is a Pi session file found under a watched root.
type LocalFile struct {
	Root     string // absolute, clean
	Rel      string // relative to Root, slash-separated (as the daemon records it)
	Path     string
	Header   session.Header
	HeaderOK bool // a session: a header among its first lines, or entries under Pi's file name (Lead)
	Lead     session.LeadKind
	// Skipped is why a .jsonl is no session in any form (a session.Reason*): the daemon
	// skips it, and status lists it so that nothing under a root is invisible.
	Skipped string
	Size    int64 // bytes
	Torn    int64 // bytes after the last newline (a line still being written, or left by a crash)
	ModTime time.Time
	Err     error // the file could not be read
}

// FindSessions lists the .jsonl files under roots (recursively, symbolic links not
// followed), sorted by path, each read as the daemon reads it (session.Identify): a
// session whatever its first line, a file whose first lines do not decide yet (HeaderOK
// false), or no session at all (Skipped says why). A root that does not exist has no
// files.
func FindSessions(roots []string) ([]LocalFile, error) {
	var out []LocalFile
	for _, r := range roots {
		root, err := filepath.Abs(r)
		if err != nil {
			return nil, fmt.Errorf("root %s: %w", r, err)
		}
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == root && errors.Is(err, fs.ErrNotExist) {
					return filepath.SkipDir
				}
				out = append(out, LocalFile{Root: root, Rel: relSlash(root, p), Path: p, Err: err})
				if d != nil && d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() || !d.Type().IsRegular() || !session.IsFileName(d.Name()) {
				return nil
			}
			f := LocalFile{Root: root, Rel: relSlash(root, p), Path: p}
			if keep := readLocal(&f); keep {
				out = append(out, f)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("walk %s: %w", root, err)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func relSlash(root, p string) string {
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return filepath.ToSlash(p)
	}
	return filepath.ToSlash(rel)
}

// readLocal fills f from the file: size, torn tail and header. It reports whether the
// file is (or may become) a session.
func readLocal(f *LocalFile) bool {
	fh, err := os.Open(f.Path)
	if err != nil {
		f.Err = err
		return true
	}
	defer fh.Close()
	info, err := fh.Stat()
	if err != nil {
		f.Err = err
		return true
	}
	f.Size, f.ModTime = info.Size(), info.ModTime()
	if f.Size == 0 {
		return false // nothing written yet: nothing to mirror
	}
	lb, err := session.ReadLead(fh)
	if err != nil {
		f.Err = err
		return true
	}
	if len(lb.Lines) > 0 {
		lead := session.Identify(filepath.Base(f.Path), lb.Lines, lb.More)
		f.Lead = lead.Kind
		switch lead.Kind {
		case session.LeadHeader, session.LeadHeaderless:
			f.Header, f.HeaderOK = lead.Header, true
		case session.LeadNotSession:
			f.Skipped = lead.Reason
		}
	}
	if f.Torn, err = session.TornTail(fh, f.Size); err != nil {
		f.Err = err
	}
	return true
}

// Lister lists what the mirror holds for the caller; *mirror.Reader implements it.
type Lister interface {
	Conversations(ctx context.Context) (mirror.Listing, error)
}

var _ Lister = (*mirror.Reader)(nil)

// Pair is a local session file and what the mirror has for it. File is nil for a head of
// this host, under one of the roots, whose file is gone. Head is nil for a file the
// mirror has no usable head for: then Headless is the conversation of the stream that
// carries the file's id, if any, and nil for a file the mirror does not know.
type Pair struct {
	File     *LocalFile
	Head     *mirror.Head
	Headless *Headless
}

// Headless is a conversation the stream holds without a usable head: none was written
// (a daemon stopped between acknowledgement and head), or its value does not decode.
type Headless struct {
	Key      string `json:"key"`
	Messages uint64 `json:"messages"`
	Reason   string `json:"reason"`
}

// Surveyed is what Survey found.
type Surveyed struct {
	Pairs []Pair
	Heads []mirror.Head // every head of the owner that decodes
	// Headless are the conversations of the stream without a usable head that no local
	// file carries (they may be another host's).
	Headless []Headless
	BadHeads []mirror.BadHead // values of the heads bucket that do not decode
}

// Survey finds the session files under roots and pairs each with its head: the head of
// this host recorded at the same root and path, else the head of the conversation id in
// the file's header. Heads of this host under these roots that no file claims come back
// with a nil File. The conversations are also listed from the stream itself, so that one
// whose head is missing or does not decode is not hidden: a file carrying its id is
// paired with it (Headless), the others are listed in Surveyed.Headless.
func Survey(ctx context.Context, m Lister, roots []string, host string) (Surveyed, error) {
	files, err := FindSessions(roots)
	if err != nil {
		return Surveyed{}, err
	}
	list, err := m.Conversations(ctx)
	if err != nil {
		return Surveyed{}, err
	}
	heads := list.Heads
	type loc struct{ host, root, source string }
	byLoc := map[loc]int{}
	byKey := map[string]int{}
	for i, h := range heads {
		l := loc{h.Host, filepath.Clean(h.Root), h.Source}
		if j, ok := byLoc[l]; !ok || h.DivergedFrom != nil || heads[j].DivergedFrom == nil {
			byLoc[l] = i // a file mirrored apart after its copy diverged: its own key's head
		}
		byKey[h.ConvKey()] = i
	}
	headless := map[string]*Headless{}
	headErrs := list.HeadErrors()
	for key, n := range list.Counts {
		if _, ok := byKey[key]; ok {
			continue
		}
		reason := "the heads bucket has no head for it"
		if err := headErrs[key]; err != nil {
			reason = err.Error()
		}
		headless[key] = &Headless{Key: key, Messages: n, Reason: reason}
	}
	used := make([]bool, len(heads))
	pairs := make([]Pair, 0, len(files))
	for i := range files {
		f := &files[i]
		p := Pair{File: f}
		if j, ok := byLoc[loc{host, f.Root, f.Rel}]; ok {
			p.Head, used[j] = &heads[j], true
		}
		pairs = append(pairs, p)
	}
	// Second pass by id, for files the daemon recorded elsewhere (moved, another host),
	// then for files whose conversation has no usable head.
	for i := range pairs {
		p := &pairs[i]
		if p.Head != nil || !p.File.HeaderOK {
			continue
		}
		if j, ok := byKey[p.File.Header.ID]; ok && !used[j] {
			p.Head, used[j] = &heads[j], true
		} else if h := headless[p.File.Header.ID]; h != nil {
			p.Headless = h
			delete(headless, h.Key)
		}
	}
	rootSet := map[string]bool{}
	for _, r := range roots {
		if abs, err := filepath.Abs(r); err == nil {
			rootSet[abs] = true
		}
	}
	for j, h := range heads {
		if used[j] || h.Host != host || !rootSet[filepath.Clean(h.Root)] {
			continue
		}
		if i, ok := byLoc[loc{h.Host, filepath.Clean(h.Root), h.Source}]; ok && used[i] && heads[i].DivergedFrom != nil && heads[i].DivergedFrom.Key == h.ConvKey() {
			continue // the head this file's copy had before it diverged (the other host's not written yet)
		}
		pairs = append(pairs, Pair{Head: &heads[j]})
	}
	s := Surveyed{Pairs: pairs, Heads: heads, BadHeads: list.Bad, Headless: []Headless{}}
	for _, h := range headless {
		s.Headless = append(s.Headless, *h)
	}
	sort.Slice(s.Headless, func(i, j int) bool { return s.Headless[i].Key < s.Headless[j].Key })
	return s, nil
}
