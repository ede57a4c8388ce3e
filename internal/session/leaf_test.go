package session

import "testing"

func TestLeaf(t *testing.T) {
	msg := func(id string) Envelope { return Envelope{Type: "message", ID: id} }
	leaf := func(target string) Envelope { return Envelope{Type: "leaf", ID: "l-" + target, TargetID: target} }
	tests := []struct {
		name    string
		start   string
		entries []Envelope
		want    string
	}{
		{"no entries", "", nil, ""},
		{"linear", "", []Envelope{msg("u1"), msg("a1")}, "a1"},
		// DESIGN §1: u1,a1,u2,a2, leaf→u1, a3 opens on a3.
		{"design example", "", []Envelope{msg("u1"), msg("a1"), msg("u2"), msg("a2"), leaf("u1"), msg("a3")}, "a3"},
		{"ends on a leaf", "", []Envelope{msg("u1"), msg("a1"), leaf("u1")}, "u1"},
		{"leaf to null", "", []Envelope{msg("u1"), leaf("")}, ""},
		{"null then more", "", []Envelope{msg("u1"), leaf(""), msg("u2")}, "u2"},
		{"label moves the leaf to itself", "", []Envelope{msg("u1"), {Type: "label", ID: "lb", TargetID: "u1"}}, "lb"},
		{"v1 entries leave it unchanged", "", []Envelope{msg(""), msg("")}, ""},
		{"v1 entries after a checkpoint", "x", []Envelope{msg("")}, "x"},
		{"resumed from a checkpoint", "a2", []Envelope{leaf("u1")}, "u1"},
		{"unknown type with id", "", []Envelope{msg("u1"), {Type: "future", ID: "f1"}}, "f1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l Leaf
			l.Set(tt.start)
			for _, e := range tt.entries {
				l.Apply(e)
			}
			if got := l.ID(); got != tt.want {
				t.Errorf("leaf = %q, want %q", got, tt.want)
			}
		})
	}
}
