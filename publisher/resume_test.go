package publisher

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
)

// TestResumeHoldsOneGeneration pins issue 13 item 9: resuming a file without its state
// directory read the conversation's whole subject and kept every ordinal's digest of
// every generation. The first pass now keeps the newest generation's lines only while
// they are few (heldLimit), and otherwise a handful of numbers: memory does not grow
// with the lines of any generation, also when a late resend of an older one lands after
// a newer one started.
func TestResumeHoldsOneGeneration(t *testing.T) {
	const gens, lines, limit = 8, 20000, 1000
	msg := func(g int, o int64, seq uint64) mirror.Msg {
		return mirror.Msg{Line: mirror.Line{Generation: g, Ordinal: o,
			SHA256: fmt.Sprintf("%064x", uint64(g)<<32|uint64(o))}, Seq: seq}
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	base := heap()
	nw := newest{limit: limit}
	seq := uint64(0)
	for g := 1; g <= gens; g++ {
		for o := int64(0); o < lines; o++ {
			seq++
			_ = nw.add(msg(g, o, seq))
			if o%1000 == 0 && g > 1 {
				seq++
				_ = nw.add(msg(g-1, o, seq)) // a late resend of the generation before
			}
			if len(nw.lines) > limit {
				t.Fatalf("generation %d: %d digests held, more than the limit %d", g, len(nw.lines), limit)
			}
		}
	}
	if nw.gen != gens || nw.genMsgs != lines || nw.top != lines-1 || nw.disorder != 0 || !nw.spilled {
		t.Fatalf("newest generation %d with %d messages, top %d, disorder %d, spilled %v; want %d with %d, top %d, 0, true",
			nw.gen, nw.genMsgs, nw.top, nw.disorder, nw.spilled, gens, lines, lines-1)
	}
	grown := int64(heap()) - int64(base)
	t.Logf("first pass over %d generations of %d lines: %d bytes kept", gens, lines, grown)
	if grown > 64<<10 {
		t.Fatalf("%d bytes kept after a pass over %d lines", grown, gens*lines)
	}
	runtime.KeepAlive(&nw)

	// A short generation is kept whole, with the first copy of each line.
	nw = newest{limit: limit}
	for o := int64(0); o < 10; o++ {
		_ = nw.add(msg(1, o, uint64(o+1)))
	}
	_ = nw.add(mirror.Msg{Line: mirror.Line{Generation: 1, Ordinal: 7, SHA256: msg(9, 9, 0).SHA256}, Seq: 11})
	w := nw.window(mirror.Conv{}, 1<<16)
	if !w.complete || len(w.lines) != 10 || w.lines[7].sha != digestOf(msg(1, 7, 0).SHA256) || w.lines[7].seq != 8 {
		t.Fatalf("short generation: complete %v, %d lines, ordinal 7 %+v", w.complete, len(w.lines), w.lines[7])
	}
}

// streamOf is a generation's messages in stream order, from ordinals: o stands for
// ordinal o of generation 2; a negative -o-1 for a late resend of ordinal o of
// generation 1; 100+o for a second copy of o with other bytes.
func streamOf(ords ...int64) []mirror.Msg {
	var ms []mirror.Msg
	for i, o := range ords {
		g, sha := 2, lineSHA(o)
		switch {
		case o < 0:
			o, g, sha = -o-1, 1, lineSHA(1000+(-o-1))
		case o >= 100:
			o, sha = o-100, lineSHA(2000+o)
		}
		ms = append(ms, mirror.Msg{Line: mirror.Line{Kind: mirror.KindRaw, EntryID: fmt.Sprintf("L%d.%d", o, i),
			Generation: g, Ordinal: o, SHA256: sha}, Seq: uint64(i + 1)})
	}
	return ms
}

// lineOf is the line a test file holds at ordinal o; lineSHA its digest.
func lineOf(o int64) []byte { return fmt.Appendf(nil, `{"type":"message","n":%d}`, o) }

func lineSHA(o int64) string {
	s := sha256.Sum256(lineOf(o))
	return hex.EncodeToString(s[:])
}

// TestHeldWindowOrder feeds a window a generation's messages in stream order, one at a
// time until each ordinal is decided: every ordinal comes out with the first copy the
// mirror stored, and the window holds no more lines than its disorder allows.
func TestHeldWindowOrder(t *testing.T) {
	cases := []struct {
		name string
		ords []int64
	}{
		{"in order", []int64{0, 1, 2, 3, 4, 5, 6, 7}},
		{"resends out of order", []int64{0, 1, 3, 4, 2, 5, 7, 8, 9, 6, 10}},
		{"late resend of an older generation", []int64{0, 1, -1, 2, -3, 3, 4}},
		{"second copies", []int64{0, 1, 2, 102, 3, 101, 4}},
		{"gaps", []int64{0, 1, 4, 5, 9}},
		{"far resend", []int64{1, 2, 3, 4, 5, 6, 7, 8, 0, 9}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ms := streamOf(tc.ords...)
			nw := newest{limit: 1}
			for _, m := range ms {
				_ = nw.add(m)
			}
			if nw.gen != 2 || !nw.spilled {
				t.Fatalf("generation %d, spilled %v", nw.gen, nw.spilled)
			}
			w := nw.window(mirror.Conv{}, 1<<16)
			first := map[int64]mirror.Msg{}
			for _, m := range ms {
				if _, ok := first[m.Ordinal]; !ok && m.Generation == 2 {
					first[m.Ordinal] = m
				}
			}
			i := 0
			for o := int64(0); o <= nw.top+1; o++ {
				for !w.decided(o) {
					w.push(ms[i])
					i++
					if int64(len(w.lines)) > w.disorder+2 {
						t.Fatalf("ordinal %d: %d lines held with disorder %d", o, len(w.lines), w.disorder)
					}
				}
				h, ok := w.take(o)
				m, want := first[o]
				if ok != want || ok && (h.seq != m.Seq || !h.holds(m.SHA256)) {
					t.Fatalf("ordinal %d: held %v %+v, want %v at seq %d", o, ok, h, want, m.Seq)
				}
			}
			if w.lines != nil {
				t.Fatalf("%d lines left after the last ordinal", len(w.lines))
			}
		})
	}
}

// TestCompareWithMirror compares files with generations stored in various orders, with
// the lines kept whole by the first pass and read again through a window one ordinal
// ahead (many scans), against a real server.
func TestCompareWithMirror(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := natstest.Run(t)
	opts := testOptions(t, ctx, srv.URL())
	opts.Checkpoints = openStore(t, t.TempDir())
	p, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	lines := func(n int64, change ...int64) []byte {
		var b []byte
		for o := range n {
			l := lineOf(o)
			for _, c := range change {
				if c == o {
					l = lineOf(5000 + o)
				}
			}
			b = append(append(b, l...), '\n')
		}
		return b
	}
	ten := []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	holed := []int64{0, 1, 2, 3, 4, 6, 7, 8, 9} // ordinal 5 left out (too long, or refused)
	const none = -1
	cases := []struct {
		name  string
		ords  []int64
		file  []byte
		limit int64 // maxDisorder
		want  comparison
		at    int64  // where it differs or ends (none: not asked)
		host  string // of the mirrored lines ("": this host)
	}{
		{"same length", ten, lines(10), 1 << 16, sameLength, none, ""},
		{"same length, torn tail", ten, append(lines(10), `{"ty`...), 1 << 16, sameLength, none, ""},
		{"longer", ten, lines(12), 1 << 16, longer, none, ""},
		{"shorter", ten, lines(7), 1 << 16, shorter, 7, ""},
		{"empty file", ten, nil, 1 << 16, shorter, 0, ""},
		{"differs", ten, lines(10, 5), 1 << 16, differs, 5, ""},
		{"differs at the last line", ten, lines(10, 9), 1 << 16, differs, 9, ""},
		{"resends within the window", []int64{0, 1, 3, 4, 2, 5, 6, 8, 9, 7}, lines(10), 2, sameLength, none, ""},
		{"resends within the window, differs", []int64{0, 1, 3, 4, 2, 5, 6, 8, 9, 7}, lines(10, 7), 2, differs, 7, ""},
		{"late resends of an older generation", []int64{0, 1, -1, 2, 3, -4, 4, 5, 6, 7, 8, 9}, lines(10), 1 << 16, sameLength, none, ""},
		{"second copies: the first counts", []int64{0, 1, 2, 3, 103, 4, 5, 6, 7, 8, 9, 105}, lines(10), 1 << 16, sameLength, none, ""},
		{"reordered beyond the bound", []int64{1, 2, 3, 4, 5, 0, 6, 7, 8, 9}, lines(10), 2, undecided, none, ""},
		{"a line this host left out: the file's own", holed, lines(10), 1 << 16, sameLength, none, ""},
		{"a line another host left out, filled by the file (a recovered placeholder)", holed, lines(10), 1 << 16, differs, 5, "h2"},
		{"shorter than another host's generation", ten, lines(4), 1 << 16, shorter, 4, "h2"},
	}
	dir := t.TempDir()
	for i, tc := range cases {
		conv, err := mirror.NewConv(opts.Owner, fmt.Sprintf("conv-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range streamOf(tc.ords...) {
			m.Host = cmp.Or(tc.host, opts.Host)
			if _, err := opts.JS.PublishMsg(ctx, opts.Names.NewMsg(conv, m.Line, nil)); err != nil {
				t.Fatal(err)
			}
		}
		path := filepath.Join(dir, fmt.Sprintf("%d.jsonl", i))
		if err := os.WriteFile(path, tc.file, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, mode := range []string{"whole", "window"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				nw := newest{}
				if mode == "window" {
					nw.limit = 1
				}
				if err := p.reader.Scan(ctx, conv, mirror.ScanOptions{HeadersOnly: true}, nw.add); err != nil {
					t.Fatal(err)
				}
				w := nw.window(conv, tc.limit)
				w.ahead = 0
				got, err := p.compareWithMirror(ctx, path, int64(len(tc.file)), 0, 0, w)
				if err != nil {
					t.Fatal(err)
				}
				want := tc.want
				if mode == "whole" && want == undecided {
					want = sameLength // a generation kept whole is compared in any order
				}
				if got.cmp != want {
					t.Fatalf("comparison %d, want %d", got.cmp, want)
				}
				if tc.at != none && (got.at != tc.at || !got.found) {
					t.Errorf("differs at %d (a mirrored line there: %v), want at %d", got.at, got.found, tc.at)
				}
			})
		}
	}
}
