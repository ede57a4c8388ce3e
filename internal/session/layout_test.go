package session

import (
	"strings"
	"testing"
)

func TestDirName(t *testing.T) {
	tests := []struct{ cwd, want string }{
		{"/home/ana/proj", "--home-ana-proj--"},
		{"/", "----"},
		{"", "----"},
		{"//srv", "---srv--"}, // only one leading separator is dropped
		{`C:\Users\bo\proj`, "--C--Users-bo-proj--"},
		{`\\server\share`, "---server-share--"},
		{"/a:b/c-d/é ü", "--a-b-c-d-é ü--"},
		{"relative/dir", "--relative-dir--"},
		{"/trailing/", "--trailing---"},
	}
	for _, tt := range tests {
		if got := DirName(tt.cwd); got != tt.want {
			t.Errorf("DirName(%q) = %q, want %q", tt.cwd, got, tt.want)
		}
	}
}

func TestFileName(t *testing.T) {
	tests := []struct{ ts, id, want string }{
		{"2026-01-05T10:00:00.000Z", "0199a3c2-7d4e-7b6a-9f10-2c3d4e5f6a7b", "2026-01-05T10-00-00-000Z_0199a3c2-7d4e-7b6a-9f10-2c3d4e5f6a7b.jsonl"},
		{"", "x", "_x.jsonl"},
		{"a.b:c", "", "a-b-c_.jsonl"},
	}
	for _, tt := range tests {
		if got := FileName(tt.ts, tt.id); got != tt.want {
			t.Errorf("FileName(%q, %q) = %q, want %q", tt.ts, tt.id, got, tt.want)
		}
	}
}

func TestIsFileName(t *testing.T) {
	const id = "0199a3c2-7d4e-7b6a-9f10-2c3d4e5f6a7b"
	tests := []struct {
		name     string
		session  bool // IsFileName
		ofID     bool // IsFileNameOf(name, id)
		whyNotOf string
	}{
		{FileName("2026-01-05T10:00:00.000Z", id), true, true, ""},
		{"--home-ana-p--/" + FileName("2026-01-05T10:00:00.000Z", id), true, true, ""}, // a path
		{"x_" + id + ".jsonl", true, true, ""},                                         // another clock's name
		{"notes.jsonl", true, false, "no id"},
		{FileName("2026-01-05T10:00:00.000Z", "other"), true, false, "another id"},
		{id + ".jsonl", true, false, "no '_' before the id"},
		{"s.jsonl.pisync-0a1b2c.tmp", false, false, "recovery's temporary file"},
		{"s.json", false, false, "not .jsonl"},
		{"s.JSONL", false, false, "case counts"},
		{"", false, false, "empty"},
	}
	for _, tt := range tests {
		if got := IsFileName(tt.name); got != tt.session {
			t.Errorf("IsFileName(%q) = %v, want %v", tt.name, got, tt.session)
		}
		if got := IsFileNameOf(tt.name, id); got != tt.ofID {
			t.Errorf("IsFileNameOf(%q) = %v, want %v (%s)", tt.name, got, tt.ofID, tt.whyNotOf)
		}
	}
}

func TestCwdFromDirName(t *testing.T) {
	tests := []struct {
		name, want string
		ok         bool
	}{
		{"--home-ana-proj--", "/home/ana/proj", true},
		{"----", "/", true},
		{"--my-app--", "/my/app", true}, // lossy: it may have been /my-app
		{"--C--Users-bo--", "/C//Users/bo", true},
		{"---", "", false},
		{"--abc", "", false},
		{"abc--", "", false},
		{"home-ana", "", false},
		{"", "", false},
		{"--a:b--", "", false},
		{`--a\b--`, "", false},
		{"--a/b--", "", false},
	}
	for _, tt := range tests {
		got, ok := CwdFromDirName(tt.name)
		if got != tt.want || ok != tt.ok {
			t.Errorf("CwdFromDirName(%q) = %q, %v; want %q, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

// TestDirNameRoundTrip pins the property that makes CwdFromDirName useful:
// whatever it guesses, Pi would have put that cwd's sessions in the same
// directory.
func TestDirNameRoundTrip(t *testing.T) {
	for _, name := range []string{"----", "-----", "--a--", "--a-b--c--", "--" + strings.Repeat("-", 9) + "--", "--é x--"} {
		cwd, ok := CwdFromDirName(name)
		if !ok {
			t.Fatalf("CwdFromDirName(%q) not ok", name)
		}
		if got := DirName(cwd); got != name {
			t.Errorf("DirName(CwdFromDirName(%q)) = %q", name, got)
		}
	}
	for _, cwd := range []string{"/home/ana/proj", "/", "/a/b/c"} {
		back, ok := CwdFromDirName(DirName(cwd))
		if !ok || back != cwd {
			t.Errorf("CwdFromDirName(DirName(%q)) = %q, %v", cwd, back, ok)
		}
	}
}
