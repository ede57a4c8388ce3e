package recovery

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
)

// hostile are path fragments that try to leave a directory or break a name.
var hostile = []string{
	"", ".", "..", "../..", "/", "//", "/etc/passwd", "a/../../b", "..\\..\\x", "x\x00y",
	"*", ">", " ", "\xff\xfe", "--link--", "/link", "link", "~", strings.Repeat("a", 300),
	"0192f0a4-5e1c-7a3b-9c2d-000000000003",
}

// FuzzTarget: whatever the mirror recorded (root, source path) and whatever the header
// says (cwd, id, timestamp), an output path is either refused as unsafe or strictly
// below its root, in clean form, naming a .jsonl file; with --out, a real write through
// a tree holding symbolic links that lead out of it creates files below --out only,
// with mode 0600 and directories 0700.
func FuzzTarget(f *testing.F) {
	for _, a := range hostile {
		f.Add("/srv/pi/sessions", a, "/home/dev/"+a, a, "2026-11-01T09:00:00.000Z")
		f.Add(a, "--home-dev--/2026-11-01T09-00-00-000Z_"+a+".jsonl", a, "id", a)
	}
	f.Add("/srv/pi/sessions", "--x--/../../../etc/cron.d/x.jsonl", "/x", "id", "t")
	f.Add("/srv/pi/sessions", "--x--/2026_id.jsonl", "/link", "id", "t")
	f.Add("/srv/pi/sessions", "", "/up", "../up", "..")
	f.Add("/srv/pi/sessions/../../../etc", "cron.d/x.jsonl", "/x", "id", "t")
	f.Add("/srv/pi/sessions-other", "x.jsonl", "/x", "id", "t")
	f.Add("/srv/pi/sessions/deeper", "x.jsonl", "/x", "id", "t")
	f.Add("/srv/pi", "sessions/x.jsonl", "/x", "id", "t")
	configured := []string{"/srv/pi/sessions", "/home/u/.pi"}
	f.Fuzz(func(t *testing.T, root, source, cwd, id, ts string) {
		p := &Plan{Root: root, Source: source, Header: session.Header{ID: id, Cwd: cwd, Timestamp: ts}}
		if tg, err := targetFor(p, "", []string{root}); err == nil {
			checkConfined(t, tg, filepath.Clean(root))
		} else if !errors.Is(err, ErrUnsafePath) {
			t.Fatalf("recorded root %q, source %q: %v does not say the path is unsafe", root, source, err)
		}
		// Whatever root the mirror records, nothing is placed outside the configured ones.
		if tg, err := targetFor(p, "", configured); err == nil {
			if tg.root != configured[0] && tg.root != configured[1] {
				t.Fatalf("recorded root %q, source %q: placed under %q, not a configured root", root, source, tg.root)
			}
			checkConfined(t, tg, tg.root)
		} else if !errors.Is(err, ErrUnsafePath) && !errors.Is(err, ErrOutsideRoots) {
			t.Fatalf("recorded root %q, source %q: %v does not say the path is unsafe or outside the roots", root, source, err)
		}

		// The relative path does not depend on --out: check it first, and build a tree
		// to write into only for paths that pass.
		if _, err := targetFor(p, "/out", nil); err != nil {
			if !errors.Is(err, ErrUnsafePath) {
				t.Fatalf("--out: cwd %q, id %q, timestamp %q, source %q: %v does not say the path is unsafe", cwd, id, ts, source, err)
			}
			return
		}
		base := t.TempDir()
		out, outside := filepath.Join(base, "out"), filepath.Join(base, "outside")
		for _, d := range []string{out, outside} {
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		// Symbolic links where a session directory may go: out of the tree, up, inside.
		for name, to := range map[string]string{"--link--": outside, "--up--": "..", "--in--": "."} {
			if err := os.Symlink(to, filepath.Join(out, name)); err != nil {
				t.Fatal(err)
			}
		}
		tg, err := targetFor(p, out, nil)
		if err != nil {
			t.Fatalf("--out %s: %v, but %q passed under /out", out, err, cwd)
		}
		checkConfined(t, tg, out)
		if strings.Count(tg.rel, string(filepath.Separator)) != 1 {
			t.Fatalf("--out: %q is not <session directory>/<file>", tg.rel)
		}
		line := []byte(`{"type":"session","id":"x"}`)
		plan := &Plan{Lines: []OutLine{{Data: line, SHA256: session.Digest(line), Size: int64(len(line))}}}
		werr := writeAtomic(context.Background(), nil, tg, plan)
		leaked := ""
		_ = filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
			if err != nil || path == base || path == out || path == outside {
				return nil
			}
			if !strings.HasPrefix(path, out+string(filepath.Separator)) {
				leaked = path
				return nil
			}
			info, err := os.Lstat(path)
			if err != nil || info.Mode()&fs.ModeSymlink != 0 {
				return nil
			}
			if want := os.FileMode(0o600); info.IsDir() {
				if info.Mode().Perm() != 0o700 {
					t.Errorf("directory %s: mode %v", path, info.Mode().Perm())
				}
			} else if info.Mode().Perm() != want {
				t.Errorf("file %s: mode %v", path, info.Mode().Perm())
			}
			return nil
		})
		if leaked != "" {
			t.Fatalf("--out: cwd %q, id %q: %s written outside %s", cwd, id, leaked, out)
		}
		if werr == nil {
			if real, err := filepath.EvalSymlinks(tg.path()); err != nil || !strings.HasPrefix(real, out+string(filepath.Separator)) {
				t.Fatalf("--out: %s is %s (%v), not below %s", tg.path(), real, err, out)
			}
		}
	})
}

// checkConfined fails unless t is a clean relative .jsonl path strictly below root.
func checkConfined(t *testing.T, tg target, root string) {
	t.Helper()
	p := tg.path()
	switch {
	case !filepath.IsAbs(tg.root) || tg.root != filepath.Clean(tg.root) || tg.root != root:
		t.Fatalf("root %q, want %q", tg.root, root)
	case !filepath.IsLocal(tg.rel) || tg.rel != filepath.Clean(tg.rel) || strings.ContainsRune(tg.rel, 0):
		t.Fatalf("relative path %q", tg.rel)
	case !strings.HasSuffix(tg.rel, ".jsonl"):
		t.Fatalf("%q is not a .jsonl file", tg.rel)
	case p != filepath.Join(root, tg.rel) || !strings.HasPrefix(p, strings.TrimSuffix(root, "/")+"/"):
		t.Fatalf("%q is not below %q", p, root)
	}
	for _, e := range strings.Split(tg.rel, string(filepath.Separator)) {
		if e == ".." || e == "." || e == "" || len(e) > maxNameLen {
			t.Fatalf("%q has the element %q", tg.rel, e)
		}
	}
}

// TestTargetRefusals: recorded paths that are not clean, or with elements no file
// system takes, are refused before anything is opened.
func TestTargetRefusals(t *testing.T) {
	for _, tc := range []struct{ root, source string }{
		{"/srv/s", "a/../b.jsonl"},
		{"/srv/s", "./b.jsonl"},
		{"/srv/s", "a//b.jsonl"},
		{"/srv/s", "a/" + strings.Repeat("x", 260) + ".jsonl"},
		{"/srv/s", "../b.jsonl"},
		{"/srv/s", "/b.jsonl"},
		{"/srv/s", "b.txt"},
		{"/srv/s\x00", "b.jsonl"},
		{"srv/s", "b.jsonl"},
	} {
		if tg, err := targetFor(&Plan{Root: tc.root, Source: tc.source}, "", []string{"/srv/s"}); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("root %q, source %q: %v (%+v), want unsafe", tc.root, tc.source, err, tg)
		}
	}
	if tg, err := targetFor(&Plan{Root: "/srv/s/", Source: "--w--/a_id.jsonl"}, "", []string{"/srv/s"}); err != nil || tg.path() != "/srv/s/--w--/a_id.jsonl" {
		t.Errorf("a clean path: %+v, %v", tg, err)
	}
}

// TestTargetRoots: without --out, a file is placed only below a configured root, and its
// writes are confined to that root (the deepest, when roots nest); a recorded root
// elsewhere, or one that climbs out with "..", is refused.
func TestTargetRoots(t *testing.T) {
	roots := []string{"/home/u/.pi/agent/sessions", "/srv/app/sessions", "/srv/app/sessions/nested"}
	for _, tc := range []struct {
		root, source string
		wantRoot     string // "": refused as outside the roots
	}{
		{"/home/u/.pi/agent/sessions", "--w--/a.jsonl", "/home/u/.pi/agent/sessions"},
		{"/home/u/.pi/agent/sessions/", "--w--/a.jsonl", "/home/u/.pi/agent/sessions"},
		{"/srv/app/sessions/sub", "--w--/a.jsonl", "/srv/app/sessions"},
		{"/srv/app/sessions/nested", "a.jsonl", "/srv/app/sessions/nested"},
		{"/srv/app", "sessions/a.jsonl", "/srv/app/sessions"},
		{"/srv/app", "other/a.jsonl", ""},
		{"/srv/app/sessions-2", "a.jsonl", ""},
		{"/etc", "cron.d/x.jsonl", ""},
		{"/home/u/.pi/agent/sessions/../../../../etc", "x.jsonl", ""},
		{"/", "home/u/.pi/agent/sessions/a.jsonl", "/home/u/.pi/agent/sessions"},
	} {
		tg, err := targetFor(&Plan{Root: tc.root, Source: tc.source}, "", roots)
		switch {
		case tc.wantRoot == "" && !errors.Is(err, ErrOutsideRoots):
			t.Errorf("root %q, source %q: %+v, %v; want refused as outside the roots", tc.root, tc.source, tg, err)
		case tc.wantRoot == "" && !strings.Contains(err.Error(), "--root"):
			t.Errorf("root %q: %v does not say how to allow it", tc.root, err)
		case tc.wantRoot != "" && (err != nil || tg.root != tc.wantRoot || tg.path() != filepath.Join(tc.root, tc.source)):
			t.Errorf("root %q, source %q: %+v, %v; want under %s", tc.root, tc.source, tg, err, tc.wantRoot)
		}
	}
	if _, err := targetFor(&Plan{Root: "/srv/s", Source: "a.jsonl"}, "", nil); !errors.Is(err, ErrOutsideRoots) {
		t.Errorf("no root configured: %v, want refused", err)
	}
}

// TestTargetSymlinks: symbolic links already in --out — the session directory leading
// out of the tree (absolute or relative), the file itself leading out (existing or
// dangling) — cannot place or change a file outside --out, with --force either; a link
// that stays inside the tree is followed.
func TestTargetSymlinks(t *testing.T) {
	tm := newTestMirror(t)
	lines := mirrortest.ReadLines(t, filepath.Join("testdata", "golden", "missing_middle", "input.jsonl"))
	m := mirrortest.MirrorFile(t, lines, 1, 0)
	head := mirrortest.DaemonHead(lines, m, 1)
	tm.Publish(t, m, m.Msgs, &head)
	dir := session.DirName("/home/dev/alpha")
	name := filepath.Base(m.Source)
	for _, tc := range []struct {
		name   string
		plant  func(t *testing.T, out, outside string)
		inside bool // the write may succeed, inside --out
	}{
		{"directory to outside", func(t *testing.T, out, outside string) {
			symlink(t, outside, filepath.Join(out, dir))
		}, false},
		{"directory to outside, relative", func(t *testing.T, out, _ string) {
			symlink(t, "../outside", filepath.Join(out, dir))
		}, false},
		{"file to an outside file", func(t *testing.T, out, outside string) {
			mkdir(t, filepath.Join(out, dir))
			if err := os.WriteFile(filepath.Join(outside, "victim.jsonl"), []byte("keep\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			symlink(t, filepath.Join(outside, "victim.jsonl"), filepath.Join(out, dir, name))
		}, false},
		{"file dangling outside", func(t *testing.T, out, outside string) {
			mkdir(t, filepath.Join(out, dir))
			symlink(t, filepath.Join(outside, "new.jsonl"), filepath.Join(out, dir, name))
		}, false},
		{"directory inside", func(t *testing.T, out, _ string) {
			mkdir(t, filepath.Join(out, "real"))
			symlink(t, "real", filepath.Join(out, dir))
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			out, outside := filepath.Join(base, "out"), filepath.Join(base, "outside")
			mkdir(t, out)
			mkdir(t, outside)
			tc.plant(t, out, outside)
			before := snapshot(t, outside)
			rep := New(tm.Reader, Options{Out: out, Force: true}).One(mirrortest.Ctx(t), m.Conv)
			if after := snapshot(t, outside); !sameSnapshot(before, after) {
				t.Fatalf("%s: written outside --out: %v → %v", rep.Result, keys(before), keys(after))
			}
			if !tc.inside && rep.Result.OK() {
				t.Fatalf("written through a link leading out: %s", rep.Output)
			}
			if tc.inside {
				got, err := os.ReadFile(filepath.Join(out, "real", name))
				if rep.Result != Written || err != nil || string(got) != string(mirrortest.JoinLines(lines)) {
					t.Fatalf("%s (%s): %v", rep.Result, rep.Reason, err)
				}
			}
		})
	}
}

func symlink(t *testing.T, to, at string) {
	t.Helper()
	if err := os.Symlink(to, at); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, d string) {
	t.Helper()
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
}
