package recovery

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/mirror"
)

// TestRecoverTwoHeadsOneFile: two conversation keys whose heads name one file (one file
// mirrored under a clash key, then under the plain id: torture T3) are recovered the same
// way whatever the order they are read in: the newest head wins and is written, the
// other is refused and names the winner. Before, the first key read claimed the path;
// the keys are read in the order of their heads' last stream sequence, so the stale key
// always came first and the file as it is now was refused.
func TestRecoverTwoHeadsOneFile(t *testing.T) {
	lines := mirrortest.ReadLines(t, filepath.Join("testdata", "golden", "complete", "input.jsonl"))
	older, newer := lines[:len(lines)-2], lines
	cases := []struct {
		name        string
		olderKey    string // mirrored first: its head's last line is older
		newerKey    string
		newerGone   bool // the newer head says the file was deleted locally
		newerCopy   bool // the newer head is a copy mirrored apart (diverged_from the older key)
		olderRoot   bool // the older head names the file in another root (it moved)
		both        bool // two paths: both written
		olderNoHead bool // the older key has messages but no head
		wantWritten string
		out         bool // --out rather than --root
		parallel    int
	}{
		{name: "clash key stale, plain key newer", olderKey: "~0a1b2c3d", newerKey: "", wantWritten: "new", parallel: 1},
		{name: "plain key stale, clash key newer", olderKey: "", newerKey: "~0a1b2c3d", wantWritten: "new", parallel: 1},
		{name: "in parallel, under --out", olderKey: "~0a1b2c3d", newerKey: "", wantWritten: "new", out: true, parallel: 4},
		{name: "moved across roots, under --out", olderKey: "~0a1b2c3d", newerKey: "~4e5f6a7b", olderRoot: true, wantWritten: "new", out: true, parallel: 1},
		{name: "moved across roots, under --root: two paths", olderKey: "~0a1b2c3d", newerKey: "~4e5f6a7b", olderRoot: true, both: true, parallel: 1},
		{name: "the stale key has no head", olderKey: "~0a1b2c3d", newerKey: "", olderNoHead: true, wantWritten: "new", out: true, parallel: 1},
		{name: "a deleted file's head loses to a live one", olderKey: "", newerKey: "~0a1b2c3d", newerGone: true, wantWritten: "old", parallel: 2},
		{name: "a copy mirrored apart loses to the key it diverged from", olderKey: "", newerKey: "~0a1b2c3d", newerCopy: true, wantWritten: "old", parallel: 1},
		{name: "a copy mirrored apart loses under --out too", olderKey: "", newerKey: "~0a1b2c3d", newerCopy: true, wantWritten: "old", out: true, parallel: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tm := newTestMirror(t)
			ctx := mirrortest.Ctx(t)
			root := filepath.Join(t.TempDir(), "sessions")
			other := filepath.Join(filepath.Dir(root), "other")
			var seq uint64
			publish := func(ls [][]byte, suffix string, gone, otherRoot, noHead, copied bool) string {
				m := mirrortest.MirrorFile(t, ls, 1, 0)
				head := mirrortest.DaemonHead(ls, m, 1)
				if copied {
					head.DivergedFrom = &mirror.Divergence{Key: m.Conv, Generation: 1, Ordinal: int64(len(older)), Host: "laptop"}
				}
				m.Conv += suffix
				seq += uint64(len(ls))
				head.Key, head.Root, head.LastSeq, head.LocalDeleted = m.Conv, root, seq, gone
				if otherRoot {
					head.Root = other
				}
				if noHead {
					tm.Publish(t, m, m.Msgs, nil)
				} else {
					tm.Publish(t, m, m.Msgs, &head)
				}
				return m.Conv
			}
			oldKey := publish(older, tc.olderKey, false, tc.olderRoot, tc.olderNoHead, false)
			newKey := publish(newer, tc.newerKey, tc.newerGone, false, false, tc.newerCopy)
			winner, loser, content := newKey, oldKey, newer
			if tc.wantWritten == "old" {
				winner, loser, content = oldKey, newKey, older
			}

			sel, err := Select(ctx, tm.Reader, nil, true)
			if err != nil {
				t.Fatal(err)
			}
			opts := Options{Roots: []string{root, other}, Parallel: tc.parallel}
			if tc.out {
				opts = Options{Out: t.TempDir(), Parallel: tc.parallel}
			}
			byKey := map[string]Report{}
			for _, r := range New(tm.Reader, opts).Run(ctx, sel) {
				byKey[r.Key] = r
			}
			w, l := byKey[winner], byKey[loser]
			if tc.both {
				for _, r := range []Report{w, l} {
					if r.Result != Written {
						t.Errorf("%s: %s (%s), want written", r.Key, r.Result, r.Reason)
					}
				}
				return
			}
			if w.Result != Written {
				t.Fatalf("%s (the newest head): %s (%s), want written", winner, w.Result, w.Reason)
			}
			if got, _ := os.ReadFile(w.Output); !bytes.Equal(got, mirrortest.JoinLines(content)) {
				t.Errorf("%s: the file written is not the newest head's conversation", w.Output)
			}
			if tc.olderNoHead {
				if l.Result != Refused || !strings.Contains(l.Reason, winner) {
					t.Errorf("%s (no head): %s (%s), want refused, naming %s", loser, l.Result, l.Reason, winner)
				}
				return
			}
			if l.Result != Refused || !strings.Contains(l.Reason, "superseded") || !strings.Contains(l.Reason, winner) {
				t.Errorf("%s (the stale head): %s (%s), want refused, superseded by %s", loser, l.Result, l.Reason, winner)
			}

			if clashOf(loser) == "" {
				return
			}
			// Alone (the report says how), a stale clash key is rebuilt: nothing else of
			// the run names its file.
			if !strings.Contains(l.Reason, "--conversation "+loser) {
				t.Errorf("the refusal does not say how to rebuild %s alone: %s", loser, l.Reason)
			}
			sel, err = Select(ctx, tm.Reader, []string{loser}, false)
			if err != nil || len(sel.Keys) != 1 {
				t.Fatalf("select %s alone: %v (%v)", loser, sel.Keys, err)
			}
			if alone := New(tm.Reader, Options{Out: t.TempDir()}).Run(ctx, sel); alone[0].Result != Written {
				t.Errorf("%s alone: %s (%s), want written", loser, alone[0].Result, alone[0].Reason)
			}
		})
	}
}
