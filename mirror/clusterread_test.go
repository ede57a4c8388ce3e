package mirror_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// laggingCluster is an R3 mirror on a 3-node cluster whose reads can be answered by a
// replica that is behind its leader: a follower is stopped while lines are stored and
// started again just before the read.
type laggingCluster struct {
	t       *testing.T
	cluster *natstest.Cluster
	js      jetstream.JetStream
	names   mirror.Names
	owner   mirror.Owner
	reader  *mirror.Reader
}

func newLaggingCluster(t *testing.T) *laggingCluster {
	t.Helper()
	c := natstest.RunCluster(t, 3)
	js, err := jetstream.New(natstest.Connect(t, c.URLs()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := mirrortest.Ctx(t)
	names := mirror.DefaultNames()
	mirrortest.Provision(t, ctx, js, names, mirror.Config{Replicas: 3})
	owner, err := mirror.NewOwner("t1", "alice")
	if err != nil {
		t.Fatal(err)
	}
	r, err := mirror.NewReader(ctx, js, names, owner)
	if err != nil {
		t.Fatal(err)
	}
	return &laggingCluster{t: t, cluster: c, js: js, names: names, owner: owner, reader: r}
}

// storeWhileFollowerDown stops a follower of the stream, stores a session of n entries
// as conversation key (every line acknowledged by the leader and one other replica),
// and starts the follower again: it rejoins behind the leader.
func (lc *laggingCluster) storeWhileFollowerDown(key string, n int, seed uint64) (m mirrortest.Mirrored, last uint64) {
	t := lc.t
	t.Helper()
	ctx := mirrortest.Ctx(t)
	follower := lc.cluster.StreamFollower(lc.names.Stream(), 30*time.Second)
	follower.Stop()

	f := sessiontest.New(rand.New(rand.NewPCG(seed, seed)), t.TempDir(), "/work/p", sessiontest.CLIV3)
	lines := [][]byte{f.HeaderLine("/work/p")}
	for range n {
		lines = append(lines, f.Entry(300))
	}
	m = mirrortest.MirrorFile(t, lines, 1, 0)
	seen := map[string]bool{}
	for i := range m.Msgs {
		if l := &m.Msgs[i].Line; seen[l.EntryID] {
			l.EntryID = mirror.OrdinalID(l.Ordinal) // a repeated id keeps its line (DESIGN §3.1)
		} else {
			seen[l.EntryID] = true
		}
	}
	conv, err := mirror.NewConv(lc.owner, key)
	if err != nil {
		t.Fatal(err)
	}
	var acks []jetstream.PubAckFuture
	for _, msg := range m.Msgs {
		ack, err := lc.js.PublishMsgAsync(lc.names.NewMsg(conv, msg.Line, msg.Data))
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, ack)
	}
	for i, ack := range acks {
		select {
		case a := <-ack.Ok():
			last = max(last, a.Sequence)
		case err := <-ack.Err():
			if !inProcess(err) {
				t.Fatalf("line %d: %v", i, err)
			}
			// "Possibly stored" (DESIGN §3.2): send it again with its message id.
			for {
				a, err := lc.js.PublishMsg(ctx, lc.names.NewMsg(conv, m.Msgs[i].Line, m.Msgs[i].Data))
				if err == nil {
					last = max(last, a.Sequence)
					break
				}
				if !inProcess(err) {
					t.Fatalf("line %d: %v", i, err)
				}
			}
		case <-ctx.Done():
			t.Fatalf("line %d not acknowledged", i)
		}
	}
	follower.Start()
	return m, last
}

// inProcess tells the server's "duplicate message id is in process": a client that
// reconnected from the stopped node sent a line again while its first copy was proposed.
func inProcess(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == 10158
}

// TestScanReadsWhatTheLeaderAcknowledged: on an R3 stream a read right after a replica
// came back must still see every line the leader acknowledged. Direct gets and R1
// consumers may be answered by any replica, also one still catching up (torture T9's
// cluster form, T10): a resume would resend the lines it missed, recover would rebuild a
// short file.
func TestScanReadsWhatTheLeaderAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	lc := newLaggingCluster(t)
	const n = 3000
	for round := range 3 {
		key := fmt.Sprintf("c%d", round)
		m, last := lc.storeWhileFollowerDown(key, n, uint64(round))
		conv, err := lc.reader.Conv(key)
		if err != nil {
			t.Fatal(err)
		}
		// Read again and again while the replica catches up: every read must see
		// every line, whichever replica answers it.
		for scan, until := 0, time.Now().Add(3*time.Second); time.Now().Before(until); scan++ {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			read := 0
			err = lc.reader.Scan(ctx, conv, mirror.ScanOptions{HeadersOnly: true}, func(mirror.Msg) error {
				read++
				return nil
			})
			cancel()
			if err != nil {
				t.Fatalf("round %d, scan %d: %v", round, scan, err)
			}
			if read != len(m.Msgs) {
				t.Fatalf("round %d, scan %d: read %d of the %d acknowledged lines", round, scan, read, len(m.Msgs))
			}
			// A message the caller knows is there (a duplicate acknowledgement names it).
			ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
			_, err = lc.reader.LineAt(ctx, conv, last)
			cancel()
			if err != nil {
				t.Fatalf("round %d, scan %d: the line at sequence %d: %v", round, scan, last, err)
			}
		}
	}
}

// TestBlobPutAcrossLeaderChange is torture T21 on a cluster (seed 514479021970: a node
// stopped during the upload of a 190 KB line): the object stream's leader steps down as
// a blob's first chunk is published, so the chunks are answered "no responders" until a
// new leader is elected. nats.go's object store Put published such a chunk again with
// the last chunk's bytes and reported success; every read of the object failed, "digests
// do not match" (6 puts of 6 before the fix). A put may fail (the daemon puts again), but
// what it reports stored must read back.
func TestBlobPutAcrossLeaderChange(t *testing.T) {
	lc := newLaggingCluster(t)
	ctx := mirrortest.Ctx(t)
	w, err := mirror.NewWriter(ctx, lc.js, lc.names, lc.owner)
	if err != nil {
		t.Fatal(err)
	}
	stepDown := "$JS.API.STREAM.LEADER.STEPDOWN.OBJ_" + lc.names.BlobsBucket()
	for i := range 3 {
		line, sha := blobLine(i)
		r := &hookReader{r: bytes.NewReader(line), before: map[int]func() error{0: func() error {
			_, err := lc.js.Conn().RequestWithContext(ctx, stepDown, nil)
			return err
		}}}
		putBlobAsTheDaemon(t, w, sha, line, r, nil)
		// A replica serving the read may still be behind the new leader: a right
		// object reads back within the deadline, a wrong one never does.
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := readBlob(ctx, lc.reader, sha)
			if err == nil && bytes.Equal(got, line) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("put %d: read back %d bytes, %v; want the line's %d", i, len(got), err, len(line))
			}
			time.Sleep(50 * time.Millisecond) // poll interval
		}
	}
}

// TestBlobReadsWhatTheLeaderAcknowledged: a blob the leader acknowledged must read back
// whole right after a replica came back. nats.go's object store Get reads the object's
// record by a direct get and its chunks through an ordered consumer, either of which a
// replica still catching up may serve: the read found no record ("not found"), or ended
// at the replica's last chunk ("digests do not match"), and recover of the line failed
// until the replica caught up (torture T21, what it left).
func TestBlobReadsWhatTheLeaderAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node cluster")
	}
	lc := newLaggingCluster(t)
	ctx := mirrortest.Ctx(t)
	w, err := mirror.NewWriter(ctx, lc.js, lc.names, lc.owner)
	if err != nil {
		t.Fatal(err)
	}
	const blobs = 16 // 3 MB: the replica that comes back takes a moment to catch up
	for round := range 5 {
		follower := lc.cluster.StreamFollower("OBJ_"+lc.names.BlobsBucket(), 30*time.Second)
		follower.Stop()
		lines := make([][]byte, blobs)
		shas := make([]string, blobs)
		for i := range blobs {
			lines[i], shas[i] = distinctBlobLine(round*blobs + i)
			putBlobRetrying(t, w, shas[i], lines[i])
		}
		follower.Start()
		// Read again and again while the replica catches up: every read must return
		// every blob whole, whichever replica answers it.
		for pass, until := 0, time.Now().Add(3*time.Second); time.Now().Before(until); pass++ {
			for i := range blobs {
				rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				got, err := readBlob(rctx, lc.reader, shas[i])
				cancel()
				if err != nil || !bytes.Equal(got, lines[i]) {
					t.Fatalf("round %d, pass %d, blob %d: read %d bytes, %v; want the line's %d", round, pass, i, len(got), err, len(lines[i]))
				}
			}
		}
	}
}

// distinctBlobLine is blobLine with i written at its start: one line per i, however many.
func distinctBlobLine(i int) ([]byte, string) {
	line, _ := blobLine(i)
	copy(line, fmt.Sprintf("%08d", i))
	sum := sha256.Sum256(line)
	return line, hex.EncodeToString(sum[:])
}

// putBlobRetrying puts line until a put succeeds, as the daemon does: a request sent as
// the follower stops may go to it and never be answered (a put's existence check).
func putBlobRetrying(t *testing.T, w *mirror.Writer, sha string, line []byte) {
	t.Helper()
	ctx := mirrortest.Ctx(t)
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := w.PutBlob(pctx, sha, bytes.NewReader(line))
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("put %s: %v", sha, err)
		}
		t.Logf("put %s: %v; again", sha, err)
	}
}
