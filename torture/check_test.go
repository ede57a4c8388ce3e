package torture

import (
	"reflect"
	"testing"

	"github.com/pisync/pisync/mirror"
)

// TestPathFaults: a live path named by two heads of this host is a fault; a head marked
// LocalDeleted, of another host, or naming a path where no file lives is not, nor are
// copies under clash keys at paths of their own.
func TestPathFaults(t *testing.T) {
	head := func(key, root, source string) mirror.Head {
		return mirror.Head{Conversation: "s1", Key: key, Host: "h", Root: root, Source: source, Generation: 1, Entries: 3}
	}
	deleted := head("s1~2", "/r", "a.jsonl")
	deleted.LocalDeleted = true
	other := head("s1~2", "/r", "a.jsonl")
	other.Host = "elsewhere"
	live := map[string]bool{"/r/a.jsonl": true, "/r/b/c.jsonl": true}
	tests := []struct {
		name  string
		heads []mirror.Head
		want  []string
	}{
		{"one head per path", []mirror.Head{head("s1", "/r", "a.jsonl"), head("s1~2", "/r", "b/c.jsonl")}, nil},
		{"two heads name one live file", []mirror.Head{head("s1", "/r", "a.jsonl"), head("s1~2", "/r", "a.jsonl")},
			[]string{"/r/a.jsonl: named by 2 heads: s1 (generation 1, 3 entries), s1~2 (generation 1, 3 entries)"}},
		{"one of them marked deleted", []mirror.Head{head("s1", "/r", "a.jsonl"), deleted}, nil},
		{"one of them of another host", []mirror.Head{head("s1", "/r", "a.jsonl"), other}, nil},
		{"no live file at the path (moved out, removed)", []mirror.Head{head("s1", "/r", "gone.jsonl"), head("s1~2", "/r", "gone.jsonl")}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pathFaults(tt.heads, "h", live, func(p string) string { return p })
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("pathFaults = %q, want %q", got, tt.want)
			}
		})
	}
}
