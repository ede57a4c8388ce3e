package publisher

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

var resumeLines = flag.Int64("resume-lines", 1_000_000, "lines of the file TestResumeWithoutStateMemoryBounded resumes")

// TestResumeWithoutStateMemoryBounded (issue 13 item 9): a big session file, mirrored
// (a few lines stored out of order, as resends after a timeout leave them), is resumed
// by a daemon that lost its state directory. It compares the file with the mirror and
// goes on mirroring the file without publishing any line again, in the same generation,
// and its live heap stays within a bound that does not depend on the number of lines.
// Before, it held a digest per line of the generation: 102 MB more for 200,000 lines.
//
// The daemon's heap is this process's (the server runs in it too), measured as the live
// heap after each collection. A million lines take a minute or two; under the race
// detector (twenty times slower) TestResumeWindowBounded checks the same bound on what
// the window holds, at a size it can afford.
func TestResumeWithoutStateMemoryBounded(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("a million lines: run without -short and without -race (-resume-lines sets the size)")
	}
	r := resumeBig(t, *resumeLines, true)
	grown := int64(r.peak) - int64(r.base)
	t.Logf("resumed %d lines (%d MB) without a state directory in %s: live heap at most %d MB above the %d MB before",
		r.lines, r.size>>20, r.took.Round(time.Millisecond), grown>>20, r.base>>20)
	// What does not depend on the line count: the window (at most heldLimit lines kept
	// by the first pass, then those between the one read and fillAhead plus the disorder
	// past it), a scan's batch, the watcher's buffers, and the server's block buffers
	// (about 25 MB of them).
	const bound = 48 << 20
	if grown > bound {
		t.Fatalf("live heap grew by %d MB resuming %d lines, more than %d MB", grown>>20, r.lines, bound>>20)
	}
}

// TestResumeWindowBounded resumes a mirrored file without its state directory with small
// window sizes, so that the generation is read again through many windows: nothing is
// published again, and the window never holds more lines than its bound, whatever the
// number of lines.
func TestResumeWindowBounded(t *testing.T) {
	defer func(limit int, ahead int64) { heldLimitMin, fillAhead = limit, ahead }(heldLimitMin, fillAhead)
	heldLimitMin, fillAhead = 100, 50
	r := resumeBig(t, 6000, false)
	// heldLimit is 2×WindowMessages at least; the window holds what it is filled with:
	// fillAhead and the disorder past the line asked for, one more read beyond.
	bound := int64(fillAhead) + r.held.disorder + 2
	t.Logf("resumed %d lines in %s: %d scans, at most %d lines held (disorder %d)",
		r.lines, r.took.Round(time.Millisecond), r.held.fills, r.held.peak, r.held.disorder)
	if r.held.complete || r.held.fills < 10 || int64(r.held.peak) > bound {
		t.Fatalf("window complete %v, %d scans, %d lines held at most; want read again in many scans, at most %d held",
			r.held.complete, r.held.fills, r.held.peak, bound)
	}
}

// resumed is what resumeBig measured.
type resumed struct {
	lines, size int64
	took        time.Duration
	base, peak  uint64 // live heap before the resume and at most during it
	held        heldWindow
}

// resumeBig writes a session file of n short lines, stores it in the mirror as
// generation 1 (every 500th line 30 lines late), and resumes it with a daemon whose state
// directory is empty, until the head says every line is mirrored. It checks that no line
// was published again and that the generation is kept.
func resumeBig(t *testing.T, n int64, sample bool) resumed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	root := t.TempDir()
	f := sessiontest.New(rand.New(rand.NewPCG(9, 13)), root, "/home/dev/p", sessiontest.CLIV3)
	if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(root, f.Path)
	if err != nil {
		t.Fatal(err)
	}
	opts := testOptions(t, ctx, srv.URL())
	conv, err := mirror.NewConv(opts.Owner, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Without message ids: the server's duplicate window would hold a million of them in
	// this process's heap while the test measures it.
	seed := func(l mirror.Line) {
		msg := opts.Names.NewMsg(conv, l, nil)
		msg.Header.Del(mirror.HdrMsgID)
		for {
			_, err := opts.JS.PublishMsgAsync(msg)
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			select {
			case <-opts.JS.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("seeding the mirror timed out")
			}
		}
	}
	start := time.Now()
	out, err := os.Create(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	bw := bufio.NewWriterSize(out, 1<<20)
	var late []mirror.Line
	var size int64
	for o := range n {
		line := f.HeaderLine("/home/dev/p")
		kind := mirror.KindHeader
		if o > 0 {
			line, kind = shortEntry(o), mirror.KindEntry
		}
		size += int64(len(line)) + 1
		bw.Write(line)
		bw.WriteByte('\n')
		sum := sha256.Sum256(line)
		l := mirror.Line{Kind: kind, EntryID: mirror.OrdinalID(o), Ordinal: o, Generation: 1,
			SHA256: hex.EncodeToString(sum[:]), Format: "v3", Host: "h1", Source: rel}
		if o%500 == 17 {
			late = append(late, l)
		} else {
			seed(l)
		}
		if len(late) > 0 && o-late[0].Ordinal >= 30 {
			seed(late[0])
			late = late[1:]
		}
	}
	for _, l := range late {
		seed(l)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-opts.JS.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("seeding the mirror timed out")
	}
	r, err := mirror.NewReader(ctx, opts.JS, opts.Names, opts.Owner)
	if err != nil {
		t.Fatal(err)
	}
	lastSeq, err := r.LastSeq(ctx, conv)
	if err != nil || lastSeq != uint64(n) {
		t.Fatalf("mirror holds %d messages (%v), want %d", lastSeq, err, n)
	}
	t.Logf("file of %d lines, %d bytes, mirrored in %s", n, size, time.Since(start).Round(time.Millisecond))

	// The live heap as of the last collection: what is retained, not the garbage the
	// collector lets accumulate up to GOGC between collections.
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	heap := func() uint64 {
		metrics.Read(live)
		return live[0].Value.Uint64()
	}
	res := resumed{lines: n, size: size}
	var peak uint64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	var once sync.Once
	endSampling := func() {
		once.Do(func() {
			close(stopSampling)
			<-sampled
		})
	}
	if sample {
		runtime.GC()
		res.base = heap()
		go func() {
			defer close(sampled)
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stopSampling:
					return
				case <-tick.C:
					peak = max(peak, heap())
				}
			}
		}()
	} else {
		close(sampled)
	}
	defer endSampling()

	start = time.Now()
	store := openStore(t, t.TempDir())
	defer store.Close()
	p := startPublisher(t, ctx, srv.URL(), store)
	defer p.Close(context.Background())
	stop, _ := startWatcher(t, ctx, p, root)
	defer stop()
	deadline := time.Now().Add(8 * time.Minute)
	for {
		h, _, err := r.Head(ctx, conv)
		if err == nil && h.LastOrdinal == n-1 {
			if h.Generation != 1 {
				t.Fatalf("resumed into generation %d, want 1", h.Generation)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the file not resumed to its last line in 8 minutes (head %+v, %v)", h, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	endSampling()
	res.took, res.peak = time.Since(start), peak
	if last, err := r.LastSeq(ctx, conv); err != nil || last != lastSeq {
		t.Fatalf("subject at sequence %d (%v); want no line published again (sequence %d)", last, err, lastSeq)
	}
	if got := testutil.ToFloat64(p.m.heldBack); got != float64(n) {
		t.Fatalf("%v lines found already mirrored, want %d", got, n)
	}
	p.mu.Lock()
	st := p.files[inode(t, f.Path)]
	p.mu.Unlock()
	if st == nil || st.held == nil {
		t.Fatal("the file has no window of what the mirror held")
	}
	st.mu.Lock()
	res.held = *st.held
	st.mu.Unlock()
	return res
}

// shortEntry is a short v3 message entry.
func shortEntry(o int64) []byte {
	var b []byte
	b = append(b, `{"type":"message","id":"`...)
	b = hex.AppendEncode(b, []byte{byte(o >> 24), byte(o >> 16), byte(o >> 8), byte(o)})
	b = append(b, `","parentId":null,"timestamp":"2026-11-01T09:00:00.000Z","message":{"role":"user","content":"hi"}}`...)
	return b
}
