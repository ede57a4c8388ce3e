package recovery

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/pisync/pisync/internal/session"
)

// stageFile stages a one-line file at rel under root, its line naming rel.
func stageFile(t *testing.T, root, rel string) *staged {
	t.Helper()
	line := []byte(fmt.Sprintf(`{"type":"session","id":%q}`, rel))
	plan := &Plan{Lines: []OutLine{{Data: line, SHA256: session.Digest(line), Size: int64(len(line))}}}
	s, err := stage(context.Background(), nil, target{root: root, rel: filepath.FromSlash(rel)}, plan)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// leftovers lists what is under root besides the directories and the files of want.
func leftovers(t *testing.T, root string, want map[string]bool) []string {
	t.Helper()
	var extra []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if !want[filepath.ToSlash(rel)] {
			extra = append(extra, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return extra
}

func TestCommitBatch(t *testing.T) {
	tests := []struct {
		name  string
		files []string
		block string // a target made a non-empty directory first: its rename fails
	}{
		{"one file", []string{"--a--/1.jsonl"}, ""},
		{"several directories, one new and nested", []string{"--a--/1.jsonl", "--a--/2.jsonl", "--b--/deep/3.jsonl", "--a--/4.jsonl"}, ""},
		{"a failed rename spares the others", []string{"--a--/1.jsonl", "--a--/2.jsonl", "--b--/3.jsonl"}, "--a--/2.jsonl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if tt.block != "" {
				if err := os.MkdirAll(filepath.Join(root, filepath.FromSlash(tt.block), "x"), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			batch := make([]*staged, len(tt.files))
			for i, rel := range tt.files {
				batch[i] = stageFile(t, root, rel)
			}
			errs := commitBatch(batch)
			placed := map[string]bool{}
			for i, rel := range tt.files {
				if rel == tt.block {
					if errs[i] == nil || !strings.Contains(errs[i].Error(), "rename into") {
						t.Errorf("%s: error %v, want a failed rename", rel, errs[i])
					}
					continue
				}
				if errs[i] != nil {
					t.Errorf("%s: %v", rel, errs[i])
					continue
				}
				placed[rel] = true
				got, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
				if err != nil {
					t.Fatal(err)
				}
				if want := fmt.Sprintf("{\"type\":\"session\",\"id\":%q}\n", rel); string(got) != want {
					t.Errorf("%s holds %q, want %q", rel, got, want)
				}
			}
			if extra := leftovers(t, root, placed); len(extra) > 0 {
				t.Errorf("left behind: %v", extra)
			}
			for _, s := range batch {
				if s.f != nil || s.made.root != nil {
					t.Errorf("%s: a descriptor is still open", s.t.rel)
				}
			}
		})
	}
}

// TestCommitterReportsEveryOutcome hands a committer more staged files than a batch
// holds, and outcomes without a file: each is reported once, with its file in place, and
// the committer's goroutine is gone after close.
func TestCommitterReportsEveryOutcome(t *testing.T) {
	// Only goroutines this test starts: earlier tests' blob uploads leave nats.go's
	// resetPendingAcksOnReconnect behind (v1.55.0, see publisher's TestMain).
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	root := t.TempDir()
	r := New(nil, Options{Out: root})
	n := 3*maxCommitBatch + 5
	reports := make([]Report, n)
	c := r.startCommitter(reports)
	for i := range n {
		rel := fmt.Sprintf("--p%d--/%d.jsonl", i%3, i)
		if i%7 == 0 {
			c.add(i, outcome{rep: Report{Key: rel, Result: Unchanged}})
			continue
		}
		c.add(i, outcome{rep: Report{Key: rel, Result: Written}, staged: stageFile(t, root, rel)})
	}
	c.close()
	placed := map[string]bool{}
	for i, rep := range reports {
		rel := fmt.Sprintf("--p%d--/%d.jsonl", i%3, i)
		want := Written
		if i%7 == 0 {
			want = Unchanged
		} else {
			placed[rel] = true
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel))); err != nil {
				t.Errorf("%s: %v", rel, err)
			}
		}
		if rep.Key != rel || rep.Result != want {
			t.Errorf("report %d: %s %s (%s), want %s %s", i, rep.Key, rep.Result, rep.Reason, rel, want)
		}
	}
	if extra := leftovers(t, root, placed); len(extra) > 0 {
		t.Errorf("left behind: %v", extra)
	}
}
