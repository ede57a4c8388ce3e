//go:build unix

package watcher

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// nobody is the unprivileged user a test reruns as when the suite runs as root (CI
// does): root reads any file whatever its mode, so a permission error cannot be made
// for it any other way.
const nobody = 65534

// rerunAsNobody runs test name again in a copy of the test binary as user nobody, and
// fails t if that run fails. It skips, saying why, only when the system cannot run a
// process as nobody at all.
func rerunAsNobody(t *testing.T, name string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "watcher-as-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The binary go test built sits in a directory only root may enter.
	bin := filepath.Join(dir, "watcher.test")
	if err := copyFile(os.Args[0], bin, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o777); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "HOME="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		t.Logf("rerun as uid %d:\n%s", nobody, out.String())
	case errors.As(err, &exitErr):
		t.Fatalf("rerun as uid %d failed:\n%s", nobody, out.String())
	default:
		t.Skipf("cannot run a process as uid %d here (%v); root ignores file permissions", nobody, err)
	}
}

func copyFile(from, to string, mode os.FileMode) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}
