package recovery

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// countingMirror counts how the recovery reads a real mirror.
type countingMirror struct {
	Mirror
	scans, ownerScans atomic.Int32
}

func (c *countingMirror) Scan(ctx context.Context, conv mirror.Conv, opts mirror.ScanOptions, fn func(mirror.Msg) error) error {
	c.scans.Add(1)
	return c.Mirror.Scan(ctx, conv, opts, fn)
}

func (c *countingMirror) ScanOwner(ctx context.Context, opts mirror.ScanOptions, fn func(string, mirror.Msg) error) error {
	c.ownerScans.Add(1)
	return c.Mirror.ScanOwner(ctx, opts, fn)
}

// TestRunStreamed: recovering most of an owner's conversations reads them in one pass
// over the owner's messages, interleaved in the stream as live sessions leave them, and
// gives exactly what recovering each on its own gives: same files, same reports, gaps,
// blobs, raw lines and generations included. With a budget too small for any
// conversation, every one is dropped from the pass and read on its own, with the same
// result. Another owner's conversations in the same stream are not touched.
func TestRunStreamed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		budget     int64
		generation int
		wantScans  int32 // conversation scans by Run: none when the pass holds everything
		written    int
	}{
		{"in one pass", streamBudget, 0, 0, 8},
		{"generation 1 in one pass", streamBudget, 1, 0, 8},
		{"generation 2 in one pass", streamBudget, 2, 0, 1}, // the others have none: not found
		{"over budget", 1, 0, -1, 8},                        // -1: one per conversation
	} {
		t.Run(tc.name, func(t *testing.T) {
			saved := streamBudget
			streamBudget = tc.budget
			t.Cleanup(func() { streamBudget = saved })

			srv := natstest.Run(t)
			tm := mirrortest.For(t, srv.URL(), "t1", "alice")
			other := mirrortest.For(t, srv.URL(), "t1", "bob")
			ctx := mirrortest.Ctx(t)
			type conv struct {
				m    mirrortest.Mirrored
				msgs []mirror.Msg
				head mirror.Head
			}
			var convs []conv
			add := func(path string, gen int, drop ...int64) {
				lines := mirrortest.ReadLines(t, path)
				m := mirrortest.MirrorFile(t, lines, gen, 400)
				head := mirrortest.DaemonHead(lines, m, gen)
				convs = append(convs, conv{m, mirrortest.Without(m.Msgs, drop), head})
			}
			golden := filepath.Join("testdata", "golden")
			add(filepath.Join(golden, "complete", "input.jsonl"), 1)
			add(filepath.Join(golden, "missing_middle", "input.jsonl"), 1, 3)
			add(filepath.Join(golden, "blob", "input.jsonl"), 1)
			add(filepath.Join(golden, "raw_lines", "input.jsonl"), 1)
			add(filepath.Join(golden, "v1", "input.jsonl"), 1, 2)
			add(filepath.Join(golden, "two_children_missing_parent", "input.jsonl"), 1, 2)
			add(filepath.Join(golden, "generations", "input-gen1.jsonl"), 1)
			add(filepath.Join(golden, "generations", "input.jsonl"), 2)
			add(filepath.Join(golden, "missing_header", "input.jsonl"), 1, 0)

			// Interleave: one line of each conversation in turn, as concurrent sessions do.
			for n := 0; ; n++ {
				any := false
				for _, c := range convs {
					if n < len(c.msgs) {
						any = true
						tm.Publish(t, c.m, c.msgs[n:n+1], nil)
						if n == 0 {
							other.Publish(t, c.m, c.msgs[:1], nil)
						}
					}
				}
				if !any {
					break
				}
			}
			// The first conversation has no head (its daemon was killed before writing
			// it): --all finds it by its messages.
			for _, c := range convs[1:] {
				head := c.head
				tm.Publish(t, c.m, nil, &head)
			}

			sel, err := Select(ctx, tm.Reader, nil, true)
			if err != nil {
				t.Fatal(err)
			}
			keys := sel.Keys
			if len(keys) != 8 {
				t.Fatalf("%d conversations, want 8", len(keys))
			}
			cm := &countingMirror{Mirror: tm.Reader}
			outRun, outOne := t.TempDir(), t.TempDir()
			var done atomic.Int32
			reps := New(cm, Options{Out: outRun, Parallel: 2, Generation: tc.generation,
				OnDone: func(Report) { done.Add(1) }}).Run(ctx, sel)
			if got := cm.ownerScans.Load(); got != 1 {
				t.Errorf("%d passes over the owner's messages, want 1", got)
			}
			wantScans := tc.wantScans
			if wantScans < 0 {
				wantScans = int32(len(keys))
			}
			if got := cm.scans.Load(); got != wantScans {
				t.Errorf("%d conversations read on their own, want %d", got, wantScans)
			}
			if int(done.Load()) != len(keys) {
				t.Errorf("OnDone called %d times, want %d", done.Load(), len(keys))
			}

			one := New(tm.Reader, Options{Out: outOne, Generation: tc.generation})
			written := 0
			for i, key := range keys {
				want := one.One(ctx, key)
				got := reps[i]
				if a, b := reportJSON(t, got, outRun), reportJSON(t, want, outOne); !bytes.Equal(a, b) {
					t.Errorf("%s: streamed report\n%s\nwant\n%s", key, a, b)
					continue
				}
				if want.Result != Written {
					continue
				}
				written++
				rel, err := filepath.Rel(outOne, want.Output)
				if err != nil {
					t.Fatal(err)
				}
				a, err := os.ReadFile(filepath.Join(outRun, rel))
				if err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(want.Output)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(a, b) {
					t.Errorf("%s: the streamed file differs from the one recovered on its own", key)
				}
			}
			if written != tc.written {
				t.Errorf("%d conversations written, want %d", written, tc.written)
			}
		})
	}
}
