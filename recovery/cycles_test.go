package recovery

import (
	"reflect"
	"testing"

	"github.com/pisync/pisync/internal/session"
)

func TestCycles(t *testing.T) {
	tests := []struct {
		name  string
		links [][2]string // id, parentId
		want  []string    // the details reported, in order
	}{
		{"a chain", [][2]string{{"a", ""}, {"b", "a"}, {"c", "b"}}, nil},
		{"a dangling parent", [][2]string{{"b", "x"}, {"c", "b"}}, nil},
		{"a self-loop", [][2]string{{"a", "a"}}, []string{"parentId links form a cycle: a → a"}},
		{"a tail into a cycle", [][2]string{{"t", "a"}, {"a", "b"}, {"b", "c"}, {"c", "a"}},
			[]string{"parentId links form a cycle: a → b → c → a"}},
		{"two cycles and a tree beside them", [][2]string{{"a", "b"}, {"b", "a"}, {"r", ""}, {"s", "r"}, {"x", "y"}, {"y", "z"}, {"z", "x"}, {"u", "s"}},
			[]string{"parentId links form a cycle: a → b → a", "parentId links form a cycle: x → y → z → x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body []Line
			for _, l := range tt.links {
				body = append(body, Line{HasEnv: true, Env: session.Envelope{Type: "message", ID: l[0], ParentID: l[1]}})
			}
			var got []string
			for _, c := range cycles(body, nil) {
				if c.Kind != ConflictCycle {
					t.Errorf("conflict of kind %v", c.Kind)
				}
				got = append(got, c.Detail)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("cycles: %q, want %q", got, tt.want)
			}
		})
	}
}
