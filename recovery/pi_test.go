package recovery

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// pihelper is the conformance helper that loads a file with Pi's own code.
var pihelper = filepath.Join("..", "conformance", "pihelper", "pihelper.mjs")

// TestRebuiltFilesOpenInPi loads every rebuilt golden file that Pi's harness can read
// with the harness itself (conformance/pihelper): it must open, land on the leaf the
// report computed, and read the file's entries as written. It is skipped where node or
// the helper's modules are not installed.
func TestRebuiltFilesOpenInPi(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(pihelper), "node_modules", "@earendil-works", "pi-agent-core")); err != nil {
		t.Skip("pihelper's modules not installed (npm ci in conformance/pihelper)")
	}
	// raw_lines keeps a malformed line and v1 files are not version 3: the harness
	// refuses both, by design.
	for _, name := range []string{"complete", "missing_middle", "missing_first", "missing_leaf_target",
		"two_children_missing_parent", "three_consecutive_missing", "missing_header", "missing_header_no_head",
		"raw_dropped", "dangling_complete", "conflicts", "blob", "generations"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each case starts node
			dir := filepath.Join("testdata", "golden", name)
			var rep Report
			b, err := os.ReadFile(filepath.Join(dir, "report.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &rep); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, pihelper, "dump", filepath.Join(dir, "output.jsonl"))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("Pi refused the rebuilt file: %v: %s", err, stderr.String())
			}
			var dump struct {
				Entries []map[string]any `json:"entries"`
				LeafID  *string          `json:"leafId"`
			}
			if err := json.Unmarshal(out, &dump); err != nil {
				t.Fatal(err)
			}
			if leaf := deref(dump.LeafID); leaf != rep.Leaf {
				t.Errorf("Pi's leaf %q, recovery computed %q", leaf, rep.Leaf)
			}
			placeholders := map[string]bool{}
			for _, p := range rep.Placeholders {
				placeholders[p.ID] = true
			}
			var got []map[string]any
			for _, e := range dump.Entries {
				if id, _ := e["id"].(string); !placeholders[id] {
					got = append(got, e)
				}
			}
			var want []map[string]any
			for _, l := range readLines(t, filepath.Join(dir, "output.jsonl"))[1:] {
				var e map[string]any
				if err := json.Unmarshal(l, &e); err != nil {
					t.Fatal(err)
				}
				if id, _ := e["id"].(string); !placeholders[id] {
					want = append(want, e)
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Pi's entries differ from the rebuilt file's")
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
