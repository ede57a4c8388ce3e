package watcher

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// countSink accepts everything and counts lines.
type countSink struct{ lines atomic.Int64 }

func (c *countSink) Open(context.Context, File, OpenReason) (Start, error) { return Start{}, nil }
func (c *countSink) Line(context.Context, File, Line) error {
	c.lines.Add(1)
	return nil
}
func (c *countSink) Torn(File, int64, int64) {}
func (c *countSink) Gone(File)               {}

// BenchmarkBackfill measures the initial scan: every file discovered, opened, and read
// to its end into a sink that does nothing (MB/s over the files' bytes; the page cache
// is warm after the first iteration).
func BenchmarkBackfill(b *testing.B) {
	for _, shape := range []struct{ files, lines, lineLen int }{
		{1000, 300, 250},
		{50, 2000, 4000},
	} {
		b.Run(fmt.Sprintf("files=%d/lines=%d/len=%d", shape.files, shape.lines, shape.lineLen), func(b *testing.B) {
			root := b.TempDir()
			line := `{"type":"message","id":"abcd1234","parentId":null,"text":"` + strings.Repeat("y", shape.lineLen-60) + `"}` + "\n"
			content := strings.Repeat(line, shape.lines)
			var total int64
			for i := range shape.files {
				p := filepath.Join(root, fmt.Sprintf("--w%02d--", i%40), fmt.Sprintf("s%05d.jsonl", i))
				writeFile(b, p, content)
				total += int64(len(content))
			}
			b.SetBytes(total)
			b.ResetTimer()
			for b.Loop() {
				sink := &countSink{}
				w, err := New(Options{Roots: []string{root}, Sink: sink, RescanInterval: -1})
				if err != nil {
					b.Fatal(err)
				}
				_, stop := runReady(w)
				if err := stop(); err != nil {
					b.Fatal(err)
				}
				if n := sink.lines.Load(); n != int64(shape.files*shape.lines) {
					b.Fatalf("%d lines", n)
				}
			}
		})
	}
}

// BenchmarkLineReader measures splitting alone, from memory.
func BenchmarkLineReader(b *testing.B) {
	content := bytes.Repeat([]byte(`{"type":"message","id":"abcd1234","text":"`+strings.Repeat("z", 200)+`"}`+"\n"), 50000)
	g := &growing{data: content}
	lr := newLineReader(DefaultReadBuffer, DefaultMaxInlineBytes)
	b.SetBytes(int64(len(content)))
	for b.Loop() {
		var t tail
		if _, err := lr.advance(g, &t, int64(len(content)), func(Line) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLongLines measures splitting lines above the inline limit (1 MiB entries,
// default read buffer and inline limit), from memory: each is scanned, then read again
// in one pass that checks it and takes its digests (maphash, and the SHA-256 the sink
// checks its own re-read against).
func BenchmarkLongLines(b *testing.B) {
	content := bytes.Repeat([]byte(`{"type":"message","id":"abcd1234","text":"`+strings.Repeat("z", 1<<20)+`"}`+"\n"), 12)
	g := &growing{data: content}
	lr := newLineReader(DefaultReadBuffer, DefaultMaxInlineBytes)
	b.SetBytes(int64(len(content)))
	b.ReportAllocs()
	for b.Loop() {
		var t tail
		if _, err := lr.advance(g, &t, int64(len(content)), func(Line) error { return nil }); err != nil || t.ord != 12 {
			b.Fatal(t.ord, err)
		}
	}
}

// BenchmarkSettleCheck measures the settled check (settle.go) of a 12 MB file from
// memory: what one quiet period after a change costs, per byte delivered.
func BenchmarkSettleCheck(b *testing.B) {
	content := bytes.Repeat([]byte(`{"type":"message","id":"abcd1234","text":"`+strings.Repeat("z", 200)+`"}`+"\n"), 50000)
	g := &growing{data: content}
	lr := newLineReader(DefaultReadBuffer, DefaultMaxInlineBytes)
	b.SetBytes(int64(len(content)))
	for b.Loop() {
		if _, n, _, err := lr.prefixOf(g, int64(len(content))); err != nil || n != 50000 {
			b.Fatal(n, err)
		}
	}
}

// BenchmarkLastLineCheck measures the per-event check of the last delivered line (a
// 250-byte entry), the rewrite test every event pays.
func BenchmarkLastLineCheck(b *testing.B) {
	content := bytes.Repeat([]byte(`{"type":"message","id":"abcd1234","text":"`+strings.Repeat("z", 200)+`"}`+"\n"), 4)
	g := &growing{data: content}
	lr := newLineReader(DefaultReadBuffer, DefaultMaxInlineBytes)
	var t tail
	if _, err := lr.advance(g, &t, int64(len(content)), func(Line) error { return nil }); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := lr.checkLast(g, t.last); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRescanIdle measures a periodic rescan of files that did not change: a stat of
// each, nothing read. What it allocates per file is what an idle daemon allocates every
// RescanInterval, and so how far its heap grows between collections.
func BenchmarkRescanIdle(b *testing.B) {
	const files = 2000
	root := b.TempDir()
	for i := range files {
		writeFile(b, filepath.Join(root, fmt.Sprintf("--w%02d--", i%20), fmt.Sprintf("s%05d.jsonl", i)), "{\"type\":\"session\"}\n")
	}
	w, err := New(Options{Roots: []string{root}, Sink: &countSink{}, RescanInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	ctx, stop := runReady(w)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		w.rescan(ctx, w.roots[0], "periodic", false)
	}
	b.StopTimer()
	b.ReportMetric(float64(testing.AllocsPerRun(1, func() { w.rescan(ctx, w.roots[0], "periodic", false) }))/files, "allocs/file")
	if err := stop(); err != nil {
		b.Fatal(err)
	}
}

// runReady runs w until its initial scan is done; stop cancels it and returns what Run
// returned.
func runReady(w *Watcher) (ctx context.Context, stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-w.Ready()
	return ctx, func() error {
		cancel()
		return <-done
	}
}
