package watcher

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	pisession "github.com/pisync/pisync/internal/session"
)

// growing is a file that is being appended to: ReadAt sees only what was written.
type growing struct{ data []byte }

func (g *growing) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(g.data)) {
		return 0, fmt.Errorf("read at %d beyond %d", off, len(g.data))
	}
	n := copy(p, g.data[off:])
	if n < len(p) {
		return n, errors.New("short read")
	}
	return n, nil
}

type gotLine struct {
	Ord, Off, Len int64
	Data          string
	Inline        bool
}

// collect runs advance over content appended in the given pieces, calling it after
// each piece, and returns the lines with their bytes (taken from the content when
// Data is nil) and the final tail.
func collect(t testing.TB, pieces [][]byte, bufSize int, maxInline int64) ([]gotLine, tail) {
	t.Helper()
	lr := newLineReader(bufSize, maxInline)
	g := &growing{}
	var tl tail
	var out []gotLine
	for _, p := range pieces {
		g.data = append(g.data, p...)
		_, err := lr.advance(g, &tl, int64(len(g.data)), func(l Line) error {
			gl := gotLine{Ord: l.Ordinal, Off: l.Offset, Len: l.Len, Inline: l.Data != nil}
			if l.Data != nil {
				if int64(len(l.Data)) != l.Len {
					t.Fatalf("line %d: len(Data)=%d, Len=%d", l.Ordinal, len(l.Data), l.Len)
				}
				gl.Data = string(l.Data)
				if l.SHA256 != nil {
					t.Fatalf("line %d: inline, with a digest", l.Ordinal)
				}
			} else {
				if l.Len <= maxInline {
					t.Fatalf("line %d of %d bytes not inline (max %d)", l.Ordinal, l.Len, maxInline)
				}
				gl.Data = string(g.data[l.Offset : l.Offset+l.Len])
				// The digest covers exactly the delivered bytes, however many reads
				// assembled them (torture T20).
				if l.SHA256 == nil || *l.SHA256 != sha256.Sum256([]byte(gl.Data)) {
					t.Fatalf("line %d of %d bytes: digest %x, want the SHA-256 of its bytes", l.Ordinal, l.Len, l.SHA256)
				}
			}
			out = append(out, gl)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out, tl
}

// reference splits content into complete lines the obvious way.
func reference(content []byte) []gotLine {
	var out []gotLine
	off := int64(0)
	for i, part := range bytes.SplitAfter(content, []byte("\n")) {
		if len(part) == 0 || part[len(part)-1] != '\n' {
			break
		}
		out = append(out, gotLine{Ord: int64(i), Off: off, Len: int64(len(part) - 1), Data: string(part[:len(part)-1])})
		off += int64(len(part))
	}
	return out
}

func sameLines(a, b []gotLine) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Ord != y.Ord || x.Off != y.Off || x.Len != y.Len || x.Data != y.Data {
			return false
		}
	}
	return true
}

func TestLineReader(t *testing.T) {
	cases := []struct {
		name    string
		content string
		torn    int64
	}{
		{"empty", "", 0},
		{"one", "{\"a\":1}\n", 0},
		{"blank lines", "h\n\n\nx\n", 0},
		{"crlf", "h\r\n{\"a\":1}\r\n\r\n", 0},
		{"torn tail", "h\nabc", 3},
		{"only torn", "abc", 3},
		{"lone cr", "h\r", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, bufSize := range []int{1, 2, 3, 16, 4096} {
				got, tl := collect(t, [][]byte{[]byte(c.content)}, bufSize, 1<<20)
				want := reference([]byte(c.content))
				if !sameLines(got, want) {
					t.Fatalf("buf %d: got %+v, want %+v", bufSize, got, want)
				}
				if n := int64(len(c.content)) - tl.off; n != c.torn {
					t.Fatalf("buf %d: torn %d, want %d", bufSize, n, c.torn)
				}
				for _, l := range got {
					if !l.Inline {
						t.Fatalf("line %d not inline", l.Ord)
					}
				}
			}
		})
	}
}

func TestLineReaderBlankLineHasData(t *testing.T) {
	lr := newLineReader(64, 1024)
	g := &growing{data: []byte("\n\r\n")}
	var tl tail
	var lines []Line
	if _, err := lr.advance(g, &tl, 3, func(l Line) error { lines = append(lines, l); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || lines[0].Data == nil || lines[0].Len != 0 || string(lines[1].Data) != "\r" {
		t.Fatalf("got %+v", lines)
	}
}

// TestLineReaderLongLines: a line above the inline limit is delivered without its bytes,
// with the SHA-256 of exactly its bytes (collect checks it), whether one read held it,
// several reads scanned it, or appends tore it and the scan resumed.
func TestLineReaderLongLines(t *testing.T) {
	var long []byte
	for i := range 1000 {
		long = append(long, 'a'+byte(i%26))
	}
	content := append(append([]byte("short\n"), long...), "\nend\n"...)
	cases := []struct {
		name    string
		bufSize int
		cuts    []int // content appended in pieces ending here
	}{
		{"one read", 4096, nil},
		{"many reads", 64, nil},
		{"torn by appends", 64, []int{10, 300, 700, 1006}},
		{"torn by appends, one read each", 4096, []int{10, 300, 700, 1006}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var pieces [][]byte
			from := 0
			for _, cut := range append(c.cuts, len(content)) {
				pieces = append(pieces, content[from:cut])
				from = cut
			}
			got, _ := collect(t, pieces, c.bufSize, 100)
			if len(got) != 3 || !got[0].Inline || got[1].Inline || !got[2].Inline {
				t.Fatalf("got %+v", got)
			}
			if got[1].Off != 6 || got[1].Len != 1000 || got[2].Off != 1007 {
				t.Fatalf("long line at %d len %d, next at %d", got[1].Off, got[1].Len, got[2].Off)
			}
		})
	}
}

// TestLineReaderResumesScan pins that a long torn tail is not scanned again from its
// start on every append: only the new bytes are read.
func TestLineReaderResumesScan(t *testing.T) {
	lr := newLineReader(64, 100)
	g := &growing{}
	var tl tail
	var lines []Line
	emit := func(l Line) error { lines = append(lines, l); return nil }
	var read int64
	for range 50 {
		g.data = append(g.data, bytes.Repeat([]byte("y"), 100)...)
		n, err := lr.advance(g, &tl, int64(len(g.data)), emit)
		if err != nil {
			t.Fatal(err)
		}
		read += n
	}
	g.data = append(g.data, '\n')
	n, err := lr.advance(g, &tl, int64(len(g.data)), emit)
	if err != nil {
		t.Fatal(err)
	}
	read += n
	if len(lines) != 1 || lines[0].Len != 5000 || lines[0].Data != nil {
		t.Fatalf("lines %+v", lines)
	}
	// One scan (the first 100 bytes may be read twice: the line is short until it is
	// not), plus the one pass that checks a line assembled from several reads.
	if read > 2*5001+200 {
		t.Fatalf("read %d bytes for a 5001-byte file", read)
	}
}

// TestLineReaderMemoryBounded reads a 32 MB line: memory stays at the buffers.
func TestLineReaderMemoryBounded(t *testing.T) {
	g := &growing{data: append(bytes.Repeat([]byte("m"), 32<<20), '\n')}
	lr := newLineReader(64<<10, 512<<10)
	var tl tail
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var got int64
	if _, err := lr.advance(g, &tl, int64(len(g.data)), func(l Line) error { got = l.Len; return nil }); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if got != 32<<20 {
		t.Fatalf("line of %d bytes", got)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 2<<20 {
		t.Fatalf("allocated %d bytes for a 32 MB line", n)
	}
}

func TestLineReaderEmitErrorKeepsPosition(t *testing.T) {
	lr := newLineReader(8, 100)
	g := &growing{data: []byte("a\nbb\nccc\n")}
	var tl tail
	refuse := errors.New("no")
	calls := 0
	_, err := lr.advance(g, &tl, int64(len(g.data)), func(l Line) error {
		calls++
		if l.Ordinal == 1 {
			return refuse
		}
		return nil
	})
	if !errors.Is(err, refuse) || tl.off != 2 || tl.ord != 1 {
		t.Fatalf("err %v, tail %+v", err, tl)
	}
	var got []string
	if _, err := lr.advance(g, &tl, int64(len(g.data)), func(l Line) error {
		got = append(got, string(l.Data))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[bb ccc]" || tl.off != 9 || tl.ord != 3 {
		t.Fatalf("got %v, tail %+v", got, tl)
	}
}

// FuzzTail checks that content written in arbitrary pieces (splits inside "\r\n" and
// inside long lines included) yields exactly the lines of one write, with any buffer
// size and inline limit.
func FuzzTail(f *testing.F) {
	f.Add([]byte("{\"type\":\"session\"}\n{\"a\":1}\r\n\n\r\nlast"), []byte{3, 1, 7}, uint8(4), uint8(5))
	f.Add([]byte("a\r\nb\r\n"), []byte{2, 1, 2}, uint8(1), uint8(1))
	f.Add(bytes.Repeat([]byte("xyz\n"), 40), []byte{1, 50, 2}, uint8(7), uint8(3))
	f.Fuzz(func(t *testing.T, content, splits []byte, buf, inline uint8) {
		bufSize := int(buf%64) + 1
		maxInline := int64(inline % 32)
		var pieces [][]byte
		rest := content
		for i := 0; len(rest) > 0; i++ {
			n := len(rest)
			if len(splits) > 0 {
				n = min(1+int(splits[i%len(splits)])%16, len(rest))
			}
			pieces = append(pieces, rest[:n])
			rest = rest[n:]
		}
		whole, wholeTail := collect(t, [][]byte{content}, bufSize, maxInline)
		split, splitTail := collect(t, pieces, bufSize, maxInline)
		want := reference(content)
		if !sameLines(whole, want) {
			t.Fatalf("one write: got %+v, want %+v", whole, want)
		}
		if !sameLines(split, want) {
			t.Fatalf("%d pieces: got %+v, want %+v", len(pieces), split, want)
		}
		if wholeTail.off != splitTail.off || wholeTail.ord != splitTail.ord {
			t.Fatalf("tails differ: %+v vs %+v", wholeTail, splitTail)
		}
		for _, l := range split {
			if l.Inline != (l.Len <= maxInline) {
				t.Fatalf("line %d of %d bytes: inline=%v with max %d", l.Ord, l.Len, l.Inline, maxInline)
			}
		}
	})
}

// TestLineSrcIsTheReadingDescriptor pins issue 13 item 7: a line too large for Line.Data
// is read again through Line.Src, the descriptor that read it, so another file renamed
// over the path meanwhile is not read in its place.
func TestLineSrcIsTheReadingDescriptor(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "s.jsonl")
	lines := session("srcdesc1", 1)
	big := `{"type":"message","id":"big00001","parentId":null,"text":"` + strings.Repeat("b", 300) + `"}`
	lines = append(lines, big)
	writeFile(t, p, joinLines(lines...))
	other := filepath.Join(root, "other.tmp")
	writeFile(t, other, strings.Repeat("X", 2000)+"\n")
	sink := newRecSink()
	got := make(chan string, 1)
	var once sync.Once
	sink.line = func(f File, l Line) error {
		if l.Data != nil {
			return nil
		}
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil // the file renamed over the path: a line of its own
		}
		if err := os.Rename(other, p); err != nil {
			t.Error(err)
		}
		b := make([]byte, l.Len)
		if _, err := l.Src.ReadAt(b, l.Offset); err != nil {
			t.Error(err)
		}
		got <- string(b)
		return nil
	}
	h := start(t, sink, []string{root}, func(o *Options) { o.MaxInlineBytes = 200 })
	h.ready(t)
	select {
	case b := <-got:
		if b != big {
			t.Fatalf("read %q…, want the line the watcher read", b[:20])
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no large line delivered")
	}
}

// TestLastLineDigestOfLargeLineInOneRead pins torture finding T5: with a read buffer
// larger than the inline limit (the daemon sets the limit to the blob threshold), a line
// between the two came in one read with Data nil, was digested as empty, and every later
// check of it failed: the file was taken for rewritten on every run and never read on.
func TestLastLineDigestOfLargeLineInOneRead(t *testing.T) {
	g := &growing{data: []byte(`{"h":1}` + "\n" + strings.Repeat("L", 500) + "\n")}
	lr := newLineReader(1024, 100)
	var tl tail
	var got []Line
	if _, err := lr.advance(g, &tl, int64(len(g.data)), func(l Line) error { got = append(got, l); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1].Data != nil {
		t.Fatalf("lines %+v", got)
	}
	if _, err := lr.checkLast(g, tl.last); err != nil {
		t.Fatalf("the last line, unchanged, fails its check: %v", err)
	}
	g.data = append(g.data, "{\"next\":2}\n"...)
	if _, err := lr.advance(g, &tl, int64(len(g.data)), func(l Line) error { got = append(got, l); return nil }); err != nil || len(got) != 3 {
		t.Fatalf("append after the large line: %d lines, %v", len(got), err)
	}
}

// The watcher reads a file's lead as `pisync status` does (session.ReadLead), whatever
// its lines' lengths and the watcher's own buffer and inline bounds.
func TestLeadLinesAgreeWithStatus(t *testing.T) {
	const (
		header = `{"type":"session","version":3,"id":"0199ffff-0000-7000-8000-000000000001","timestamp":"2026-12-05T14:00:00.000Z","cwd":"/w"}`
		title  = `{"type":"title","v":1,"title":"t"}`
		msg    = `{"type":"message","id":"a1b2c3d4","parentId":null,"message":{"role":"user","content":"hi"}}`
	)
	big := func(n int) string { return `{"type":"message","id":"b","data":"` + strings.Repeat("A", n) + `"}` }
	bigHeader := strings.Replace(header, `"/w"`, `"/`+strings.Repeat("w", pisession.LeadBytes)+`"`, 1)
	files := map[string]string{
		"empty":                   "",
		"torn header":             header,
		"Pi's file":               header + "\n" + msg + "\n" + msg,
		"nine entries":            strings.Repeat(msg+"\n", pisession.LeadLines+1),
		"header over LeadBytes":   bigHeader + "\n" + msg + "\n",
		"title then an image":     title + "\n" + big(pisession.LeadBytes) + "\n" + header + "\n",
		"two halves of the bound": big(pisession.LeadBytes/2) + "\n" + big(pisession.LeadBytes/2) + "\n" + msg + "\n",
		"a line over maxInline":   big(600<<10) + "\n" + msg + "\n",
	}
	for name, content := range files {
		for _, bufSize := range []int{64, 4096, 64 << 10} {
			t.Run(fmt.Sprintf("%s/buf%d", name, bufSize), func(t *testing.T) {
				sameLead(t, []byte(content), bufSize)
			})
		}
	}
}

// FuzzLeadLines holds the watcher's lead to session.ReadLead's for any content and read
// buffer size.
func FuzzLeadLines(f *testing.F) {
	f.Add([]byte("{\"type\":\"title\"}\n{\"type\":\"session\",\"id\":\"x\"}\n{}\n"), uint16(7))
	f.Add(bytes.Repeat([]byte("{}\n"), 12), uint16(1))
	f.Add([]byte("\n\n\r\nno newline"), uint16(300))
	f.Fuzz(func(t *testing.T, content []byte, buf uint16) {
		sameLead(t, content, int(buf%4096)+1)
	})
}

// sameLead fails t unless the watcher, reading content with a buffer of bufSize bytes,
// finds the lead session.ReadLead finds.
func sameLead(t *testing.T, content []byte, bufSize int) {
	t.Helper()
	want, err := pisession.ReadLead(bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	lr := newLineReader(bufSize, DefaultMaxInlineBytes)
	lines, more, _, err := lr.leadLines(bytes.NewReader(content), int64(len(content)))
	if err != nil {
		t.Fatal(err)
	}
	if more != want.More || len(lines) != len(want.Lines) {
		t.Fatalf("watcher: %d lines, more %v; status: %d lines, more %v", len(lines), more, len(want.Lines), want.More)
	}
	for i := range lines {
		if (lines[i] == nil) != (want.Lines[i] == nil) || !bytes.Equal(lines[i], want.Lines[i]) {
			t.Errorf("line %d: watcher %.40q (nil %v), status %.40q (nil %v)", i, lines[i], lines[i] == nil, want.Lines[i], want.Lines[i] == nil)
		}
	}
}
