package deploy

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// No YAML library is a dependency of pisync, so the kit's YAML files are read with this
// small parser of the block-YAML subset they use: mappings, sequences, plain and quoted
// scalars, one-line flow collections, literal and folded block scalars, comments and
// "---" between documents. It refuses what it does not understand (anchors, aliases,
// tags, tabs, duplicate keys, a ": " inside a plain scalar) rather than guessing, so a
// file it accepts has one clear reading. Scalars stay strings.

type yamlLine struct {
	n      int // 1-based line number
	indent int
	text   string // without indentation; comments of comment-only lines removed
}

type yamlParser struct {
	lines  []yamlLine
	pos    int
	raw    []string // the document's lines
	offset int      // file line number of raw[0], minus 1
}

// parseYAML parses every document of a file.
func parseYAML(src string) ([]any, error) {
	var docs []any
	raw := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	start := 0
	for i := 0; i <= len(raw); i++ {
		if i < len(raw) && strings.TrimRight(raw[i], " ") != "---" {
			continue
		}
		doc, err := parseYAMLDoc(raw[start:i], start)
		if err != nil {
			return nil, err
		}
		if doc != nil {
			docs = append(docs, doc)
		}
		start = i + 1
	}
	return docs, nil
}

func parseYAMLDoc(raw []string, offset int) (any, error) {
	p := &yamlParser{raw: raw, offset: offset}
	for i, l := range raw {
		body := strings.TrimLeft(l, " ")
		if strings.HasPrefix(body, "\t") || strings.Contains(l[:len(l)-len(body)], "\t") {
			return nil, fmt.Errorf("line %d: tab in indentation", offset+i+1)
		}
		if body == "" || strings.HasPrefix(body, "#") {
			continue
		}
		p.lines = append(p.lines, yamlLine{n: offset + i + 1, indent: len(l) - len(body), text: strings.TrimRight(body, " ")})
	}
	if len(p.lines) == 0 {
		return nil, nil
	}
	v, err := p.node(p.lines[0].indent)
	if err != nil {
		return nil, err
	}
	if p.pos < len(p.lines) {
		return nil, fmt.Errorf("line %d: unexpected indentation", p.lines[p.pos].n)
	}
	return v, nil
}

func isSeqItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

// splitKey splits "key: value" (or "key:") of a mapping line; ok is false for a line that
// is not a mapping entry.
func splitKey(text string) (key, rest string, ok bool, err error) {
	if text[0] == '"' || text[0] == '\'' {
		end, err := quotedEnd(text)
		if err != nil {
			return "", "", false, err
		}
		k, err := unquote(text[:end])
		if err != nil {
			return "", "", false, err
		}
		after := strings.TrimLeft(text[end:], " ")
		if after == ":" || strings.HasPrefix(after, ": ") {
			return k, strings.TrimSpace(after[1:]), true, nil
		}
		return "", "", false, nil
	}
	if text[0] == '[' || text[0] == '{' {
		return "", "", false, nil
	}
	if strings.HasSuffix(text, ":") && !strings.Contains(text, ": ") {
		return text[:len(text)-1], "", true, nil
	}
	i := strings.Index(text, ": ")
	if i < 0 {
		return "", "", false, nil
	}
	if j := strings.Index(text, " #"); j >= 0 && j < i {
		return "", "", false, nil
	}
	return text[:i], strings.TrimSpace(text[i+2:]), true, nil
}

func (p *yamlParser) node(indent int) (any, error) {
	l := p.lines[p.pos]
	if isSeqItem(l.text) {
		return p.sequence(l.indent)
	}
	if _, _, ok, err := splitKey(l.text); err != nil {
		return nil, fmt.Errorf("line %d: %v", l.n, err)
	} else if ok {
		return p.mapping(l.indent)
	}
	p.pos++
	return scalarOrFlow(l.text, l.n)
}

func (p *yamlParser) mapping(indent int) (any, error) {
	m := map[string]any{}
	for p.pos < len(p.lines) {
		l := p.lines[p.pos]
		if l.indent < indent {
			break
		}
		if l.indent > indent {
			return nil, fmt.Errorf("line %d: unexpected indentation", l.n)
		}
		if isSeqItem(l.text) {
			break
		}
		key, rest, ok, err := splitKey(l.text)
		if err != nil || !ok {
			return nil, fmt.Errorf("line %d: want key: value, got %q (%v)", l.n, l.text, err)
		}
		if _, dup := m[key]; dup {
			return nil, fmt.Errorf("line %d: duplicate key %q", l.n, key)
		}
		p.pos++
		v, err := p.value(rest, indent, l.n, true)
		if err != nil {
			return nil, err
		}
		m[key] = v
	}
	return m, nil
}

// value parses what follows "key:" or "- " at parent indentation indent.
func (p *yamlParser) value(rest string, indent, n int, inMapping bool) (any, error) {
	if i := strings.Index(rest, " #"); i >= 0 && !strings.HasPrefix(rest, "\"") && !strings.HasPrefix(rest, "'") {
		rest = strings.TrimSpace(rest[:i])
	}
	if strings.HasPrefix(rest, "#") {
		rest = ""
	}
	switch {
	case rest == "":
		if p.pos < len(p.lines) {
			next := p.lines[p.pos]
			if next.indent > indent || (inMapping && next.indent == indent && isSeqItem(next.text)) {
				return p.node(next.indent)
			}
		}
		return "", nil // null
	case rest[0] == '|' || rest[0] == '>':
		return p.blockScalar(rest, indent, n)
	default:
		return scalarOrFlow(rest, n)
	}
}

func (p *yamlParser) sequence(indent int) (any, error) {
	var s []any
	for p.pos < len(p.lines) {
		l := p.lines[p.pos]
		if l.indent != indent || !isSeqItem(l.text) {
			if l.indent > indent {
				return nil, fmt.Errorf("line %d: unexpected indentation", l.n)
			}
			break
		}
		content := strings.TrimLeft(strings.TrimPrefix(l.text, "-"), " ")
		if content == "" {
			p.pos++
			v, err := p.value("", indent, l.n, false)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
			continue
		}
		col := indent + len(l.text) - len(content)
		if _, _, ok, err := splitKey(content); err != nil {
			return nil, fmt.Errorf("line %d: %v", l.n, err)
		} else if ok || isSeqItem(content) {
			// "- key: value": a mapping (or nested sequence) that starts on this line.
			p.lines[p.pos] = yamlLine{n: l.n, indent: col, text: content}
			v, err := p.node(col)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
			continue
		}
		p.pos++
		v, err := p.value(content, indent, l.n, false)
		if err != nil {
			return nil, err
		}
		s = append(s, v)
	}
	return s, nil
}

// blockScalar reads a literal (|) or folded (>) scalar from the raw lines.
func (p *yamlParser) blockScalar(header string, indent, n int) (any, error) {
	if len(header) > 2 || (len(header) == 2 && header[1] != '-' && header[1] != '+') {
		return nil, fmt.Errorf("line %d: block scalar header %q not supported", n, header)
	}
	var body []string
	blockIndent := -1
	for p.pos < len(p.lines) && p.lines[p.pos].indent > indent {
		l := p.lines[p.pos]
		if blockIndent < 0 {
			blockIndent = l.indent
		}
		body = append(body, strings.Repeat(" ", l.indent-blockIndent)+l.text)
		p.pos++
	}
	// Blank and comment-looking lines inside the block were dropped from p.lines: take
	// the block again from the raw text, from its first to its last line.
	if len(body) > 0 {
		first, last := p.lines[p.pos-len(body)].n, p.lines[p.pos-1].n
		body = body[:0]
		for ln := first; ln <= last; ln++ {
			r := p.raw[ln-p.offset-1]
			if strings.TrimSpace(r) == "" {
				body = append(body, "")
				continue
			}
			body = append(body, r[min(blockIndent, len(r)):])
		}
	}
	var text string
	if header[0] == '|' {
		text = strings.Join(body, "\n")
	} else {
		text = strings.Join(strings.Fields(strings.Join(body, " ")), " ")
	}
	if !strings.HasSuffix(header, "-") && text != "" {
		text += "\n"
	}
	return text, nil
}

func quotedEnd(s string) (int, error) {
	q := s[0]
	for i := 1; i < len(s); i++ {
		switch {
		case q == '"' && s[i] == '\\':
			i++
		case q == '\'' && s[i] == '\'' && i+1 < len(s) && s[i+1] == '\'':
			i++
		case s[i] == q:
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated quoted scalar %s", s)
}

func unquote(s string) (string, error) {
	if s[0] == '\'' {
		return strings.ReplaceAll(s[1:len(s)-1], "''", "'"), nil
	}
	return strconv.Unquote(s)
}

// scalarOrFlow parses a one-line scalar, or a flow sequence or mapping.
func scalarOrFlow(s string, n int) (any, error) {
	v, rest, err := flowValue(s, false)
	if err != nil {
		return nil, fmt.Errorf("line %d: %v", n, err)
	}
	if rest = strings.TrimSpace(rest); rest != "" && !strings.HasPrefix(rest, "#") {
		return nil, fmt.Errorf("line %d: unexpected %q after value", n, rest)
	}
	return v, nil
}

// flowValue parses one value from s; inFlow stops plain scalars at , ] }.
func flowValue(s string, inFlow bool) (any, string, error) {
	s = strings.TrimLeft(s, " ")
	if s == "" {
		return "", "", nil
	}
	switch s[0] {
	case '"', '\'':
		end, err := quotedEnd(s)
		if err != nil {
			return nil, "", err
		}
		v, err := unquote(s[:end])
		return v, s[end:], err
	case '[':
		var seq []any
		rest := strings.TrimLeft(s[1:], " ")
		for !strings.HasPrefix(rest, "]") {
			v, r, err := flowValue(rest, true)
			if err != nil {
				return nil, "", err
			}
			seq = append(seq, v)
			rest = strings.TrimLeft(r, " ")
			if strings.HasPrefix(rest, ",") {
				rest = strings.TrimLeft(rest[1:], " ")
			} else if !strings.HasPrefix(rest, "]") {
				return nil, "", fmt.Errorf("unterminated flow sequence %s", s)
			}
		}
		if seq == nil {
			seq = []any{}
		}
		return seq, rest[1:], nil
	case '{':
		m := map[string]any{}
		rest := strings.TrimLeft(s[1:], " ")
		for !strings.HasPrefix(rest, "}") {
			k, r, err := flowValue(rest, true)
			if err != nil {
				return nil, "", err
			}
			r = strings.TrimLeft(r, " ")
			if !strings.HasPrefix(r, ":") {
				return nil, "", fmt.Errorf("flow mapping entry without ':' in %s", s)
			}
			v, r2, err := flowValue(r[1:], true)
			if err != nil {
				return nil, "", err
			}
			key, _ := k.(string)
			if _, dup := m[key]; dup {
				return nil, "", fmt.Errorf("duplicate key %q", key)
			}
			m[key] = v
			rest = strings.TrimLeft(r2, " ")
			if strings.HasPrefix(rest, ",") {
				rest = strings.TrimLeft(rest[1:], " ")
			} else if !strings.HasPrefix(rest, "}") {
				return nil, "", fmt.Errorf("unterminated flow mapping %s", s)
			}
		}
		return m, rest[1:], nil
	case '&', '*', '!', '%', '@', '`', '|', '>':
		return nil, "", fmt.Errorf("%q: anchors, aliases, tags and reserved indicators are not supported", s)
	}
	end := len(s)
	if i := strings.Index(s, " #"); i >= 0 {
		end = i
	}
	if inFlow {
		if i := strings.IndexAny(s[:end], ",]}"); i >= 0 {
			end = i
		}
		if i := strings.Index(s[:end], ":"); i >= 0 && (i+1 == end || s[i+1] == ' ') {
			end = i
		}
	} else if strings.Contains(s[:end], ": ") {
		return nil, "", fmt.Errorf("%q: ': ' inside a plain scalar (quote it)", s)
	}
	return strings.TrimRight(s[:end], " "), s[end:], nil
}

// path walks a parsed document: keys for mappings, indexes for sequences.
func path(v any, keys ...any) (any, bool) {
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil, false
			}
			if v, ok = m[k]; !ok {
				return nil, false
			}
		case int:
			s, ok := v.([]any)
			if !ok || k >= len(s) {
				return nil, false
			}
			v = s[k]
		}
	}
	return v, true
}

func str(v any, keys ...any) string {
	x, _ := path(v, keys...)
	s, _ := x.(string)
	return s
}

func list(v any, keys ...any) []any {
	x, _ := path(v, keys...)
	s, _ := x.([]any)
	return s
}

func TestYAMLParser(t *testing.T) {
	src := `# comment
a: 1
b: "two: 2"
c:
  - x
  - "y # not a comment"
  - k: v
    l: [1, "2", three]
d:
- e: {f: g, "h": "i"}
lit: |
  line one

  line three
fold: >-
  folded
  text
empty:
---
second: doc
`
	docs, err := parseYAML(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 2 {
		t.Fatalf("%d documents", len(docs))
	}
	d := docs[0]
	for _, c := range []struct {
		got, want string
	}{
		{str(d, "a"), "1"},
		{str(d, "b"), "two: 2"},
		{str(d, "c", 0), "x"},
		{str(d, "c", 1), "y # not a comment"},
		{str(d, "c", 2, "k"), "v"},
		{str(d, "c", 2, "l", 2), "three"},
		{str(d, "d", 0, "e", "h"), "i"},
		{str(d, "lit"), "line one\n\nline three\n"},
		{str(d, "fold"), "folded text"},
		{str(d, "empty"), ""},
		{str(docs[1], "second"), "doc"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	for _, bad := range []string{"a: b: c\n", "a: 1\na: 2\n", "a: &x 1\n", "a:\n\t- b\n", "a: [1, 2\n", "a: *x\n", "a: 1\n  b: 2\n"} {
		if _, err := parseYAML(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
