package recovery

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// checkGolden compares got with the golden file, or rewrites it under -update.
func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./recovery -run %s -update to create it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (-update rewrites it):\n--- got\n%s\n--- want\n%s", filepath.Base(path), got, want)
	}
}

// reportJSON is the golden form of a report: indented, with the test's temporary
// directory replaced so that it does not depend on the machine.
func reportJSON(t testing.TB, r Report, tmp string) []byte {
	t.Helper()
	if tmp != "" {
		r.Output = strings.ReplaceAll(r.Output, tmp, "$OUT")
		r.Reason = strings.ReplaceAll(r.Reason, tmp, "$OUT")
	}
	// Storage times are the mirror's clock: the golden files keep their order only.
	r.History = slices.Clone(r.History)
	for i := range r.History {
		at := time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC)
		r.History[i].First, r.History[i].Last = at, at
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// sameSet reports whether got and want hold the same values, repeats aside.
func sameSet[T comparable](got, want []T) bool {
	g, w := map[T]bool{}, map[T]bool{}
	for _, v := range got {
		g[v] = true
	}
	for _, v := range want {
		w[v] = true
	}
	if len(g) != len(w) {
		return false
	}
	for v := range w {
		if !g[v] {
			return false
		}
	}
	return true
}
