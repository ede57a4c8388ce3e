package publisher

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/pisync/pisync/mirror"
)

// TestResumeHoldsOneGeneration pins issue 13 item 9: resuming a file without its state
// directory read the conversation's whole subject and kept every ordinal's digest of
// every generation. A file Pi rewrote eight times held eight copies. Only the newest
// generation is kept now, also when a late resend of an older one lands after it.
func TestResumeHoldsOneGeneration(t *testing.T) {
	const gens, lines = 8, 20000
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
	var nw newest
	seq := uint64(0)
	for g := 1; g <= gens; g++ {
		for o := int64(0); o < lines; o++ {
			seq++
			nw.add(msg(g, o, seq))
			if o%1000 == 0 && g > 1 {
				seq++
				nw.add(msg(g-1, o, seq)) // a late resend of the generation before
			}
			if int64(len(nw.held)) > lines {
				t.Fatalf("generation %d: %d digests held, more than one generation's %d", g, len(nw.held), lines)
			}
		}
	}
	if nw.gen != gens || len(nw.held) != lines {
		t.Fatalf("newest generation %d with %d lines, want %d with %d", nw.gen, len(nw.held), gens, lines)
	}
	if h := nw.held[7]; h.sha != msg(gens, 7, 0).SHA256 {
		t.Fatalf("ordinal 7 holds %s, want the newest generation's digest", h.sha)
	}
	// Memory is one generation's digests (about 200 bytes a line with the map), not eight.
	grown := int64(heap()) - int64(base)
	t.Logf("held %d lines of generation %d in %d bytes", len(nw.held), nw.gen, grown)
	if grown > 2*lines*200 {
		t.Fatalf("%d bytes held for %d lines of one generation", grown, lines)
	}
	runtime.KeepAlive(&nw)
}
