package pitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
)

// Dump is the canonical dump of one session file as Pi reads it (the helper's `dump`):
// the header (never the file's own path), the entries in file order, the leaf, the branch
// (cut at a compaction by the harness), the full walk from the leaf towards a root, and
// the model context. The same file always dumps to the same bytes, so two files that Pi
// reads identically have equal Raw.
type Dump struct {
	Loader           string            `json:"loader"`
	Header           map[string]any    `json:"header"`
	SessionName      *string           `json:"sessionName"`
	Labels           map[string]string `json:"labels"`
	Entries          []Entry           `json:"entries"`
	LeafID           *string           `json:"leafId"`
	Branch           []string          `json:"branch"`
	RootPath         []string          `json:"rootPath"`
	DanglingParentID *string           `json:"danglingParentId"`
	Context          Context           `json:"context"`

	Raw json.RawMessage `json:"-"` // the dump as the helper printed it
}

// Context is buildContext() (harness) or buildSessionContext() (CLI).
type Context struct {
	Messages      []json.RawMessage `json:"messages"`
	Model         json.RawMessage   `json:"model"`
	ThinkingLevel json.RawMessage   `json:"thinkingLevel"`
	ActiveTools   json.RawMessage   `json:"activeTools"`
}

// Entry is one entry as Pi returns it: the envelope fields tests look at, and its bytes.
type Entry struct {
	Type       string
	ID         string
	ParentID   *string // nil: null
	TargetID   *string // leaf entries (and the CLI's context_edit)
	CustomType string  // custom entries
	Raw        json.RawMessage
}

// UnmarshalJSON keeps the entry's bytes next to its envelope.
func (e *Entry) UnmarshalJSON(b []byte) error {
	var env struct {
		Type       string  `json:"type"`
		ID         string  `json:"id"`
		ParentID   *string `json:"parentId"`
		TargetID   *string `json:"targetId"`
		CustomType string  `json:"customType"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return err
	}
	*e = Entry{Type: env.Type, ID: env.ID, ParentID: env.ParentID, TargetID: env.TargetID,
		CustomType: env.CustomType, Raw: append(json.RawMessage(nil), b...)}
	return nil
}

// Leaf is the leaf id, "" for none.
func (d *Dump) Leaf() string { return deref(d.LeafID) }

// Entry returns the entry with id, or nil.
func (d *Dump) Entry(id string) *Entry {
	for i := range d.Entries {
		if d.Entries[i].ID == id {
			return &d.Entries[i]
		}
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// DecodeDump parses a dump.
func DecodeDump(b []byte) (*Dump, error) {
	d := &Dump{}
	if err := json.Unmarshal(b, d); err != nil {
		return nil, fmt.Errorf("decode dump: %w", err)
	}
	d.Raw = bytes.TrimSpace(append(json.RawMessage(nil), b...))
	return d, nil
}

// DumpFile loads path with Pi (loader harness, cli or Cli073) and returns its dump; a file Pi
// refuses fails t with Pi's message.
func (h *Helper) DumpFile(t testing.TB, path, loader string) *Dump {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	out, err := h.Output(ctx, "dump", path, "--loader", loader)
	if err != nil {
		t.Fatalf("Pi refused %s: %v", path, err)
	}
	d, err := DecodeDump(out)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return d
}

// DumpRequest names a file and the loader to read it with.
type DumpRequest struct {
	Path   string
	Loader string // harness, cli or Cli073
}

// DumpResult is one file of DumpMany: its dump, or Pi's reason for refusing it.
type DumpResult struct {
	Dump  *Dump
	Error string
}

// DumpMany dumps every file in one helper process (a Node start costs about a second)
// and returns the results keyed by path. A file Pi refuses is a result with Error set,
// not a failure of t; anything else going wrong fails t.
func (h *Helper) DumpMany(t testing.TB, reqs []DumpRequest) map[string]DumpResult {
	t.Helper()
	byLoader := map[string][]string{}
	for _, r := range reqs {
		byLoader[r.Loader] = append(byLoader[r.Loader], r.Path)
	}
	args := []string{"dump-many"}
	for _, loader := range []string{"harness", "cli", Cli073} {
		if len(byLoader[loader]) > 0 {
			args = append(append(args, "--loader", loader), byLoader[loader]...)
		}
		delete(byLoader, loader)
	}
	for loader := range byLoader {
		t.Fatalf("DumpMany: unknown loader %q", loader)
	}
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	out, err := h.Output(ctx, args...)
	var perr *Error
	if err != nil && !(errors.As(err, &perr) && perr.Code == 1) {
		t.Fatal(err)
	}
	var raw map[string]struct {
		Dump  json.RawMessage `json:"dump"`
		Error string          `json:"error"`
	}
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatalf("dump-many: decode output: %v (helper: %v)", err, perr)
	}
	res := make(map[string]DumpResult, len(raw))
	for _, r := range reqs {
		v, ok := raw[r.Path]
		switch {
		case !ok:
			t.Fatalf("dump-many: no result for %s", r.Path)
		case v.Error != "":
			res[r.Path] = DumpResult{Error: v.Error}
		default:
			d, err := DecodeDump(v.Dump)
			if err != nil {
				t.Fatalf("%s: %v", r.Path, err)
			}
			res[r.Path] = DumpResult{Dump: d}
		}
	}
	return res
}

// DiffDumps describes how got differs from want, field by field (for entries and
// context messages, the first differing index); nil when their bytes are equal.
func DiffDumps(want, got json.RawMessage) []string {
	if bytes.Equal(want, got) {
		return nil
	}
	var w, g map[string]json.RawMessage
	if json.Unmarshal(want, &w) != nil || json.Unmarshal(got, &g) != nil {
		return []string{"dumps differ and do not decode"}
	}
	var diffs []string
	for _, k := range unionKeys(w, g) {
		if bytes.Equal(w[k], g[k]) {
			continue
		}
		switch k {
		case "entries":
			diffs = append(diffs, diffList("entries", w[k], g[k])...)
		case "context":
			var wc, gc map[string]json.RawMessage
			_ = json.Unmarshal(w[k], &wc)
			_ = json.Unmarshal(g[k], &gc)
			for _, ck := range unionKeys(wc, gc) {
				if bytes.Equal(wc[ck], gc[ck]) {
					continue
				}
				if ck == "messages" {
					diffs = append(diffs, diffList("context.messages", wc[ck], gc[ck])...)
				} else {
					diffs = append(diffs, fmt.Sprintf("context.%s: want %s, got %s", ck, clip(wc[ck]), clip(gc[ck])))
				}
			}
		default:
			diffs = append(diffs, fmt.Sprintf("%s: want %s, got %s", k, clip(w[k]), clip(g[k])))
		}
	}
	return diffs
}

func diffList(name string, want, got json.RawMessage) []string {
	var w, g []json.RawMessage
	_ = json.Unmarshal(want, &w)
	_ = json.Unmarshal(got, &g)
	var diffs []string
	if len(w) != len(g) {
		diffs = append(diffs, fmt.Sprintf("%s: want %d, got %d", name, len(w), len(g)))
	}
	for i := 0; i < min(len(w), len(g)); i++ {
		if !bytes.Equal(w[i], g[i]) {
			diffs = append(diffs, fmt.Sprintf("%s[%d]: want %s, got %s", name, i, clip(w[i]), clip(g[i])))
			break
		}
	}
	return diffs
}

func unionKeys(a, b map[string]json.RawMessage) []string {
	seen := map[string]bool{}
	var keys []string
	for _, m := range []map[string]json.RawMessage{a, b} {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}

// clip shortens JSON for a failure message (images are megabytes).
func clip(b json.RawMessage) string {
	const limit = 300
	if b == nil {
		return "(absent)"
	}
	if len(b) <= limit {
		return string(b)
	}
	return fmt.Sprintf("%s…(%d bytes)", b[:limit], len(b))
}

// NormalizeIDs replaces every entry id of a dump, wherever it appears as a string value
// or an object key, by "#<index of the entry>". Pi's migration of a version-1 file gives
// its entries new random ids each time it runs, so two dumps of one v1 file (or of two
// identical copies) are equal only up to those ids.
func NormalizeIDs(raw json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // numbers keep their digits
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	top, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("dump is not an object")
	}
	entries, _ := top["entries"].([]any)
	ids := map[string]string{}
	for i, e := range entries {
		if m, ok := e.(map[string]any); ok {
			if id, ok := m["id"].(string); ok && id != "" {
				ids[id] = fmt.Sprintf("#%d", i)
			}
		}
	}
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case string:
			if n, ok := ids[x]; ok {
				return n
			}
			return x
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
			return x
		case map[string]any:
			out := make(map[string]any, len(x))
			for k, val := range x {
				if n, ok := ids[k]; ok {
					k = n
				}
				out[k] = walk(val)
			}
			return out
		}
		return v
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(walk(top)); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(buf.Bytes()), nil
}

// Placeholder is pisync's customType for the entries recovery synthesizes for gaps.
const Placeholder = "pisync.placeholder"

// IsPlaceholder reports whether e is one of recovery's placeholders.
func (e *Entry) IsPlaceholder() bool { return e.Type == "custom" && e.CustomType == Placeholder }

// MessagesMentioning lists the indices of context messages whose JSON contains s.
func (c *Context) MessagesMentioning(s string) []int {
	var out []int
	for i, m := range c.Messages {
		if strings.Contains(string(m), s) {
			out = append(out, i)
		}
	}
	return out
}
