package session

import (
	"bytes"
	"strings"
	"testing"
)

func TestReadLead(t *testing.T) {
	const (
		header = `{"type":"session","version":3,"id":"0199ffff-0000-7000-8000-000000000001","timestamp":"2026-12-05T14:00:00.000Z","cwd":"/w"}`
		title  = `{"type":"title","v":1,"title":"t"}`
		msg    = `{"type":"message","id":"a1b2c3d4","parentId":null,"message":{"role":"user","content":"hi"}}`
	)
	bigHeader := strings.Replace(header, `"/w"`, `"/`+strings.Repeat("w", LeadBytes)+`"`, 1)
	image := `{"type":"message","id":"a1b2c3d5","parentId":"a1b2c3d4","data":"` + strings.Repeat("A", LeadBytes) + `"}`
	half := `{"type":"message","id":"a1b2c3d6","data":"` + strings.Repeat("B", LeadBytes/2) + `"}`
	nineMsgs := strings.Repeat(msg+"\n", LeadLines+1)

	for _, tc := range []struct {
		name string
		file string
		want []string // each line's fate: its text, or "" for nil (there, too long to hold)
		more bool
	}{
		{"empty", "", nil, false},
		{"a torn first line is no line", header, nil, false},
		{"header and a torn tail", header + "\n" + msg, []string{header}, false},
		{"header and an entry", header + "\n" + msg + "\n", []string{header, msg}, false},
		{"LeadLines lines, then more", nineMsgs, strings.Split(strings.Repeat(msg+"\n", LeadLines), "\n")[:LeadLines], true},
		{"a header over LeadBytes is not held, the lines after it are",
			bigHeader + "\n" + msg + "\n", []string{"", msg}, false},
		{"a title, then a line past the budget ends the lead",
			title + "\n" + image + "\n" + header + "\n", []string{title, ""}, true},
		{"lines held up to the budget, the next one past it ends the lead",
			half + "\n" + half + "\n" + msg + "\n", []string{half, ""}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lb, err := ReadLead(strings.NewReader(tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if lb.More != tc.more {
				t.Errorf("More = %v, want %v", lb.More, tc.more)
			}
			if len(lb.Lines) != len(tc.want) {
				t.Fatalf("%d lines, want %d", len(lb.Lines), len(tc.want))
			}
			for i, w := range tc.want {
				switch got := lb.Lines[i]; {
				case w == "" && got != nil:
					t.Errorf("line %d held (%d bytes), want nil: too long to hold", i, len(got))
				case w != "" && !bytes.Equal(got, []byte(w)):
					t.Errorf("line %d = %.40q…, want %.40q…", i, got, w)
				}
			}
		})
	}
}

// A line a reader did not keep is nil, and does not count against the budget.
func TestLeadBufferLineNotKept(t *testing.T) {
	var b LeadBuffer
	if !b.Add(nil, 600<<10) || !b.Add([]byte("{}"), 2) {
		t.Fatal("the lead ended early")
	}
	if b.Lines[0] != nil || string(b.Lines[1]) != "{}" || b.More {
		t.Fatalf("lines %q, more %v", b.Lines, b.More)
	}
}
