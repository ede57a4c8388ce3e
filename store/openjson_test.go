package store

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// TestAppendJSONString checks that open's own string encoder writes what encoding/json
// writes, byte for byte, and refuses what is not UTF-8.
func TestAppendJSONString(t *testing.T) {
	cases := []string{
		"", "plain", `{"type":"message","id":"a1","parentId":null}`, "tab\tnew\nline\rcr",
		"\b\f\x00\x01\x1f\x7f", `back\slash "quoted"`, "<html> & </html>", "line\u2028sep\u2029para",
		"naïve — 日本語 🙂", "\xef\xbf\xbd", // U+FFFD itself is valid
	}
	all := make([]byte, 0, 128)
	for b := 0; b < 128; b++ {
		all = append(all, byte(b))
	}
	cases = append(cases, string(all))
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune{'a', '"', '\\', '\n', 0, 0x1f, '<', '&', 'é', '\u2028', '日', '🙂', 0x7f}
	for i := 0; i < 200; i++ {
		r := make([]rune, rng.IntN(40))
		for j := range r {
			r[j] = alphabet[rng.IntN(len(alphabet))]
		}
		cases = append(cases, string(r))
	}
	for _, c := range cases {
		want, _ := json.Marshal(c)
		got, ok := appendJSONString([]byte("x"), []byte(c))
		if !ok || !bytes.Equal(got, append([]byte("x"), want...)) {
			t.Errorf("%q: got %s (ok %v), encoding/json writes %s", c, got, ok, want)
		}
	}
	for _, bad := range []string{"\xff", "ok\xc3", "\xed\xa0\x80", "a\x80b"} {
		if got, ok := appendJSONString([]byte("x"), []byte(bad)); ok || string(got) != "x" {
			t.Errorf("%q: got %q, ok %v; want it refused and nothing written", bad, got, ok)
		}
	}
}

// TestOpenReplyJSON checks the reply open writes against encoding/json's encoding of the
// same fields.
func TestOpenReplyJSON(t *testing.T) {
	h := "e5"
	line := `{"type":"message","id":"e5","text":"<b>"}`
	entries := []OpenEntry{{Ordinal: 1, Line: &line}, {Ordinal: 2, Line: &line, Raw: true}, {Ordinal: 3, Size: 2400000, SHA256: "9f"}}
	var buf []byte
	for i, e := range entries {
		if i > 0 {
			buf = append(buf, ',')
		}
		var l []byte
		if e.Line != nil {
			l = []byte(*e.Line)
		}
		buf, _ = appendOpenEntry(buf, OpenEntry{Ordinal: e.Ordinal, Raw: e.Raw, Size: e.Size, SHA256: e.SHA256}, l)
	}
	meta := Meta{ID: "s1", CreatedAt: "2026-12-01T18:00:00.000Z", Cwd: "/srv", Metadata: json.RawMessage(`{"a":1}`), Writer: "store", Generation: 1, Entries: 3, Head: &h, LastSeq: 9}
	for _, next := range []*OpenNext{nil, {After: 3}} {
		r := OpenReply{OK: true, Meta: meta, Head: &h, Generation: 1, LastSeq: 9, Next: next, entries: buf, count: 3}
		got, err := r.replyJSON()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(struct {
			OK         bool        `json:"ok"`
			Meta       Meta        `json:"meta"`
			Head       *string     `json:"head"`
			Generation int         `json:"generation"`
			LastSeq    uint64      `json:"lastSeq"`
			Entries    []OpenEntry `json:"entries"`
			Next       *OpenNext   `json:"next,omitempty"`
		}{true, meta, &h, 1, 9, entries, next})
		if !bytes.Equal(got, want) {
			t.Errorf("got  %s\nwant %s", got, want)
		}
		// As Open writes it: the head first, the entries behind it in the same buffer.
		head, _ := json.Marshal(r.head())
		r.body = append(append(head[:len(head)-1:len(head)-1], `,"entries":[`...), buf...)
		if got, _ := r.replyJSON(); !bytes.Equal(got, want) {
			t.Errorf("written in one buffer: got  %s\nwant %s", got, want)
		}
	}
}

// BenchmarkAppendJSONString encodes entry lines of about 1 KiB as Pi writes them (a
// message with text, quotes and a few non-ASCII characters), as open does for each entry.
func BenchmarkAppendJSONString(b *testing.B) {
	text := bytes.Repeat([]byte("The store answers each request in order; naïve readers — "), 20)
	line, _ := json.Marshal(map[string]any{"type": "message", "id": "a1b2c3d4", "parentId": "f0e1d2c3",
		"timestamp": "2026-12-02T05:00:00.000Z", "message": map[string]any{"role": "user", "content": string(text)}})
	buf := make([]byte, 0, 4*len(line))
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		buf, _ = appendJSONString(buf[:0], line)
	}
}
