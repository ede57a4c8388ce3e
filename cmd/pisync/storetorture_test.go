package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/pisync/pisync/internal/testutil/daemontest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// The store torture run: a seeded schedule of store operations (create, append by 1 to 4
// concurrent clients, some on stale heads, some replaying a request whose reply they got,
// fork whole or at an entry, delete, open, list, entries above max_payload) against 2 or
// 3 `pisync serve` processes, with SIGKILL and restart of a replica (at once, or while the
// next operation runs) and restarts of the NATS server; at quiet points, the invariants
// of DESIGN §8 (storetorture_check_test.go).
//
// go test ./cmd/pisync -run TestStoreTorture runs one seed within a short budget (CI);
// make store-torture runs fresh seeds for STORE_TORTURE_DURATION.

var (
	storeTortureSeed = flag.Uint64("store-torture.seed", 20261205, "seed of the store torture run (0: from the clock)")
	storeTortureOps  = flag.Int("store-torture.ops", 80, "operations per seed of the store torture run")
	storeTortureFor  = flag.Duration("store-torture.duration", 0, "run fresh seeds for this long (0: one seed)")
	storeTortureRace = flag.Bool("store-torture.race", false, "build the replicas' pisync with -race")
)

func TestStoreTorture(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("store torture: processes and SIGKILL")
	}
	bin := daemontest.Binary(t)
	if *storeTortureRace {
		bin = daemontest.RaceBinary(t)
	}
	if *storeTortureFor == 0 {
		seed := *storeTortureSeed
		if seed == 0 {
			seed = uint64(time.Now().UnixNano())
		}
		runStoreTorture(t, bin, seed, *storeTortureOps)
		return
	}
	deadline := time.Now().Add(*storeTortureFor)
	for n := 0; time.Now().Before(deadline); n++ {
		seed := uint64(time.Now().UnixNano())
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runStoreTorture(t, bin, seed, *storeTortureOps) })
		t.Logf("seed %d: ok=%v (%d seeds so far)", seed, ok, n+1)
	}
}

// tReplica is one `pisync serve` process.
type tReplica struct {
	name string
	proc *daemontest.Proc // nil while stopped
	logs *daemontest.Output
}

// storeTorture is one seed's run: the server, the replicas, the client and the model.
type storeTorture struct {
	t        *testing.T
	bin      string
	seed     uint64
	rng      *rand.Rand
	srv      *natstest.Server
	replicas []*tReplica
	client   *tClient
	model    *tModel
	kills    int
	restarts int
	exits    int // replicas that exited on their own and were started again
	ops      map[string]int
}

func runStoreTorture(t *testing.T, bin string, seed uint64, ops int) {
	rng := rand.New(rand.NewPCG(seed, 1))
	maxPayload := []int32{1 << 20, 1 << 20, 256 << 10}[rng.IntN(3)]
	srv := natstest.RunWith(t, func(o *server.Options) { o.MaxPayload = maxPayload })
	st := &storeTorture{t: t, bin: bin, seed: seed, rng: rng, srv: srv, model: newTModel(seed), ops: map[string]int{}}
	o, _ := mirror.NewOwner("t1", "alice")
	st.client = &tClient{nc: natstest.Connect(t, srv.URL()), names: mirror.DefaultNames(), owner: o, maxPayload: int(maxPayload), attempts: 12}
	n := 2 + rng.IntN(2)
	t.Logf("seed %d: %d replicas, max_payload %d, %d operations", seed, n, maxPayload, ops)
	defer func() {
		for _, r := range st.replicas {
			st.stop(r, syscall.SIGKILL)
		}
		if t.Failed() {
			for _, r := range st.replicas {
				path := filepath.Join(os.TempDir(), fmt.Sprintf("pisync-store-torture-%d-%s.log", seed, r.name))
				if err := os.WriteFile(path, []byte(r.logs.Tail(1<<30)), 0o644); err == nil {
					t.Logf("%s's log in %s; its end:\n%s", r.name, path, r.logs.Tail(2<<10))
				}
			}
			t.Logf("reproduce: go test ./cmd/pisync -run TestStoreTorture -args -store-torture.seed=%d -store-torture.ops=%d", seed, ops)
		}
	}()
	for i := 0; i < n; i++ {
		st.replicas = append(st.replicas, &tReplica{name: fmt.Sprintf("r%d", i), logs: &daemontest.Output{}})
		st.start(st.replicas[i])
	}
	st.waitReady()
	var pending sync.WaitGroup // a kill scheduled to land during the next operation
	for i := 0; i < ops && !t.Failed(); i++ {
		op := st.pick()
		st.ops[op]++
		switch op {
		case "kill":
			pending.Wait()
			r := st.replicas[st.rng.IntN(len(st.replicas))]
			delay := time.Duration(st.rng.IntN(150)) * time.Millisecond
			pending.Add(1)
			go func() { // lands while the next operation runs
				defer pending.Done()
				time.Sleep(delay) // the kill's moment within the next operation
				st.stop(r, syscall.SIGKILL)
				st.start(r)
			}()
			continue
		case "nats-restart":
			pending.Wait()
			st.srv.Restart()
		case "check":
			pending.Wait()
			st.waitReady()
			st.check()
		default:
			st.do(op)
		}
		pending.Wait()
	}
	pending.Wait()
	if !t.Failed() {
		st.waitReady()
		st.check()
	}
	t.Logf("seed %d: operations %v, %d kills, %d exits, %d conversations at the end", seed, st.ops, st.kills, st.exits, len(st.model.convs))
}

// weights of the operations.
var tortureOps = []struct {
	name   string
	weight int
}{
	{"create", 8}, {"append", 40}, {"fork", 8}, {"delete", 3}, {"open", 8}, {"list", 5},
	{"kill", 8}, {"nats-restart", 1}, {"check", 3},
}

func (st *storeTorture) pick() string {
	total := 0
	for _, o := range tortureOps {
		total += o.weight
	}
	n := st.rng.IntN(total)
	for _, o := range tortureOps {
		if n < o.weight {
			return o.name
		}
		n -= o.weight
	}
	return "check"
}

func (st *storeTorture) start(r *tReplica) {
	st.t.Helper()
	p, err := daemontest.Start(st.bin, []string{"serve", "--nats", st.srv.URL(), "--http-addr", "", "--host", r.name,
		"--log-level", "warn", "--log-format", "console", "--duplicate-window", "30s"}, nil, r.logs)
	if err != nil {
		st.t.Fatal(err)
	}
	r.proc = p
	st.restarts++
}

func (st *storeTorture) stop(r *tReplica, sig syscall.Signal) {
	if r.proc == nil {
		return
	}
	_ = r.proc.Signal(sig)
	<-r.proc.Exited()
	r.proc = nil
	if sig == syscall.SIGKILL {
		st.kills++
	}
}

// waitReady waits until every replica answers a micro PING (each instance replies, queue
// group or not) and the store answers a list.
func (st *storeTorture) waitReady() {
	st.t.Helper()
	waitFor(st.t, 60*time.Second, "every store replica to answer", func() (bool, string) {
		for _, r := range st.replicas {
			if r.proc != nil && !r.proc.Running() { // it gave up (a server not ready for it): restarted, as a supervisor does
				st.exits++
				st.start(r)
			}
		}
		got := 0
		sub, err := st.client.nc.SubscribeSync(st.client.nc.NewRespInbox())
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := st.client.nc.PublishRequest("$SRV.PING.pisync-store", sub.Subject, nil); err != nil {
			return false, err.Error()
		}
		for {
			if _, err := sub.NextMsg(300 * time.Millisecond); err != nil {
				break
			}
			got++
		}
		return got >= len(st.replicas), fmt.Sprintf("%d of %d replicas answered", got, len(st.replicas))
	})
	if _, err := st.client.list(); err != nil { // JetStream itself answers too
		st.t.Fatalf("list after the replicas came up: %v", err)
	}
}

// logsClean fails on a panic or a data race in a replica's log.
func (st *storeTorture) logsClean() {
	for _, r := range st.replicas {
		l := r.logs.Tail(1 << 30)
		for _, bad := range []string{"panic:", "DATA RACE", "fatal error:"} {
			if strings.Contains(l, bad) {
				st.t.Errorf("%s's log has %q", r.name, bad)
			}
		}
	}
}
