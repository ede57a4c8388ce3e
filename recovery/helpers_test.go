package recovery

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/session"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// testRoot is the root recorded in the heads of test conversations (never written to:
// tests that write pass their own root).
const testRoot = "/srv/pi/sessions"

// readLines reads a file's complete lines, without their newlines.
func readLines(t testing.TB, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return splitLines(b)
}

func splitLines(b []byte) [][]byte {
	var lines [][]byte
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break // a torn tail is not a line
		}
		lines = append(lines, b[:i])
		b = b[i+1:]
	}
	return lines
}

func joinLines(lines [][]byte) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// mirrored is a file as the daemon mirrors it.
type mirrored struct {
	conv   string // header id
	source string // path relative to the root, Pi's layout
	format session.Format
	msgs   []mirror.Msg // one per line, ordinal order; blob messages have no Data
	blobs  map[string][]byte
}

// mirrorFile classifies lines like the publisher does: line 1 the header, a line that
// is blank or not a JSON entry raw, lines longer than blobThreshold (if > 0) blobs.
func mirrorFile(t testing.TB, lines [][]byte, gen int, blobThreshold int) mirrored {
	t.Helper()
	hdr, err := session.ParseHeader(lines[0])
	if err != nil {
		t.Fatalf("header: %v", err)
	}
	m := mirrored{conv: hdr.ID, format: hdr.Format, blobs: map[string][]byte{},
		source: session.DirName(hdr.Cwd) + "/" + session.FileName(hdr.Timestamp, hdr.ID)}
	for i, l := range lines {
		ord := int64(i)
		ml := mirror.Line{Ordinal: ord, Generation: gen, SHA256: digest(l), Format: string(hdr.Format), Host: "testhost", Source: m.source}
		switch env, err := session.ScanEntry(l); {
		case i == 0:
			ml.Kind, ml.EntryID, ml.EntryType = mirror.KindHeader, mirror.HeaderEntryType, mirror.HeaderEntryType
		case session.IsBlank(l) || err != nil:
			ml.Kind, ml.EntryID = mirror.KindRaw, mirror.OrdinalID(ord)
		default:
			ml.Kind, ml.EntryID, ml.ParentID, ml.EntryType = mirror.KindEntry, env.ID, env.ParentID, env.Type
			if env.ID == "" {
				ml.EntryID = mirror.OrdinalID(ord)
			}
		}
		msg := mirror.Msg{Line: ml, Seq: uint64(i + 1), Data: l}
		if blobThreshold > 0 && len(l) > blobThreshold {
			msg.Kind, msg.BlobSize, msg.Data = mirror.KindBlob, int64(len(l)), nil
			m.blobs[ml.SHA256] = l
		}
		m.msgs = append(m.msgs, msg)
	}
	return m
}

// daemonHead is the head the daemon records after mirroring every line: the leaf by Pi's
// rule over the entry lines.
func daemonHead(lines [][]byte, m mirrored, gen int) mirror.Head {
	var leaf session.Leaf
	var size int64
	for i, l := range lines {
		size += int64(len(l)) + 1
		if i == 0 {
			continue
		}
		if env, err := session.ScanEntry(l); err == nil {
			leaf.Apply(env)
		}
	}
	hdr, _ := session.ParseHeader(lines[0])
	return mirror.Head{Conversation: m.conv, Key: m.conv, Tenant: "t1", Owner: "alice", Host: "testhost",
		Root: testRoot, Source: m.source, Cwd: hdr.Cwd, Format: string(m.format), Generation: gen,
		Entries: int64(len(lines)), LastOrdinal: int64(len(lines) - 1), LastSeq: uint64(len(lines)),
		Bytes: size, Head: leaf.ID(), UpdatedAt: time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)}
}

// without drops the messages at the given ordinals.
func without(msgs []mirror.Msg, drop []int64) []mirror.Msg {
	skip := map[int64]bool{}
	for _, o := range drop {
		skip[o] = true
	}
	var out []mirror.Msg
	for _, m := range msgs {
		if !skip[m.Ordinal] {
			out = append(out, m)
		}
	}
	return out
}

// checkGolden compares got with the golden file, or rewrites it under -update.
func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./recovery -run %s -update to create it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (-update rewrites it):\n--- got\n%s\n--- want\n%s", filepath.Base(path), got, want)
	}
}

// reportJSON is the golden form of a report: indented, with the test's temporary
// directory replaced so that it does not depend on the machine.
func reportJSON(t testing.TB, r Report, tmp string) []byte {
	t.Helper()
	if tmp != "" {
		r.Output = strings.ReplaceAll(r.Output, tmp, "$OUT")
		r.Reason = strings.ReplaceAll(r.Reason, tmp, "$OUT")
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}
