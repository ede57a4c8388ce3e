package deploy

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The kit's YAML files are read with go.yaml.in/yaml/v3 (the YAML organisation's
// maintained yaml.v3) into plain trees: map[string]any, []any and strings. Scalars stay
// strings, as written, so that a test compares what the file says ("9470", "true")
// rather than what a decoder made of it; duplicate keys are refused, as Kubernetes and
// Prometheus refuse them.

// parseYAML parses every document of a file.
func parseYAML(src string) ([]any, error) {
	dec := yaml.NewDecoder(strings.NewReader(src))
	var docs []any
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(n.Content) == 0 {
			continue // an empty document
		}
		v, err := plain(n.Content[0])
		if err != nil {
			return nil, err
		}
		if v != nil {
			docs = append(docs, v)
		}
	}
}

// plain turns a node into map[string]any, []any or a string; null is nil.
func plain(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.AliasNode:
		return plain(n.Alias)
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return nil, nil
		}
		return n.Value, nil
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := plain(c)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.MappingNode:
		out := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			if _, dup := out[k]; dup {
				return nil, fmt.Errorf("line %d: key %q again", n.Content[i].Line, k)
			}
			v, err := plain(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			out[k] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("line %d: unexpected YAML node kind %v", n.Line, n.Kind)
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

// TestYAMLTree: the trees the deploy tests walk keep scalars as written, with every
// document of a file and block scalars as YAML defines them.
func TestYAMLTree(t *testing.T) {
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
on: true
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
		{str(d, "on"), "true"},
		{str(d, "empty"), ""},
		{str(docs[1], "second"), "doc"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	for _, bad := range []string{"a: b: c\n", "a: 1\na: 2\n", "a:\n\t- b\n", "a: [1, 2\n", "a: *x\n", "a: 1\n  b: 2\n"} {
		if _, err := parseYAML(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
