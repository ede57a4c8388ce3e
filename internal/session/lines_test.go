package session

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestLines: SplitLines, ReadLines and TornTail agree on what a file's lines are (the
// bytes before each '\n'; what follows the last one is a torn tail), and Digest is the
// digest ReadLines gives each line, whatever its length.
func TestLines(t *testing.T) {
	long := bytes.Repeat([]byte("x"), LinePrefixKeep+10) // past the kept prefix
	huge := bytes.Repeat([]byte("y"), maxReadBuf+10)     // past the read buffer
	for _, tc := range []struct {
		name  string
		file  []byte
		lines []string
		torn  int64
	}{
		{name: "empty"},
		{name: "one line", file: []byte("{}\n"), lines: []string{"{}"}},
		{name: "torn tail only", file: []byte(`{"type":`), torn: 8},
		{name: "lines and a torn tail", file: []byte("a\nb\n{\"ty"), lines: []string{"a", "b"}, torn: 4},
		{name: "blank lines", file: []byte("\n\na\n"), lines: []string{"", "", "a"}},
		{name: "CRLF is kept", file: []byte("a\r\nb\n"), lines: []string{"a\r", "b"}},
		{name: "a line past the kept prefix", file: append(append([]byte("a\n"), long...), '\n'), lines: []string{"a", string(long)}},
		{name: "a line past the read buffer, then a torn tail", file: append(append(append([]byte{}, huge...), '\n'), "zz"...),
			lines: []string{string(huge)}, torn: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			split := SplitLines(tc.file)
			if len(split) != len(tc.lines) {
				t.Fatalf("SplitLines: %d lines, want %d", len(split), len(tc.lines))
			}
			for i, l := range split {
				if string(l) != tc.lines[i] {
					t.Errorf("SplitLines: line %d is %.20q, want %.20q", i, l, tc.lines[i])
				}
			}
			var got []DigestedLine
			torn, err := ReadLines(bytes.NewReader(tc.file), func(l DigestedLine) error {
				l.Prefix = bytes.Clone(l.Prefix)
				got = append(got, l)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if torn != tc.torn {
				t.Errorf("ReadLines: torn tail %d, want %d", torn, tc.torn)
			}
			if len(got) != len(tc.lines) {
				t.Fatalf("ReadLines: %d lines, want %d", len(got), len(tc.lines))
			}
			for i, l := range got {
				want := []byte(tc.lines[i])
				sum := sha256.Sum256(want)
				if l.Ordinal != int64(i) || l.Size != int64(len(want)) || l.SHA256 != hex.EncodeToString(sum[:]) || l.SHA256 != Digest(want) {
					t.Errorf("ReadLines: line %d is ordinal %d, %d bytes, digest %s; want %d bytes, digest %s", i, l.Ordinal, l.Size, l.SHA256, len(want), Digest(want))
				}
				switch {
				case len(want) <= LinePrefixKeep && !bytes.Equal(l.Prefix, want):
					t.Errorf("ReadLines: line %d keeps %.20q, want the line", i, l.Prefix)
				case len(want) > LinePrefixKeep && l.Prefix != nil:
					t.Errorf("ReadLines: line %d of %d bytes keeps %d of them, want none", i, len(want), len(l.Prefix))
				}
			}
			tail, err := TornTail(bytes.NewReader(tc.file), int64(len(tc.file)))
			if err != nil || tail != tc.torn {
				t.Errorf("TornTail: %d (%v), want %d", tail, err, tc.torn)
			}
		})
	}
}

// TestHexDigest: a digest in hex is what hex.EncodeToString writes.
func TestHexDigest(t *testing.T) {
	for _, b := range []string{"", "{}", strings.Repeat("é", 1000)} {
		sum := sha256.Sum256([]byte(b))
		if got, want := HexDigest(sum), hex.EncodeToString(sum[:]); got != want {
			t.Errorf("HexDigest(%.10q) = %s, want %s", b, got, want)
		}
	}
}

// TestDigestSection: a section is digested and its first bytes kept from one pass; a
// section that runs past the end of the file is an io.ErrUnexpectedEOF, and a read
// error is passed on.
func TestDigestSection(t *testing.T) {
	file := append(append([]byte("head\n"), bytes.Repeat([]byte("z"), LinePrefixKeep+5)...), "\ntail\n"...)
	bigLen := int64(LinePrefixKeep + 5)
	errDisk := errors.New("input/output error")
	for _, tc := range []struct {
		name    string
		r       io.ReaderAt
		off, n  int64
		want    []byte // the section's bytes
		wantErr error
	}{
		{name: "a short line", r: bytes.NewReader(file), off: 0, n: 4, want: file[:4]},
		{name: "an empty section", r: bytes.NewReader(file), off: 5, n: 0, want: []byte{}},
		{name: "past the kept prefix", r: bytes.NewReader(file), off: 5, n: bigLen, want: file[5 : 5+bigLen]},
		{name: "the end of the file", r: bytes.NewReader(file), off: int64(len(file)) - 5, n: 5, want: file[len(file)-5:]},
		{name: "cut short in the prefix", r: bytes.NewReader(file), off: int64(len(file)) - 3, n: 5, wantErr: io.ErrUnexpectedEOF},
		{name: "cut short after the prefix", r: bytes.NewReader(file[:5+LinePrefixKeep+1]), off: 5, n: bigLen, wantErr: io.ErrUnexpectedEOF},
		{name: "a read error", r: failingReader{errDisk}, off: 0, n: 10, wantErr: errDisk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix, sum, err := DigestSection(tc.r, tc.off, tc.n)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sum != sha256.Sum256(tc.want) {
				t.Error("not the section's digest")
			}
			if keep := tc.want[:min(len(tc.want), LinePrefixKeep)]; !bytes.Equal(prefix, keep) {
				t.Errorf("prefix of %d bytes, want the first %d of the section", len(prefix), len(keep))
			}
		})
	}
}

type failingReader struct{ err error }

func (f failingReader) ReadAt([]byte, int64) (int, error) { return 0, f.err }
