package mirror

import (
	"errors"
	"strings"
	"testing"
)

func TestEncodeToken(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"alice", "alice"},
		{"0b6c6e0e-2c4b-4d6f-9f3e-2a0e5b1c7d9e", "0b6c6e0e-2c4b-4d6f-9f3e-2a0e5b1c7d9e"},
		{"john_doe", "john_5Fdoe"},
		{"a.b", "a_2Eb"},
		{"*", "_2A"},
		{">", "_3E"},
		{"with space", "with_20space"},
		{"../etc", "_2E_2E_2Fetc"},
		{"nul\x00", "nul_00"},
		{"\xff\xfe", "_FF_FE"},
		{"naïve", "na_C3_AFve"},
	}
	for _, tt := range tests {
		got, err := EncodeToken(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("EncodeToken(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			continue
		}
		back, err := DecodeToken(got)
		if err != nil || back != tt.in {
			t.Errorf("DecodeToken(%q) = %q, %v; want %q", got, back, err, tt.in)
		}
	}
}

func TestEncodeTokenRefuses(t *testing.T) {
	for _, in := range []string{"", strings.Repeat("x", MaxTokenLen+1), strings.Repeat(".", MaxTokenLen/3+1)} {
		if _, err := EncodeToken(in); !errors.Is(err, ErrBadToken) {
			t.Errorf("EncodeToken(%d bytes) = %v, want ErrBadToken", len(in), err)
		}
	}
}

func TestDecodeTokenRefusesNonCanonical(t *testing.T) {
	// Each of these would decode to something, but EncodeToken never writes it: accepting
	// it would give one token two spellings.
	for _, tok := range []string{"", "_41", "_2e", "_2", "_", "a.b", "a b", "_GG"} {
		if _, err := DecodeToken(tok); err == nil {
			t.Errorf("DecodeToken(%q) accepted", tok)
		}
	}
}

func FuzzToken(f *testing.F) {
	for _, s := range []string{"alice", "a.b.*>", "_", "__5F", "\x00\xff", "日本", "../../x", " "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := EncodeToken(s)
		if err != nil {
			if s != "" && len(s) <= MaxTokenLen/3 {
				t.Fatalf("EncodeToken(%q) refused a short token: %v", s, err)
			}
			return
		}
		for i := 0; i < len(tok); i++ {
			if !plainTokenByte(tok[i]) && tok[i] != '_' {
				t.Fatalf("EncodeToken(%q) = %q has %q", s, tok, tok[i])
			}
		}
		back, err := DecodeToken(tok)
		if err != nil || back != s {
			t.Fatalf("round trip %q → %q → %q, %v", s, tok, back, err)
		}
		// Decoding anything, then encoding, gives the input back or an error.
		if dec, err := DecodeToken(s); err == nil {
			if enc, _ := EncodeToken(dec); enc != s {
				t.Fatalf("DecodeToken(%q) = %q encodes to %q", s, dec, enc)
			}
		}
	})
}

func TestNames(t *testing.T) {
	n := DefaultNames()
	c := acmeConv(t)
	o := c.Owner
	checks := map[string]string{
		n.Stream():             "PISYNC_ENTRIES",
		n.HeadsBucket():        "PISYNC_HEADS",
		n.BlobsBucket():        "PISYNC_BLOBS",
		n.StreamSubjects():     "pisync.entries.>",
		n.Subject(c):           "pisync.entries.acme_20corp.bob_2Esmith.0b6c6e0e-2c4b",
		n.OwnerSubjects(o):     "pisync.entries.acme_20corp.bob_2Esmith.>",
		c.HeadKey():            "acme_20corp.bob_2Esmith.0b6c6e0e-2c4b",
		c.MsgID(2, "a1b2c3d4"): "acme_20corp.bob_2Esmith.0b6c6e0e-2c4b.2.a1b2c3d4",
		c.MsgID(1, "_header"):  "acme_20corp.bob_2Esmith.0b6c6e0e-2c4b.1._5Fheader",
		o.ObjectName("abc"):    "acme_20corp.bob_2Esmith.abc",
	}
	for got, want := range checks {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	custom, err := NewNames("team2")
	if err != nil || custom.Stream() != "TEAM2_ENTRIES" || custom.Subject(c) != "team2.entries.acme_20corp.bob_2Esmith.0b6c6e0e-2c4b" {
		t.Errorf("prefix team2: %v %q", err, custom.Subject(c))
	}
	for _, bad := range []string{"", "Pisync", "a.b", "x*", "1abc"} {
		if _, err := NewNames(bad); err == nil {
			t.Errorf("NewNames(%q) accepted", bad)
		}
	}
}

func TestLineRoundTrip(t *testing.T) {
	o, _ := NewOwner("t", "o")
	c, _ := NewConv(o, "conv")
	for _, l := range []Line{
		{Kind: KindHeader, EntryID: "_header", EntryType: "_header", Ordinal: 0, Generation: 1, SHA256: "aa", Format: "v3", Host: "h", Source: "d/f.jsonl"},
		{Kind: KindEntry, EntryID: "a1", ParentID: "p0", EntryType: "message", Ordinal: 7, Generation: 2, SHA256: "bb", Format: "v2", Host: "h", Source: "s"},
		{Kind: KindBlob, EntryID: "b1", EntryType: "message", Ordinal: 3, Generation: 1, SHA256: "cc", BlobSize: 3 << 20, Format: "v3", Host: "h", Source: "s"},
		{Kind: KindRaw, EntryID: "L4", Ordinal: 4, Generation: 1, SHA256: "dd", Format: "v3", Host: "h", Source: "s"},
	} {
		m := DefaultNames().NewMsg(c, l, []byte("x"))
		got, err := ParseLine(m.Header)
		if err != nil || got != l {
			t.Errorf("round trip of %+v: %+v, %v", l, got, err)
		}
	}
	for _, h := range []map[string]string{
		{HdrKind: "bogus", HdrOrdinal: "1", HdrGeneration: "1"},
		{HdrKind: "entry", HdrOrdinal: "-1", HdrGeneration: "1"},
		{HdrKind: "entry", HdrOrdinal: "1", HdrGeneration: "0"},
		{HdrKind: "blob", HdrOrdinal: "1", HdrGeneration: "1"},
	} {
		m := DefaultNames().NewMsg(c, Line{Kind: KindEntry, Generation: 1}, nil)
		for k, v := range h {
			m.Header.Set(k, v)
		}
		if _, err := ParseLine(m.Header); err == nil {
			t.Errorf("ParseLine accepted %v", h)
		}
	}
}

// TestNewMsgWire pins the subject and headers of a line's message (DESIGN §2) as built
// before NewMsg's strings shared one allocation: a mirror written by an older daemon must
// keep deduplicating against a newer one's messages.
func TestNewMsgWire(t *testing.T) {
	c := acmeConv(t)
	const subject = "pisync.entries.acme_20corp.bob_2Esmith.0b6c6e0e-2c4b"
	for _, tc := range []struct {
		name string
		line Line
		want map[string]string
	}{
		{"header", Line{Kind: KindHeader, EntryID: "_header", EntryType: "_header", Ordinal: 0, Generation: 1,
			SHA256: "aa", Format: "v3", Host: "h1", Source: "--home--/s.jsonl"},
			map[string]string{HdrMsgID: "acme_20corp.bob_2Esmith.0b6c6e0e-2c4b.1._5Fheader", HdrKind: "header",
				HdrEntryID: "_header", HdrEntryType: "_header", HdrOrdinal: "0", HdrGeneration: "1", HdrSHA256: "aa",
				HdrFormat: "v3", HdrHost: "h1", HdrSource: "--home--/s.jsonl"}},
		{"entry", Line{Kind: KindEntry, EntryID: "a1b2c3d4", ParentID: "p0", EntryType: "message", Ordinal: 123456789,
			Generation: 1234, SHA256: "bb", Format: "v2", Host: "h", Source: "s"},
			map[string]string{HdrMsgID: "acme_20corp.bob_2Esmith.0b6c6e0e-2c4b.1234.a1b2c3d4", HdrKind: "entry",
				HdrEntryID: "a1b2c3d4", HdrParentID: "p0", HdrEntryType: "message", HdrOrdinal: "123456789",
				HdrGeneration: "1234", HdrSHA256: "bb", HdrFormat: "v2", HdrHost: "h", HdrSource: "s"}},
		{"blob with an id to encode", Line{Kind: KindBlob, EntryID: "x.y", EntryType: "message", Ordinal: 3, Generation: 2,
			SHA256: "cc", BlobSize: 3 << 20, Format: "v3", Host: "h", Source: "s"},
			map[string]string{HdrMsgID: "acme_20corp.bob_2Esmith.0b6c6e0e-2c4b.2.x_2Ey", HdrKind: "blob",
				HdrEntryID: "x.y", HdrEntryType: "message", HdrOrdinal: "3", HdrGeneration: "2", HdrSHA256: "cc",
				HdrFormat: "v3", HdrHost: "h", HdrSource: "s", HdrBlobSize: "3145728"}},
		{"raw", Line{Kind: KindRaw, EntryID: "L4", Ordinal: 4, Generation: 100, SHA256: "dd", Format: "v1", Host: "h", Source: "s"},
			map[string]string{HdrMsgID: "acme_20corp.bob_2Esmith.0b6c6e0e-2c4b.100.L4", HdrKind: "raw",
				HdrEntryID: "L4", HdrOrdinal: "4", HdrGeneration: "100", HdrSHA256: "dd", HdrFormat: "v1",
				HdrHost: "h", HdrSource: "s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The map NewMsg fills and the one NewOutgoing refills carry the same headers.
			for _, encoded := range []bool{false, true} {
				m := DefaultNames().NewMsg(c, tc.line, []byte("body"))
				if encoded {
					m = DefaultNames().NewOutgoing(c, tc.line, []byte("body")).Msg("")
				}
				if m.Subject != subject || string(m.Data) != "body" || m.Reply != "" {
					t.Errorf("subject %q, data %q, reply %q", m.Subject, m.Data, m.Reply)
				}
				if len(m.Header) != len(tc.want) {
					t.Errorf("encoded %v: %d headers, want %d: %v", encoded, len(m.Header), len(tc.want), m.Header)
				}
				for k, v := range tc.want {
					if got := m.Header[k]; len(got) != 1 || got[0] != v {
						t.Errorf("encoded %v: %s: %q, want [%q]", encoded, k, got, v)
					}
				}
			}
		})
	}
}

// acmeConv is conversation 0b6c6e0e-2c4b of owner "bob.smith" of tenant "acme corp": both
// names need encoding.
func acmeConv(t testing.TB) Conv {
	t.Helper()
	o, err := NewOwner("acme corp", "bob.smith")
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConv(o, "0b6c6e0e-2c4b")
	if err != nil {
		t.Fatal(err)
	}
	return c
}
