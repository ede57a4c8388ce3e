package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// procKB reads a "VmHWM:"-style field of /proc/<pid>/status, in KiB.
func procKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestHugeLineBoundedMemory: a 100 MB line is streamed to the object store by the daemon
// (a process of its own, so that its memory is measured alone) with a peak RSS growth
// under 64 MB, and reads back byte-identical.
func TestHugeLineBoundedMemory(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("100 MB line")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc")
	}
	bin := daemontest.Binary(t)
	rng := rand.New(rand.NewPCG(61, 62))
	srv := natstest.Run(t)
	root := t.TempDir()
	f := sessiontest.New(rng, root, "/big", sessiontest.HarnessV3)
	if err := f.Append(f.HeaderLine("/big"), f.Entry(300)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--nats", srv.URL(), "--root", root, "--state-dir", t.TempDir(),
		"--http-addr", "", "--tenant", "t1", "--owner", "alice", "--log-level", "warn")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	nc := natstest.Connect(t, srv.URL())
	waitFor(t, 20*time.Second, "stream provisioned", func() (bool, string) {
		return streamExists(nc), "not yet"
	})
	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 30*time.Second)
	before := procKB(t, cmd.Process.Pid, "VmHWM")

	// The line is written the way Pi's harness writes a large line: in several writes.
	head := fmt.Sprintf(`{"type":"message","id":"b16b16b1","parentId":%q,"timestamp":"2026-11-30T00:00:00.000Z","message":{"role":"toolResult","content":[{"type":"text","text":"`, f.Leaf())
	chunk := []byte(strings.Repeat("0123456789abcdef", 1<<16)) // 1 MiB
	h := sha256.New()
	write := func(b []byte) {
		h.Write(b)
		if err := sessiontest.AppendBytes(f.Path, b); err != nil {
			t.Fatal(err)
		}
	}
	write([]byte(head))
	for range 100 {
		write(chunk)
	}
	write([]byte(`"}]}}`))
	want := hex.EncodeToString(h.Sum(nil))
	if err := sessiontest.AppendBytes(f.Path, []byte("\n")); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c, _ := r.Conv(f.ID)
	var blob mirror.Msg
	waitFor(t, 120*time.Second, "the 100 MB line mirrored", func() (bool, string) {
		g, err := r.ReadGeneration(ctx, c, 0)
		if err != nil || len(g.Msgs) < 3 {
			return false, fmt.Sprintf("%v", err)
		}
		blob = g.Msgs[2]
		return true, ""
	})
	after := procKB(t, cmd.Process.Pid, "VmHWM")
	t.Logf("daemon peak RSS %d MiB before the line, %d MiB after", before>>10, after>>10)
	if growth := after - before; growth > 64<<10 {
		t.Errorf("peak RSS grew by %d MiB for a 100 MB line; the bound is 64 MiB", growth>>10)
	}
	if blob.Kind != mirror.KindBlob || blob.SHA256 != want || blob.EntryID != "b16b16b1" || blob.EntryType != "message" {
		t.Fatalf("line 3 mirrored as %+v", blob.Line)
	}
	// The read-back has a deadline of its own: the wait above may have used most of the
	// first one on a loaded machine (the test runs beside others).
	rctx, rcancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer rcancel()
	rc, err := r.Blob(rctx, blob.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h2 := sha256.New()
	n, err := io.Copy(h2, rc)
	if err != nil || hex.EncodeToString(h2.Sum(nil)) != want {
		t.Fatalf("blob read back: %d bytes, %v, digest differs", n, err)
	}
}

// streamExists reports whether the mirror (stream and both buckets) has been provisioned.
func streamExists(nc *nats.Conn) bool {
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	o, _ := mirror.NewOwner("t1", "alice")
	_, err = mirror.NewReader(ctx, js, mirror.DefaultNames(), o)
	return err == nil
}
