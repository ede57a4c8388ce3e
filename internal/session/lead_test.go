package session

import (
	"strings"
	"testing"
)

func TestIdentify(t *testing.T) {
	const (
		name   = "2026-12-05T14-00-00-000Z_0199ffff-0000-7000-8000-000000000001.jsonl"
		header = `{"type":"session","version":3,"id":"0199ffff-0000-7000-8000-000000000001","timestamp":"2026-12-05T14:00:00.000Z","cwd":"/w"}`
		title  = `{"type":"title","v":1,"title":"t","source":"auto","updatedAt":"2025-01-01T00:00:00Z","pad":"    "}`
		msg    = `{"type":"message","id":"a1b2c3d4","parentId":null,"timestamp":"2026-12-05T14:00:01.000Z","message":{"role":"user","content":"hi"}}`
		msg2   = `{"type":"message","id":"a1b2c3d5","parentId":"a1b2c3d4","timestamp":"2026-12-05T14:00:02.000Z","message":{"role":"assistant","content":[]}}`
		v1msg  = `{"type":"message","timestamp":"2026-12-05T14:00:01.000Z","message":{"role":"user","content":"hi"}}`
	)
	many := func(l string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = l
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		file     string
		lines    []string
		more     bool
		kind     LeadKind
		headerAt int
		reason   string
		id       string
	}{
		{"Pi's file: header first", name, []string{header, msg}, false, LeadHeader, 0, "", "0199ffff-0000-7000-8000-000000000001"},
		{"header alone", name, []string{header}, false, LeadHeader, 0, "", "0199ffff-0000-7000-8000-000000000001"},
		{"oh-my-pi: title before the header (Pi #8880)", name, []string{title, header, msg}, false, LeadHeader, 1, "", "0199ffff-0000-7000-8000-000000000001"},
		{"title, blank line, header", name, []string{title, "", header}, false, LeadHeader, 2, "", "0199ffff-0000-7000-8000-000000000001"},
		{"title alone: the header comes next", name, []string{title}, false, LeadWait, -1, "", ""},
		{"empty", name, nil, false, LeadWait, -1, "", ""},
		{"headerless: recreated after a delete (Pi #8939)", name, []string{msg, msg2}, false, LeadHeaderless, -1, "", "0199ffff-0000-7000-8000-000000000001"},
		{"headerless v1 entries", name, []string{v1msg}, false, LeadHeaderless, -1, "", "0199ffff-0000-7000-8000-000000000001"},
		{"title then entries, no header", name, []string{title, msg}, false, LeadHeaderless, -1, "", "0199ffff-0000-7000-8000-000000000001"},
		{"title then a line too long to hold (an image)", name, []string{title, "\x00nil"}, true, LeadHeaderless, -1, "", "0199ffff-0000-7000-8000-000000000001"},
		{"a torn header glued to an entry, then entries", name, []string{`{"type":"sess` + msg, msg2}, false, LeadHeaderless, -1, "", "0199ffff-0000-7000-8000-000000000001"},
		{"header after the first lines' bound", name, append(many(title, LeadLines), header), true, LeadNotSession, -1, ReasonNotEntries, ""},
		{"only titles up to the bound", name, many(title, LeadLines), false, LeadNotSession, -1, ReasonNotEntries, ""},
		{"headerless under a name without an id", "notes.jsonl", []string{msg}, false, LeadNotSession, -1, ReasonNoID, ""},
		{"a log of events", name, []string{`{"event":"start","n":1}`, `{"event":"stop"}`}, false, LeadNotSession, -1, ReasonNotEntries, ""},
		{"not JSON at all", name, []string{"hello world", "second line"}, false, LeadNotSession, -1, ReasonNotJSON, ""},
		{"NDJSON of another tool", "events.jsonl", []string{`{"type":"event","data":"not a session"}`}, false, LeadNotSession, -1, ReasonNotEntries, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lines [][]byte
			for _, l := range tc.lines {
				if l == "\x00nil" {
					lines = append(lines, nil) // too long to hold
					continue
				}
				lines = append(lines, []byte(l))
			}
			got := Identify(tc.file, lines, tc.more)
			if got.Kind != tc.kind || got.HeaderAt != tc.headerAt || got.Reason != tc.reason || got.Header.ID != tc.id {
				t.Errorf("got %s at %d reason %q id %q; want %s at %d reason %q id %q",
					got.Kind, got.HeaderAt, got.Reason, got.Header.ID, tc.kind, tc.headerAt, tc.reason, tc.id)
			}
			wantFormat := FormatV3
			if strings.Contains(tc.name, "v1") {
				wantFormat = FormatV1
			}
			if got.Kind == LeadHeaderless && (got.Header.Timestamp != "2026-12-05T14:00:00.000Z" || got.Header.Format != wantFormat) {
				t.Errorf("headerless header %+v", got.Header)
			}
		})
	}
}

func TestParseFileName(t *testing.T) {
	for _, tc := range []struct {
		name, id, ts string
		ok           bool
	}{
		{"2026-12-05T14-00-00-000Z_abc.jsonl", "abc", "2026-12-05T14:00:00.000Z", true},
		{"2026-12-05T14-00-00Z_abc.jsonl", "abc", "2026-12-05T14:00:00Z", true},
		{"whatever_abc.jsonl", "abc", "", true},
		{"abc.jsonl", "", "", false},
		{"x_.jsonl", "", "", false},
		{"x_a_b.jsonl", "", "", false},
		{"x_..%2f.jsonl", "", "", false},
		{"2026-12-05T14-00-00-000Z_abc.json", "", "", false},
	} {
		id, ts, ok := ParseFileName(tc.name)
		if id != tc.id || ts != tc.ts || ok != tc.ok {
			t.Errorf("%s: %q %q %v; want %q %q %v", tc.name, id, ts, ok, tc.id, tc.ts, tc.ok)
		}
	}
	// FileName and ParseFileName agree.
	ts := "2026-12-05T14:00:00.123Z"
	if id, got, ok := ParseFileName(FileName(ts, "0199ffff")); !ok || id != "0199ffff" || got != ts || strings.Contains(got, "-00-") {
		t.Errorf("round trip: %q %q %v", id, got, ok)
	}
}

func FuzzIdentify(f *testing.F) {
	f.Add("2026-12-05T14-00-00-000Z_abc.jsonl", `{"type":"title"}`, `{"type":"session","id":"abc"}`, false)
	f.Add("x_abc.jsonl", `{"type":"message","id":"a"}`, ``, true)
	f.Add("n.jsonl", `not json`, `{"type":"leaf","id":"b","targetId":null}`, false)
	f.Fuzz(func(t *testing.T, name, a, b string, more bool) {
		l := Identify(name, [][]byte{[]byte(a), []byte(b)}, more)
		switch l.Kind {
		case LeadHeader:
			if l.HeaderAt < 0 || l.HeaderAt > 1 || l.Header.ID == "" {
				t.Fatalf("header lead %+v", l)
			}
		case LeadHeaderless:
			if id, _, ok := ParseFileName(name); !ok || id != l.Header.ID || l.HeaderAt != -1 {
				t.Fatalf("headerless lead %+v of %q", l, name)
			}
		case LeadNotSession:
			if l.Reason == "" {
				t.Fatal("not a session without a reason")
			}
		}
	})
}
