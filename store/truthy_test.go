package store_test

import (
	"encoding/json"
	"testing"

	"github.com/pisync/pisync/store"
)

// TestTruthyAsJavaScript: a JSON value is truthy as JavaScript's Boolean(JSON.parse(v)).
func TestTruthyAsJavaScript(t *testing.T) {
	cases := []struct {
		json string
		want bool
	}{
		{"", false}, {"null", false}, {"false", false}, {`""`, false},
		{"0", false}, {"-0", false}, {"0.0", false}, {"-0.0", false}, {"0e0", false}, {"0E+5", false}, {"-0.000e-3", false},
		{"true", true}, {"1", true}, {"-1", true}, {"0.5", true}, {"1e-400", false}, {"1e400", true},
		{`"0"`, true}, {`"false"`, true}, {`" "`, true}, {"[]", true}, {"{}", true},
	}
	for _, c := range cases {
		t.Run(c.json, func(t *testing.T) {
			if got := store.Truthy(json.RawMessage(c.json)); got != c.want {
				t.Fatalf("truthy(%s) = %v, want %v", c.json, got, c.want)
			}
		})
	}
}
