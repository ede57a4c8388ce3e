package conformance

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pisync/pisync/internal/testutil/natstest"
)

// serve is `pisync serve` in a process of its own.
type serve struct {
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
	err  error
}

// startServe runs `pisync serve` against the NATS at url and waits until it answers a
// request of the test owner.
func startServe(t *testing.T, url string) *serve {
	t.Helper()
	s := &serve{log: &syncBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(pisyncBinary(t), "serve", "--nats", url, "--http-addr", "", "--log-format", "console", "--log-level", "warn")
	s.cmd.Env = childEnv()
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start pisync serve: %v", err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		s.kill()
		if log := s.log.String(); t.Failed() && log != "" {
			t.Logf("pisync serve's log:\n%s", log)
		}
	})
	nc := natstest.Connect(t, url)
	defer nc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		msg, err := nc.Request("pisync.store."+tenant+"."+owner+".list", []byte(`{}`), time.Second)
		if err == nil && len(msg.Data) > 0 {
			return s
		}
		select {
		case <-s.done:
			t.Fatalf("pisync serve exited: %v\n%s", s.err, s.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pisync serve does not answer after 30 s: %v\n%s", err, s.log.String())
		}
		if err != nil && err != nats.ErrNoResponders && err != nats.ErrTimeout {
			t.Fatalf("probe pisync serve: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a poll-with-deadline
	}
}

// kill sends SIGKILL (if it still runs) and waits for the process to end.
func (s *serve) kill() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}
