package session

import (
	"strings"
	"testing"
)

func TestScanEnvelopePrefix(t *testing.T) {
	big := `{"type":"message","id":"a1b2c3d4","parentId":"00ff00ff","timestamp":"2026-01-01T00:00:00.000Z","message":{"role":"user","content":[{"type":"image","data":"` + strings.Repeat("QUJD", 1000)
	tests := []struct {
		name   string
		prefix string
		want   Envelope
		ok     bool
	}{
		{"pi order, payload cut", big[:300], Envelope{Type: "message", ID: "a1b2c3d4", ParentID: "00ff00ff", Timestamp: "2026-01-01T00:00:00.000Z"}, true},
		{"cut inside the id", big[:30], Envelope{Type: "message"}, true},
		{"null parent", `{"type":"message","id":"x","parentId":null,"message":{"a`, Envelope{Type: "message", ID: "x"}, true},
		{"leaf", `{"type":"leaf","id":"n1","parentId":"a2","timestamp":"t","targetId":"u1"`, Envelope{Type: "leaf", ID: "n1", ParentID: "a2", TargetID: "u1", Timestamp: "t"}, true},
		{"type cut", `{"type":"mess`, Envelope{}, false},
		{"payload first", `{"message":{"content":"` + strings.Repeat("x", 50), Envelope{}, false},
		{"not an object", `["type","message"]`, Envelope{}, false},
		{"id not a string", `{"type":"message","id":7,"message":`, Envelope{}, false},
		{"complete line", `{"type":"custom","id":"c1","parentId":"p"}`, Envelope{Type: "custom", ID: "c1", ParentID: "p"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ScanEnvelopePrefix([]byte(tt.prefix))
			if ok != tt.ok || got != tt.want {
				t.Errorf("ScanEnvelopePrefix = %+v, %v; want %+v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

// FuzzScanEnvelopePrefix: on any prefix of a valid entry, the prefix scanner agrees with
// ScanEntry on every field it returns, and never panics on garbage.
func FuzzScanEnvelopePrefix(f *testing.F) {
	f.Add(`{"type":"message","id":"a1","parentId":null,"message":{"x":1}}`, 20)
	f.Add(`{"type":"leaf","id":"n","parentId":"p","targetId":"t"}`, 40)
	f.Fuzz(func(t *testing.T, line string, cut int) {
		full, err := ScanEntry([]byte(line))
		if cut < 0 || cut > len(line) {
			cut = len(line)
		}
		got, ok := ScanEnvelopePrefix([]byte(line[:cut]))
		if err != nil || !ok {
			return
		}
		if got.Type != full.Type {
			t.Fatalf("type %q, ScanEntry %q", got.Type, full.Type)
		}
		for _, p := range [][2]string{{got.ID, full.ID}, {got.ParentID, full.ParentID}, {got.TargetID, full.TargetID}} {
			if p[0] != "" && p[0] != p[1] {
				t.Fatalf("prefix scan %q, ScanEntry %q", p[0], p[1])
			}
		}
	})
}
