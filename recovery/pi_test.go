package recovery

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/pitest"
)

// TestRebuiltFilesOpenInPi loads every rebuilt golden file that Pi's harness can read
// with the harness itself (conformance/pihelper, all in one Node process): it must open,
// land on the leaf the report computed, and read the file's entries as written. Like the
// rest of the real-Pi suite it runs wherever node is installed (installing the helper's
// packages with npm ci on first use), skips otherwise, and fails under CI=true.
func TestRebuiltFilesOpenInPi(t *testing.T) {
	pi := pitest.New(t)
	// raw_lines keeps a malformed line and v1 files are not version 3: the harness
	// refuses both, by design.
	names := []string{"complete", "missing_middle", "missing_first", "missing_leaf_target",
		"two_children_missing_parent", "three_consecutive_missing", "missing_header", "missing_header_no_head",
		"raw_dropped", "dangling_complete", "conflicts", "blob", "generations"}
	output := func(name string) string { return filepath.Join("testdata", "golden", name, "output.jsonl") }
	var reqs []pitest.DumpRequest
	for _, name := range names {
		reqs = append(reqs, pitest.DumpRequest{Path: output(name), Loader: "harness"})
	}
	dumps := pi.DumpMany(t, reqs)

	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			var rep Report
			b, err := os.ReadFile(filepath.Join("testdata", "golden", name, "report.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &rep); err != nil {
				t.Fatal(err)
			}
			res := dumps[output(name)]
			if res.Error != "" {
				t.Fatalf("Pi refused the rebuilt file: %s", res.Error)
			}
			if leaf := res.Dump.Leaf(); leaf != rep.Leaf {
				t.Errorf("Pi's leaf %q, recovery computed %q", leaf, rep.Leaf)
			}
			placeholders := map[string]bool{}
			for _, p := range rep.Placeholders {
				placeholders[p.ID] = true
			}
			var got []map[string]any
			for _, e := range res.Dump.Entries {
				if placeholders[e.ID] {
					continue
				}
				var m map[string]any
				if err := json.Unmarshal(e.Raw, &m); err != nil {
					t.Fatal(err)
				}
				got = append(got, m)
			}
			var want []map[string]any
			for _, l := range mirrortest.ReadLines(t, output(name))[1:] {
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
