package conformance

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
)

// serve is `pisync serve` in a process of its own.
type serve struct {
	*daemontest.Proc
	log *daemontest.Output
}

// startServe runs `pisync serve` against the NATS at url and waits until it answers a
// request of the test owner.
func startServe(t *testing.T, url string) *serve {
	t.Helper()
	s := &serve{log: &daemontest.Output{}}
	p, err := daemontest.Start(pisyncBinary(t), []string{"serve", "--nats", url, "--http-addr", "",
		"--log-format", "console", "--log-level", "warn"}, nil, s.log)
	if err != nil {
		t.Fatal(err)
	}
	s.Proc = p
	t.Cleanup(func() {
		s.Kill()
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
		case <-s.Exited():
			t.Fatalf("pisync serve exited: %v\n%s", s.Err(), s.log.String())
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
