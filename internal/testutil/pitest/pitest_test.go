package pitest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Skipf and Fatalf instead of stopping.
type recorder struct {
	testing.TB
	skipped, fatal string
}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
}

func TestSetupFailureSkipsOutsideCIAndFailsInCI(t *testing.T) {
	missing := errors.New("node is not installed")
	for _, c := range []struct {
		name      string
		ci        string
		skip      bool
		wantFatal bool
	}{
		{"no node, local", "", true, false},
		{"no node, CI", "true", true, true},
		{"failed install, local", "false", false, false},
		{"failed install, CI", "1", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("CI", c.ci)
			r := &recorder{TB: t}
			if h := checkSetup(r, nil, c.skip, missing); h != nil {
				t.Fatal("a helper despite the error")
			}
			if got := r.fatal != ""; got != c.wantFatal || (r.skipped != "") == c.wantFatal {
				t.Errorf("fatal %q, skipped %q; want fatal: %v", r.fatal, r.skipped, c.wantFatal)
			}
			if !strings.Contains(r.fatal+r.skipped, missing.Error()) {
				t.Errorf("the message does not say why: %q", r.fatal+r.skipped)
			}
		})
	}
	h := &Helper{Node: "node"}
	if got := checkSetup(&recorder{TB: t}, h, false, nil); got != h {
		t.Error("no error: want the helper")
	}
}

func TestNormalizeIDs(t *testing.T) {
	a := `{"entries":[{"id":"aa11","parentId":null},{"id":"bb22","parentId":"aa11","firstKeptEntryId":"aa11","n":1.50}],"labels":{"bb22":"x"},"leafId":"bb22","text":"aa11 in prose"}`
	b := `{"entries":[{"id":"cc33","parentId":null},{"id":"dd44","parentId":"cc33","firstKeptEntryId":"cc33","n":1.50}],"labels":{"dd44":"x"},"leafId":"dd44","text":"aa11 in prose"}`
	na, err := NormalizeIDs(json.RawMessage(a))
	if err != nil {
		t.Fatal(err)
	}
	nb, err := NormalizeIDs(json.RawMessage(b))
	if err != nil {
		t.Fatal(err)
	}
	if string(na) != string(nb) {
		t.Errorf("same shape, other ids:\n%s\n%s", na, nb)
	}
	if !strings.Contains(string(na), `"n":1.50`) || !strings.Contains(string(na), `"labels":{"#1":"x"}`) {
		t.Errorf("normalized: %s", na)
	}
	c := strings.Replace(b, `"x"`, `"y"`, 1)
	nc, _ := NormalizeIDs(json.RawMessage(c))
	if string(na) == string(nc) {
		t.Error("a real difference vanished")
	}
}

func TestDiffDumps(t *testing.T) {
	want := `{"context":{"messages":[{"role":"user"},{"role":"assistant"}],"model":"m"},"entries":[{"id":"a"},{"id":"b"}],"leafId":"b"}`
	if d := DiffDumps(json.RawMessage(want), json.RawMessage(want)); d != nil {
		t.Errorf("equal dumps: %v", d)
	}
	got := `{"context":{"messages":[{"role":"user"}],"model":"m2"},"entries":[{"id":"a"},{"id":"c"}],"leafId":"c"}`
	d := strings.Join(DiffDumps(json.RawMessage(want), json.RawMessage(got)), "\n")
	for _, s := range []string{`context.messages: want 2, got 1`, `context.model: want "m", got "m2"`,
		`entries[1]: want {"id":"b"}, got {"id":"c"}`, `leafId: want "b", got "c"`} {
		if !strings.Contains(d, s) {
			t.Errorf("diff lacks %q:\n%s", s, d)
		}
	}
}
