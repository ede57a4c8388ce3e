package session

import (
	"errors"
	"strings"
	"testing"
)

func TestScanEntry(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Envelope
	}{
		// A quote's borrow flags a '#' above it, a backslash's a ']' (specialMask): the
		// string scan must use only the lowest flag of a word.
		{"borrow neighbours", `{"id":"0123456789\"#########\\]]]]]]]]]]]\n","type":"a","timestamp":"\"#\"#\"#\"#"}`,
			Envelope{Type: "a", ID: `0123456789"#########\]]]]]]]]]]]` + "\n", Timestamp: `"#"#"#"#`}},
		// Every entry type of DESIGN §1.
		{"message user", `{"type":"message","id":"a1b2c3d4","parentId":null,"timestamp":"2026-01-05T10:00:00.000Z","message":{"role":"user","content":"hi"}}`,
			Envelope{Type: "message", ID: "a1b2c3d4", Timestamp: "2026-01-05T10:00:00.000Z"}},
		{"message assistant", `{"type":"message","id":"b","parentId":"a","timestamp":"t","message":{"role":"assistant","content":[{"type":"toolCall","id":"call_1","arguments":{"id":"x"}}]}}`,
			Envelope{Type: "message", ID: "b", ParentID: "a", Timestamp: "t"}},
		{"message toolResult", `{"type":"message","id":"c","parentId":"b","timestamp":"t","message":{"role":"toolResult","toolCallId":"call_1","content":[],"isError":false}}`,
			Envelope{Type: "message", ID: "c", ParentID: "b", Timestamp: "t"}},
		{"message bashExecution", `{"type":"message","id":"d","parentId":"c","timestamp":"t","message":{"role":"bashExecution","command":"ls","exitCode":0}}`,
			Envelope{Type: "message", ID: "d", ParentID: "c", Timestamp: "t"}},
		{"message custom", `{"type":"message","id":"e","parentId":"d","timestamp":"t","message":{"role":"custom","customType":"x","display":true}}`,
			Envelope{Type: "message", ID: "e", ParentID: "d", Timestamp: "t"}},
		{"message branchSummary", `{"type":"message","id":"e","parentId":"d","timestamp":"t","message":{"role":"branchSummary","summary":"s","fromId":"q"}}`,
			Envelope{Type: "message", ID: "e", ParentID: "d", Timestamp: "t"}},
		{"message compactionSummary", `{"type":"message","id":"e","parentId":"d","timestamp":"t","message":{"role":"compactionSummary","summary":"s","tokensBefore":1}}`,
			Envelope{Type: "message", ID: "e", ParentID: "d", Timestamp: "t"}},
		{"thinking_level_change", `{"type":"thinking_level_change","id":"f","parentId":"e","timestamp":"t","thinkingLevel":"high"}`,
			Envelope{Type: "thinking_level_change", ID: "f", ParentID: "e", Timestamp: "t"}},
		{"model_change", `{"type":"model_change","id":"f","parentId":"e","timestamp":"t","provider":"p","modelId":"m"}`,
			Envelope{Type: "model_change", ID: "f", ParentID: "e", Timestamp: "t"}},
		{"active_tools_change", `{"type":"active_tools_change","id":"f","parentId":"e","timestamp":"t","tools":["read"]}`,
			Envelope{Type: "active_tools_change", ID: "f", ParentID: "e", Timestamp: "t"}},
		{"compaction", `{"type":"compaction","id":"f","parentId":"e","timestamp":"t","summary":"s","firstKeptEntryId":"a","tokensBefore":10,"details":{"id":"no"}}`,
			Envelope{Type: "compaction", ID: "f", ParentID: "e", Timestamp: "t"}},
		{"branch_summary", `{"type":"branch_summary","id":"f","parentId":"e","timestamp":"t","fromId":"a","summary":"s"}`,
			Envelope{Type: "branch_summary", ID: "f", ParentID: "e", Timestamp: "t"}},
		{"custom", `{"type":"custom","id":"f","parentId":"e","timestamp":"t","customType":"c","data":{"type":"inner","id":"inner","parentId":"inner","targetId":"inner"}}`,
			Envelope{Type: "custom", ID: "f", ParentID: "e", Timestamp: "t"}},
		{"custom_message", `{"type":"custom_message","id":"f","parentId":"e","timestamp":"t","customType":"c","content":"x","display":false}`,
			Envelope{Type: "custom_message", ID: "f", ParentID: "e", Timestamp: "t"}},
		{"label", `{"type":"label","id":"f","parentId":"e","timestamp":"t","targetId":"a","label":"bookmark"}`,
			Envelope{Type: "label", ID: "f", ParentID: "e", TargetID: "a", Timestamp: "t"}},
		{"session_info", `{"type":"session_info","id":"f","parentId":"e","timestamp":"t","name":"n"}`,
			Envelope{Type: "session_info", ID: "f", ParentID: "e", Timestamp: "t"}},
		{"leaf", `{"type":"leaf","id":"f","parentId":"e","timestamp":"t","targetId":"a"}`,
			Envelope{Type: "leaf", ID: "f", ParentID: "e", TargetID: "a", Timestamp: "t"}},
		{"leaf to null", `{"type":"leaf","id":"f","parentId":"e","timestamp":"t","targetId":null}`,
			Envelope{Type: "leaf", ID: "f", ParentID: "e", Timestamp: "t"}},
		{"unknown type carried", `{"type":"future_thing","id":"f","parentId":"e","timestamp":"t","x":[1,2,{"y":null}]}`,
			Envelope{Type: "future_thing", ID: "f", ParentID: "e", Timestamp: "t"}},
		{"v1 entry", `{"type":"message","timestamp":"t","message":{"role":"user","content":"hi"}}`,
			Envelope{Type: "message", Timestamp: "t"}},
		{"type only", `{"type":"x"}`, Envelope{Type: "x"}},
		{"header line scans too", `{"type":"session","version":3,"id":"abc","timestamp":"t","cwd":"/p"}`,
			Envelope{Type: "session", ID: "abc", Timestamp: "t"}},

		// Where keys are.
		{"keys in any order", `{"timestamp":"t","targetId":"g","parentId":"p","id":"i","type":"leaf"}`,
			Envelope{Type: "leaf", ID: "i", ParentID: "p", TargetID: "g", Timestamp: "t"}},
		{"nested keys first", `{"message":{"id":"n","type":"n","parentId":"n"},"payload":[{"id":"n"}],"type":"message","id":"real"}`,
			Envelope{Type: "message", ID: "real"}},
		{"key names as values", `{"type":"id","x":"parentId","id":"type"}`, Envelope{Type: "id", ID: "type"}},
		{"duplicate key, last wins", `{"type":"a","id":"1","id":"2","type":"b"}`, Envelope{Type: "b", ID: "2"}},
		{"duplicate id, non-string first", `{"type":"a","id":5,"id":"2"}`, Envelope{Type: "a", ID: "2"}},
		{"duplicate parentId, null last", `{"type":"a","parentId":"p","parentId":null}`, Envelope{Type: "a"}},
		{"escaped key name", `{"\u0074ype":"a","\u0069d":"x","parent\u0049d":"p"}`, Envelope{Type: "a", ID: "x", ParentID: "p"}},
		{"similar key names", `{"type":"a","Id":"x","ID":"x","ids":"x","i":"x","parentid":"x","targetID":"x","time":"x"}`, Envelope{Type: "a"}},
		{"non-string timestamp ignored", `{"type":"a","timestamp":1767607200000}`, Envelope{Type: "a"}},
		{"empty id", `{"type":"a","id":""}`, Envelope{Type: "a"}},

		// Strings.
		{"escapes", `{"type":"a\"b\\c\/d\b\f\n\r\t","id":"x"}`, Envelope{Type: "a\"b\\c/d\b\f\n\r\t", ID: "x"}},
		{"unicode escape", `{"type":"\u00e9\u4e2d","id":"\u0041"}`, Envelope{Type: "é中", ID: "A"}},
		{"surrogate pair", `{"type":"\ud83d\ude00","id":"x"}`, Envelope{Type: "😀", ID: "x"}},
		{"uppercase hex", `{"type":"\uD83D\uDE00"}`, Envelope{Type: "😀"}},
		{"lone high surrogate", `{"type":"\ud83dx"}`, Envelope{Type: "\uFFFDx"}},
		{"lone low surrogate", `{"type":"\ude00\ud83d\ude00"}`, Envelope{Type: "\uFFFD😀"}},
		{"high then non-surrogate escape", `{"type":"\ud83d\u0041"}`, Envelope{Type: "\uFFFDA"}},
		{"two highs", `{"type":"\ud83d\ud83d\ude00"}`, Envelope{Type: "\uFFFD😀"}},
		{"raw UTF-8", `{"type":"message","id":"é😀"}`, Envelope{Type: "message", ID: "é😀"}},
		{"invalid UTF-8 replaced", "{\"type\":\"a\xffb\",\"id\":\"\xe2\x82\"}", Envelope{Type: "a\uFFFDb", ID: "\uFFFD\uFFFD"}},
		{"invalid UTF-8 in a skipped value", "{\"type\":\"a\",\"x\":\"\xff\xfe\"}", Envelope{Type: "a"}},
		{"DEL is not a control character", "{\"type\":\"a\x7f\"}", Envelope{Type: "a\x7f"}},
		{"long escaped type", `{"type":"` + strings.Repeat(`\u0041`, 100) + `"}`, Envelope{Type: strings.Repeat("A", 100)}},
		{"long key with escapes", `{"` + strings.Repeat(`\u0041`, 20) + `":1,"type":"a"}`, Envelope{Type: "a"}},

		// Whitespace.
		{"CRLF", "{\"type\":\"a\",\"id\":\"x\"}\r", Envelope{Type: "a", ID: "x"}},
		{"whitespace everywhere", " \t{ \"type\" :\t\"a\" , \"id\" : \"x\" , \"v\" : [ 1 , { \"k\" : null } ] }\r\n ", Envelope{Type: "a", ID: "x"}},

		// Values of every kind.
		{"numbers", `{"type":"a","n":[0,-0,1,-1,10,1.5,-0.25,1e5,1E+5,1e-5,0.0e0,123456789012345678901234567890,1.7976931348623157e309]}`, Envelope{Type: "a"}},
		{"literals", `{"type":"a","l":[true,false,null],"o":{},"e":[],"s":""}`, Envelope{Type: "a"}},
		{"empty nested", `{"type":"a","x":[[[]],{},[{}],{"a":{}}]}`, Envelope{Type: "a"}},
		{"deep nesting", `{"type":"a","x":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`, Envelope{Type: "a"}},
		{"deep objects", `{"type":"a","x":` + strings.Repeat(`{"k":`, 3000) + "1" + strings.Repeat("}", 3000) + `}`, Envelope{Type: "a"}},
		{"mixed deep nesting", `{"type":"a","x":` + strings.Repeat(`[{"k":`, 700) + "[]" + strings.Repeat("}]", 700) + `}`, Envelope{Type: "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ScanEntry([]byte(tt.line))
			if err != nil {
				t.Fatalf("ScanEntry(%.200q): %v", tt.line, err)
			}
			if got != tt.want {
				t.Errorf("ScanEntry(%.200q)\n got %+q\nwant %+q", tt.line, got, tt.want)
			}
		})
	}
}

func TestScanEntryRejects(t *testing.T) {
	const ok = `{"type":"message","id":"a1","parentId":null,"timestamp":"t","message":{"role":"user","content":"hi"}}`
	tests := []struct {
		name string
		line string
	}{
		{"empty", ``},
		{"blank", " \t\r"},
		{"garbage", `garbage`},
		{"not an object: array", `[{"type":"a"}]`},
		{"not an object: string", `"type"`},
		{"not an object: number", `42`},
		{"not an object: null", `null`},

		// Torn and glued lines, as a crash or a concurrent reader leaves them.
		{"torn tail", ok[:len(ok)-1]},
		{"torn mid-string", ok[:30]},
		{"torn after key", `{"type"`},
		{"torn after colon", `{"type":`},
		{"torn after comma", `{"type":"a",`},
		{"open brace only", `{`},
		{"glued fragment", `{"type":"mess{"type":"message","id":"a1"}`},
		{"glued fragment in nested value", `{"type":"message","message":{"role":"assist{"type":"message","id":"a2"}}`},
		{"two objects", ok + ok},
		{"two objects with space", ok + " " + ok},
		{"trailing garbage", ok + "x"},
		{"trailing comma-object", ok + `,{}`},
		{"trailing NUL", ok + "\x00"},
		{"BOM", "\xef\xbb\xbf" + ok},

		// Envelope rules.
		{"no type", `{"id":"a"}`},
		{"empty object", `{}`},
		{"type number", `{"type":1}`},
		{"type null", `{"type":null}`},
		{"type object", `{"type":{"x":"message"}}`},
		{"type only nested", `{"message":{"type":"message"}}`},
		{"type string then number", `{"type":"a","type":1}`},
		{"id number", `{"type":"a","id":12345678}`},
		{"id null", `{"type":"a","id":null}`},
		{"id array", `{"type":"a","id":["x"]}`},
		{"parentId number", `{"type":"a","parentId":1}`},
		{"parentId false", `{"type":"a","parentId":false}`},
		{"targetId object", `{"type":"leaf","targetId":{}}`},
		{"targetId true", `{"type":"leaf","targetId":true}`},

		// Objects.
		{"unquoted key", `{type:"a"}`},
		{"single quotes", `{'type':'a'}`},
		{"missing colon", `{"type" "a"}`},
		{"missing value", `{"type":}`},
		{"trailing comma", `{"type":"a",}`},
		{"leading comma", `{,"type":"a"}`},
		{"double comma", `{"type":"a",,"id":"b"}`},
		{"missing comma", `{"type":"a" "id":"b"}`},
		{"nested trailing comma", `{"type":"a","x":{"k":1,}}`},
		{"nested missing colon", `{"type":"a","x":{"k" 1}}`},
		{"nested non-string key", `{"type":"a","x":{1:2}}`},
		{"nested unclosed", `{"type":"a","x":{"k":1}`},
		{"mismatched brackets", `{"type":"a","x":[1}}`},
		{"mismatched braces", `{"type":"a","x":{"k":1]}`},
		{"extra closer", `{"type":"a","x":[1]]}`},
		{"deep unclosed", `{"type":"a","x":` + strings.Repeat("[", 2000) + strings.Repeat("]", 1999) + `}`},
		{"deep mismatched", `{"type":"a","x":` + strings.Repeat("[", 600) + "}" + strings.Repeat("]", 599) + `}`},

		// Arrays.
		{"array trailing comma", `{"type":"a","x":[1,]}`},
		{"array leading comma", `{"type":"a","x":[,1]}`},
		{"array missing comma", `{"type":"a","x":[1 2]}`},
		{"array colon", `{"type":"a","x":[1:2]}`},

		// Strings.
		{"unterminated string", `{"type":"a`},
		{"raw newline in string", "{\"type\":\"a\nb\"}"},
		{"raw tab in string", "{\"type\":\"a\tb\"}"},
		{"raw NUL in string", "{\"type\":\"a\x00b\"}"},
		{"raw control in skipped string", "{\"type\":\"a\",\"x\":\"0123456789\x1f\"}"},
		{"bad escape", `{"type":"a\x"}`},
		{"escaped quote unterminated", `{"type":"a\"}`},
		{"escape at end", `{"type":"a\`},
		{"short unicode escape", `{"type":"\u12"}`},
		{"bad hex", `{"type":"\u12G4"}`},
		{"unicode escape at end", `{"type":"\u00`},
		{"bad escape in key", `{"ty\pe":"a"}`},
		{"bad escape in nested", `{"type":"a","x":["\q"]}`},
		{"invalid UTF-8 outside strings", "{\"type\":\"a\",\xff}"},

		// Numbers.
		{"leading zero", `{"type":"a","n":01}`},
		{"leading plus", `{"type":"a","n":+1}`},
		{"bare minus", `{"type":"a","n":-}`},
		{"minus letter", `{"type":"a","n":-a}`},
		{"trailing dot", `{"type":"a","n":1.}`},
		{"leading dot", `{"type":"a","n":.5}`},
		{"empty exponent", `{"type":"a","n":1e}`},
		{"signed empty exponent", `{"type":"a","n":1e+}`},
		{"hex number", `{"type":"a","n":0x10}`},
		{"NaN", `{"type":"a","n":NaN}`},
		{"Infinity", `{"type":"a","n":Infinity}`},
		{"number then letter", `{"type":"a","n":12a}`},
		{"double minus", `{"type":"a","n":--1}`},
		{"number torn", `{"type":"a","n":12`},

		// Literals.
		{"truncated true", `{"type":"a","l":tru}`},
		{"capitalised", `{"type":"a","l":True}`},
		{"literal suffix", `{"type":"a","l":nullx}`},
		{"literal torn", `{"type":"a","l":fals`},
		{"undefined", `{"type":"a","l":undefined}`},

		// Comments and other non-JSON.
		{"comment", `{"type":"a"/*c*/}`},
		{"line comment", `{"type":"a"} // c`},
		{"form feed is not whitespace", "{\"type\":\"a\"}\f"},
		{"vertical tab is not whitespace", "\v{\"type\":\"a\"}"},
		{"NBSP is not whitespace", "{\"type\":\"a\"}\xc2\xa0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ScanEntry([]byte(tt.line))
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ScanEntry(%.200q) = %+q, %v; want ErrMalformed", tt.line, got, err)
			}
			if !strings.Contains(err.Error(), "at offset ") {
				t.Errorf("error %q does not say where", err)
			}
			if got != (Envelope{}) {
				t.Errorf("ScanEntry returned %+v with an error", got)
			}
		})
	}
}

// TestScanEntryErrorOffset pins that the offset points at the damage, which
// is what an operator reads to tell a torn tail from a glued fragment.
func TestScanEntryErrorOffset(t *testing.T) {
	tests := []struct {
		line, want string
	}{
		{`{"type":"a"}x`, "data after the end of the object at offset 12"},
		{`{"type":"a","n":01}`, "expected ',' or '}' in object at offset 17"},
		{`{"type":"mess{"type":"x"}`, "expected ',' or '}' in object at offset 15"},
		{`{"type":"a`, "unterminated string at offset 10"},
		{`{"type":1}`, "type is not a string at offset 8"},
		{`{"type":"a","x":[1,]}`, "invalid character, expected value at offset 19"},
	}
	for _, tt := range tests {
		_, err := ScanEntry([]byte(tt.line))
		if err == nil || err.Error() != "malformed entry line: "+tt.want {
			t.Errorf("ScanEntry(%q) error = %v, want %q", tt.line, err, tt.want)
		}
	}
}

func TestIsBlank(t *testing.T) {
	tests := []struct {
		line string
		want bool
	}{
		{"", true},
		{" ", true},
		{"\t \r", true},
		{"\r\n", true},
		{"x", false},
		{" {} ", false},
		{"\x00", false},
		{"\f", false},
	}
	for _, tt := range tests {
		if got := IsBlank([]byte(tt.line)); got != tt.want {
			t.Errorf("IsBlank(%q) = %v, want %v", tt.line, got, tt.want)
		}
	}
}

// TestScanEntryDoesNotAlias pins that an Envelope stays valid after the
// caller reuses its line buffer, as a tailing reader does.
func TestScanEntryDoesNotAlias(t *testing.T) {
	line := []byte(`{"type":"future","id":"abcdefgh","parentId":"01234567","targetId":"zz","timestamp":"2026"}`)
	e, err := ScanEntry(line)
	if err != nil {
		t.Fatal(err)
	}
	want := e
	for i := range line {
		line[i] = 'X'
	}
	if e != want || e.ID != "abcdefgh" || e.Type != "future" || e.Timestamp != "2026" {
		t.Errorf("envelope changed with its line: %+v", e)
	}
}
