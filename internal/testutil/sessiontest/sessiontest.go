// Package sessiontest writes Pi session files the way Pi writes them, for tests and
// benchmarks: one append per line (open, write, close), the harness header alone at
// creation, lines split over several writes, and realistic content for each format.
package sessiontest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pisync/pisync/internal/session"
)

// Format of a generated session.
type Format int

// Formats seen in the wild (DESIGN §1).
const (
	HarnessV3 Format = iota // with leaf and active_tools_change entries
	CLIV3
	CLIV2
	CLIV1 // no version, entries without id/parentId
)

func (f Format) String() string {
	return [...]string{"harness-v3", "cli-v3", "cli-v2", "cli-v1"}[f]
}

// File is a session file being written.
type File struct {
	Path   string
	ID     string
	Format Format
	Lines  [][]byte // every line written, without newlines, in order

	rng    *rand.Rand
	ts     time.Time
	ids    []string
	leaf   string
	nextID int
}

// New prepares a session in root under Pi's layout. Nothing is written yet.
func New(rng *rand.Rand, root, cwd string, format Format) *File {
	id := uuid(rng)
	ts := time.Date(2026, 11, 1, 9, 0, 0, 0, time.UTC).Add(time.Duration(rng.IntN(1e6)) * time.Second)
	stamp := ts.Format("2006-01-02T15:04:05.000Z")
	dir := filepath.Join(root, session.DirName(cwd))
	return &File{
		Path:   filepath.Join(dir, session.FileName(stamp, id)),
		ID:     id,
		Format: format,
		rng:    rng,
		ts:     ts,
	}
}

// HeaderLine is the session header for f.
func (f *File) HeaderLine(cwd string) []byte {
	h := map[string]any{"type": "session", "id": f.ID, "timestamp": f.stamp(), "cwd": cwd}
	switch f.Format {
	case HarnessV3, CLIV3:
		h["version"] = 3
	case CLIV2:
		h["version"] = 2
	}
	return marshal(h, "type", "version", "id", "timestamp", "cwd")
}

// Append writes lines the way Pi does: one open-append-close per line.
func (f *File) Append(lines ...[]byte) error {
	if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
		return err
	}
	for _, l := range lines {
		if err := AppendBytes(f.Path, append(append([]byte(nil), l...), '\n')); err != nil {
			return err
		}
		f.Lines = append(f.Lines, l)
	}
	return nil
}

// AppendSplit writes one line in two writes, the first ending at split.
func (f *File) AppendSplit(line []byte, split int, between func()) error {
	if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
		return err
	}
	full := append(append([]byte(nil), line...), '\n')
	if err := AppendBytes(f.Path, full[:split]); err != nil {
		return err
	}
	if between != nil {
		between()
	}
	if err := AppendBytes(f.Path, full[split:]); err != nil {
		return err
	}
	f.Lines = append(f.Lines, line)
	return nil
}

// Rewrite replaces the content of path in place the way Pi rewrites a whole file when it
// migrates or branches it: open with truncation (same inode), then one write per line.
func Rewrite(path string, lines [][]byte) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	for _, l := range lines {
		if _, err := fh.Write(append(append([]byte(nil), l...), '\n')); err != nil {
			fh.Close()
			return err
		}
	}
	return fh.Close()
}

// AppendBytes appends b to path in one write, creating the file if needed.
func AppendBytes(path string, b []byte) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := fh.Write(b); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

// Content returns the file's expected bytes.
func (f *File) Content() []byte {
	var b strings.Builder
	for _, l := range f.Lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

// Entry generates the next entry of a realistic conversation, of about size bytes
// (at least a few hundred). It tracks ids and the leaf; harness sessions sometimes
// navigate with a leaf entry.
func (f *File) Entry(size int) []byte {
	f.ts = f.ts.Add(time.Duration(1+f.rng.IntN(5000)) * time.Millisecond)
	if f.Format == CLIV1 {
		return marshal(map[string]any{"type": "message", "timestamp": f.stamp(), "message": f.message(size)},
			"type", "timestamp", "message")
	}
	id := f.newID()
	parent := any(nil)
	if f.leaf != "" {
		parent = f.leaf
	}
	roll := f.rng.IntN(100)
	switch {
	case f.Format == HarnessV3 && roll < 4 && len(f.ids) > 2:
		target := f.ids[f.rng.IntN(len(f.ids)-1)]
		e := marshal(map[string]any{"type": "leaf", "id": id, "parentId": parent, "timestamp": f.stamp(), "targetId": target},
			"type", "id", "parentId", "timestamp", "targetId")
		f.leaf = target
		return e
	case roll < 7:
		f.ids = append(f.ids, id)
		f.leaf = id
		return marshal(map[string]any{"type": "model_change", "id": id, "parentId": parent, "timestamp": f.stamp(),
			"provider": "anthropic", "modelId": "claude-sonnet-4-5"}, "type", "id", "parentId", "timestamp", "provider", "modelId")
	case f.Format == HarnessV3 && roll < 9:
		f.ids = append(f.ids, id)
		f.leaf = id
		return marshal(map[string]any{"type": "active_tools_change", "id": id, "parentId": parent, "timestamp": f.stamp(),
			"activeTools": []string{"read", "bash", "edit"}}, "type", "id", "parentId", "timestamp", "activeTools")
	case roll < 11:
		f.ids = append(f.ids, id)
		f.leaf = id
		return marshal(map[string]any{"type": "x_future_type", "id": id, "parentId": parent, "timestamp": f.stamp(),
			"payload": map[string]any{"id": "nested-not-an-entry", "n": 1}}, "type", "id", "parentId", "timestamp", "payload")
	}
	f.ids = append(f.ids, id)
	f.leaf = id
	return marshal(map[string]any{"type": "message", "id": id, "parentId": parent, "timestamp": f.stamp(), "message": f.message(size)},
		"type", "id", "parentId", "timestamp", "message")
}

// Message generates the next entry as a message of about size bytes, whatever the roll.
func (f *File) Message(size int) []byte {
	f.ts = f.ts.Add(time.Second)
	if f.Format == CLIV1 {
		return marshal(map[string]any{"type": "message", "timestamp": f.stamp(), "message": f.message(size)},
			"type", "timestamp", "message")
	}
	id := f.newID()
	parent := any(nil)
	if f.leaf != "" {
		parent = f.leaf
	}
	f.ids = append(f.ids, id)
	f.leaf = id
	return marshal(map[string]any{"type": "message", "id": id, "parentId": parent, "timestamp": f.stamp(), "message": f.message(size)},
		"type", "id", "parentId", "timestamp", "message")
}

// Leaf is the leaf after the entries generated so far (Pi's rule).
func (f *File) Leaf() string { return f.leaf }

// Reset makes lines (header first) the file's content as far as the generator knows,
// after a rewrite, a truncation or a migration to format: entries generated next continue
// the tree from the leaf of those lines, so that no parent is ever missing.
func (f *File) Reset(format Format, lines [][]byte) {
	f.Format, f.Lines, f.ids, f.leaf = format, lines, nil, ""
	var leaf session.Leaf
	for i, l := range lines {
		env, err := session.ScanEntry(l)
		if i == 0 || err != nil || !isEntry(env) {
			continue
		}
		if env.ID != "" && env.Type != "leaf" {
			f.ids = append(f.ids, env.ID)
		}
		leaf.Apply(env)
	}
	f.leaf = leaf.ID()
}

// isEntry reports whether env is a tree entry: not the header, nor a record a fork
// writes before it (oh-my-pi's title).
func isEntry(env session.Envelope) bool { return env.Type != "session" && env.Type != "title" }

// TitleLine is the record oh-my-pi writes before the header (Pi #8880): a fixed-width
// title slot, without an id.
func (f *File) TitleLine(title string) []byte {
	return marshal(map[string]any{"type": "title", "v": 1, "title": title, "source": "auto", "updatedAt": f.stamp(), "pad": "                "},
		"type", "v", "title", "source", "updatedAt", "pad")
}

// Clone is a copy of the session at another path, carrying the same id (a copied file),
// whose generator continues from the same leaf with its own random source.
func (f *File) Clone(rng *rand.Rand, path string) *File {
	c := *f
	c.Path, c.rng = path, rng
	c.Lines = append([][]byte(nil), f.Lines...)
	c.ids = append([]string(nil), f.ids...)
	return &c
}

func (f *File) message(size int) map[string]any {
	roles := []string{"user", "assistant", "toolResult"}
	role := roles[f.rng.IntN(len(roles))]
	text := Text(f.rng, max(size-200, 16))
	if role == "assistant" && f.rng.IntN(4) == 0 {
		return map[string]any{"role": role, "content": []any{
			map[string]any{"type": "text", "text": text},
			map[string]any{"type": "toolCall", "id": "call_" + f.newID(), "name": "bash", "arguments": map[string]any{"command": "ls -la"}},
		}}
	}
	return map[string]any{"role": role, "content": []any{map[string]any{"type": "text", "text": text}}, "timestamp": f.ts.UnixMilli()}
}

// ImageEntry is a user message carrying a base64 image of n raw bytes.
func (f *File) ImageEntry(n int) []byte {
	id := f.newID()
	parent := any(nil)
	if f.leaf != "" {
		parent = f.leaf
	}
	raw := make([]byte, n)
	for i := range raw {
		raw[i] = byte(f.rng.IntN(256))
	}
	f.ids = append(f.ids, id)
	f.leaf = id
	return marshal(map[string]any{"type": "message", "id": id, "parentId": parent, "timestamp": f.stamp(),
		"message": map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image", "mimeType": "image/png", "data": base64.StdEncoding.EncodeToString(raw)},
		}}}, "type", "id", "parentId", "timestamp", "message")
}

func (f *File) newID() string {
	f.nextID++
	return fmt.Sprintf("%08x", f.rng.Uint32())
}

func (f *File) stamp() string { return f.ts.Format("2006-01-02T15:04:05.000Z") }

// Text is printable text of n bytes with some escapes and non-ASCII in it.
func Text(rng *rand.Rand, n int) string {
	words := []string{"session", "tree", "leaf", "the", "entry", "\"quoted\"", "naïve", "日本語", "path/to/file.go", "\\n", "tab\t", "JetStream"}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(words[rng.IntN(len(words))])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

// uuid is a random version-4 UUID from rng (deterministic for a seed).
func uuid(rng *rand.Rand) string {
	var b [16]byte
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// marshal encodes m with keys in the given order, as JavaScript's JSON.stringify keeps
// insertion order (Pi writes type, id, parentId, timestamp first).
func marshal(m map[string]any, order ...string) []byte {
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range order {
		v, ok := m[k]
		if !ok {
			continue
		}
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		vb, _ := json.Marshal(v)
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
	}
	b.WriteByte('}')
	return []byte(b.String())
}
