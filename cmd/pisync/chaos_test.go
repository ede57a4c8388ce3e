package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

var (
	chaosSeed = flag.Uint64("chaos.seed", 20261130, "seed of the chaos and SIGKILL tests (0: from the clock)")
	chaosFor  = flag.Duration("chaos.for", time.Minute, "how long the chaos test injects faults")
)

// chaosWriter drives a tree of sessions the way Pi and its users do, with a seeded rng.
type chaosWriter struct {
	t     *testing.T
	rng   *rand.Rand
	root  string
	r     *mirror.Reader
	mu    sync.Mutex
	live  []*sessiontest.File
	ops   map[string]int
	count int
}

func (w *chaosWriter) step() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.count++
	roll := w.rng.IntN(100)
	if len(w.live) == 0 || roll < 5 {
		w.create()
		return
	}
	f := w.live[w.rng.IntN(len(w.live))]
	var err error
	switch {
	case roll < 70:
		w.ops["append"]++
		err = f.Append(f.Entry(200 + w.rng.IntN(6000)))
	case roll < 85:
		w.ops["torn"]++
		line := f.Message(500 + w.rng.IntN(3000))
		err = f.AppendSplit(line, 1+w.rng.IntN(len(line)-1), nil)
	case roll < 90:
		w.ops["rewrite-changed"]++
		err = w.rewrite(f, true)
	case roll < 95:
		w.ops["rewrite-kept"]++
		err = w.rewrite(f, false)
	default:
		w.delete(f)
	}
	if err != nil {
		w.t.Error(err)
	}
}

func (w *chaosWriter) create() {
	w.ops["create"]++
	cwd := "/srv/chaos-" + strconv.Itoa(w.rng.IntN(4))
	f := sessiontest.New(w.rng, w.root, cwd, sessiontest.Format(w.rng.IntN(3)))
	if err := f.Append(f.HeaderLine(cwd), f.Entry(300)); err != nil {
		w.t.Error(err)
		return
	}
	w.live = append(w.live, f)
}

// rewrite replaces the file by atomic rename: with one line changed (a new generation
// must follow) or with every line kept and one appended (no new generation).
func (w *chaosWriter) rewrite(f *sessiontest.File, change bool) error {
	lines := append([][]byte(nil), f.Lines...)
	if change && len(lines) > 2 {
		i := 1 + w.rng.IntN(len(lines)-1)
		lines[i] = bytes.Replace(lines[i], []byte(`"timestamp":"`), []byte(`"timestamp":"9`), 1)
	}
	lines = append(lines, f.Entry(400))
	var b bytes.Buffer
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	tmp := f.Path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, f.Path); err != nil {
		return err
	}
	f.Lines = lines
	return nil
}

// delete removes a session once its mirror copy is complete (when the daemon is down for
// long, the deletion is skipped: a file deleted before it was read cannot be mirrored).
func (w *chaosWriter) delete(f *sessiontest.File) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ok, _ := mirrorMatches(ctx, w.r, f.Path); !ok {
		return
	}
	w.ops["delete"]++
	if err := os.Remove(f.Path); err != nil {
		w.t.Error(err)
		return
	}
	for i, g := range w.live {
		if g == f {
			w.live = append(w.live[:i], w.live[i+1:]...)
			break
		}
	}
}

// TestChaos: for about a minute a writer appends (sometimes in torn pieces), rewrites,
// deletes and creates sessions while the daemon is SIGKILLed and restarted at random and
// the server is restarted at random. After catch-up, recovery of every conversation
// equals its local file, and no (conversation, generation, entry) is in the stream twice.
func TestChaos(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a minute of chaos")
	}
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	defer func() {
		if t.Failed() {
			t.Logf("reproduce with: go test ./cmd/pisync -run TestChaos -args -chaos.seed=%d", seed)
		}
	}()
	t.Logf("seed %d", seed)
	bin := daemontest.Binary(t)
	srv := natstest.Run(t)
	root, state := t.TempDir(), t.TempDir()
	nc := natstest.Connect(t, srv.URL())
	args := []string{"run", "--nats", srv.URL(), "--root", root, "--state-dir", state, "--http-addr", "",
		"--tenant", "t1", "--owner", "alice", "--log-level", "info", "--duplicate-window", "2s", "--ack-timeout", "2s"}
	var daemon *exec.Cmd
	logs := &daemontest.Output{}
	defer func() {
		if t.Failed() {
			path := filepath.Join(os.TempDir(), fmt.Sprintf("pisync-chaos-%d.log", seed))
			if err := os.WriteFile(path, []byte(logs.Tail(1<<30)), 0o644); err == nil {
				t.Logf("daemon logs in %s; the last 4 KiB:\n%s", path, logs.Tail(4<<10))
			}
		}
	}()
	start := func() {
		daemon = exec.Command(bin, args...)
		daemon.Stderr = logs
		if err := daemon.Start(); err != nil {
			t.Fatal(err)
		}
	}
	kill := func() {
		_ = daemon.Process.Signal(syscall.SIGKILL)
		_ = daemon.Wait()
	}
	start()
	waitFor(t, 20*time.Second, "stream provisioned", func() (bool, string) { return streamExists(nc), "not yet" })
	w := &chaosWriter{t: t, rng: rand.New(rand.NewPCG(seed, 1)), root: root, r: newReader(t, nc, "t1", "alice"), ops: map[string]int{}}

	ctx, stop := context.WithTimeout(context.Background(), *chaosFor)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pace := rand.New(rand.NewPCG(seed, 2))
		for ctx.Err() == nil {
			w.step()
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(1+pace.IntN(15)) * time.Millisecond): // the writer's pace
			}
		}
	}()
	faults := rand.New(rand.NewPCG(seed, 3))
	kills, restarts := 0, 0
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(500+faults.IntN(3000)) * time.Millisecond): // time between faults
		}
		if ctx.Err() != nil {
			break
		}
		if faults.IntN(3) > 0 {
			kills++
			kill()
			time.Sleep(time.Duration(faults.IntN(1500)) * time.Millisecond) // daemon down for a while
			start()
		} else {
			restarts++
			srv.Stop()
			time.Sleep(time.Duration(faults.IntN(2000)) * time.Millisecond) // server down for a while
			srv.Restart()
		}
	}
	wg.Wait()
	t.Logf("%d writer steps %v, %d daemon kills, %d server restarts", w.count, w.ops, kills, restarts)

	r := newReader(t, nc, "t1", "alice")
	allMirrored(t, r, root, 120*time.Second)
	_ = daemon.Process.Signal(syscall.SIGTERM)
	if err := daemon.Wait(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
	if dups := duplicates(readStream(t, nc)); len(dups) > 0 {
		t.Fatalf("seed %d: %d duplicates, e.g. %v", seed, len(dups), dups[:min(5, len(dups))])
	}
	out := t.TempDir()
	rec := exec.Command(bin, "recover", "--all", "--out", out, "--nats", srv.URL(), "--tenant", "t1", "--owner", "alice", "--json")
	var stdout, stderr bytes.Buffer
	rec.Stdout, rec.Stderr = &stdout, &stderr
	if err := rec.Run(); err != nil {
		t.Fatalf("seed %d: recover --all: %v\n%s\n%s", seed, err, stderr.String(), failedReports(stdout.Bytes()))
	}
	for _, f := range w.live {
		rel, _ := filepath.Rel(root, f.Path)
		got, err := os.ReadFile(filepath.Join(out, rel))
		if err != nil {
			t.Errorf("seed %d: %s not recovered: %v\nreports of conversation %s:\n%s", seed, rel, err, f.ID, reportsOf(stdout.Bytes(), f.ID))
			continue
		}
		if !bytes.Equal(got, f.Content()) {
			t.Errorf("seed %d: recovered %s differs from the local file\nreports of conversation %s:\n%s", seed, rel, f.ID, reportsOf(stdout.Bytes(), f.ID))
		}
	}
}

// failedReports picks the conversations recover did not restore out of its --json report.
// reportsOf returns recover's reports of conversation id (and of its clash keys).
func reportsOf(report []byte, id string) string {
	return reportsWhere(report, func(c map[string]any) bool {
		conv, _ := c["conversation"].(string)
		key, _ := c["key"].(string)
		return conv == id || strings.HasPrefix(key, id)
	})
}

// failedReports returns recover's reports of conversations not written or unchanged.
func failedReports(report []byte) string {
	return reportsWhere(report, func(c map[string]any) bool {
		r, _ := c["result"].(string)
		return r != "written" && r != "unchanged"
	})
}

// reportsWhere returns the reports of recover --json that keep picks, one JSON per line.
func reportsWhere(report []byte, keep func(map[string]any) bool) string {
	var doc struct {
		Conversations []map[string]any `json:"conversations"`
	}
	if err := json.Unmarshal(report, &doc); err != nil {
		return string(report[:min(len(report), 4096)])
	}
	var out []string
	for _, c := range doc.Conversations {
		if keep(c) {
			b, _ := json.Marshal(c)
			out = append(out, string(b))
		}
	}
	return strings.Join(out, "\n")
}
