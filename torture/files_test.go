package torture

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/mirrortest"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
)

// file is a session file the run writes, as the run knows it: its complete lines
// (sf.Lines) and the first part of a line not finished yet (torn, rest).
type file struct {
	n       int // serial number, for the op log
	sf      *sessiontest.File
	cwd     string
	torn    []byte // on disk after the complete lines, no newline yet
	rest    []byte // what completes it (ends with the newline)
	moved   bool   // renamed or written under another name since created: recover may put it elsewhere
	outside bool   // moved out of the roots
	// checked are the lines the file held at the last quiet point, where the mirror was
	// found to equal them: a generation of its conversation holds them for good.
	checked [][]byte
	// good are the lines of checked kept when the file was destroyed in place (a fresh
	// header over it, cut back): the generation the user restores, which the mirror must
	// keep whatever happens to the file after.
	good [][][]byte
}

// destroyed notes that f is about to be overwritten or cut back: what the last quiet
// point found mirrored is the generation that must stay recoverable.
func (f *file) destroyed() {
	if len(f.checked) > 1 {
		f.good = append(f.good, f.checked)
	}
}

func (f *file) String() string {
	return fmt.Sprintf("f%d(%s)", f.n, filepath.Base(f.sf.Path))
}

// content is what the file holds on disk.
func (f *file) content() []byte {
	return append(mirrortest.JoinLines(f.sf.Lines), f.torn...)
}

// files is the tree the run writes: two roots and a directory outside them.
type files struct {
	roots   [2]string
	outside string
	live    []*file // inside the roots
	out     []*file // moved out of the roots
	serial  int
	written map[[32]byte]bool // digest of every complete line any file ever held
}

func (fs *files) record(lines ...[]byte) {
	for _, l := range lines {
		fs.written[sha256.Sum256(l)] = true
	}
}

// pick chooses one live file, nil when there is none; keep filters candidates.
func (fs *files) pick(rng *rand.Rand, keep func(*file) bool) *file {
	var c []*file
	for _, f := range fs.live {
		if keep == nil || keep(f) {
			c = append(c, f)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[rng.IntN(len(c))]
}

func (fs *files) remove(f *file) {
	for i, g := range fs.live {
		if g == f {
			fs.live = append(fs.live[:i], fs.live[i+1:]...)
			return
		}
	}
}

// sameID counts the live files carrying id.
func (fs *files) sameID(id string) int {
	n := 0
	for _, f := range fs.live {
		if f.sf.ID == id {
			n++
		}
	}
	return n
}

func (fs *files) create(rng *rand.Rand) (*file, error) {
	fs.serial++
	cwd := fmt.Sprintf("/srv/proj-%d/sub", rng.IntN(3))
	format := sessiontest.Format(rng.IntN(4))
	sf := sessiontest.New(rng, fs.roots[rng.IntN(2)], cwd, format)
	f := &file{n: fs.serial, sf: sf, cwd: cwd}
	var err error
	if format == sessiontest.HarnessV3 {
		err = sf.Append(sf.HeaderLine(cwd)) // the harness writes the header alone at creation
	} else {
		// The CLI writes nothing until the first assistant message, then everything at once.
		lines := [][]byte{sf.HeaderLine(cwd)}
		for range 1 + rng.IntN(4) {
			lines = append(lines, sf.Entry(200+rng.IntN(2000)))
		}
		if err = os.MkdirAll(filepath.Dir(sf.Path), 0o755); err == nil {
			err = sessiontest.AppendBytes(sf.Path, mirrortest.JoinLines(lines))
		}
		sf.Lines = lines
	}
	fs.record(sf.Lines...)
	fs.live = append(fs.live, f)
	return f, err
}

// createTitled writes a new session as oh-my-pi does: its title record, then the header
// and the first entries, each line one write.
func (fs *files) createTitled(rng *rand.Rand) (*file, error) {
	fs.serial++
	cwd := fmt.Sprintf("/srv/omp-%d", rng.IntN(2))
	sf := sessiontest.New(rng, fs.roots[rng.IntN(2)], cwd, sessiontest.HarnessV3)
	f := &file{n: fs.serial, sf: sf, cwd: cwd}
	lines := [][]byte{sf.TitleLine(fmt.Sprintf("task %d", rng.IntN(100))), sf.HeaderLine(cwd)}
	for range rng.IntN(4) {
		lines = append(lines, sf.Message(100+rng.IntN(1000)))
	}
	fs.record(lines...)
	fs.live = append(fs.live, f)
	if err := os.MkdirAll(filepath.Dir(sf.Path), 0o755); err != nil {
		return f, err
	}
	sf.Reset(sf.Format, nil)
	for _, l := range lines {
		if err := sessiontest.AppendBytes(sf.Path, append(append([]byte(nil), l...), '\n')); err != nil {
			return f, err
		}
		sf.Lines = append(sf.Lines, l)
	}
	sf.Reset(sf.Format, sf.Lines)
	return f, nil
}

// createLarge writes a new session of n lines of about 1 KB in one write.
func (fs *files) createLarge(rng *rand.Rand, n int) (*file, error) {
	fs.serial++
	cwd := "/srv/large"
	sf := sessiontest.New(rng, fs.roots[rng.IntN(2)], cwd, sessiontest.CLIV3)
	f := &file{n: fs.serial, sf: sf, cwd: cwd}
	lines := [][]byte{sf.HeaderLine(cwd)}
	for range n {
		lines = append(lines, sf.Message(900+rng.IntN(200)))
	}
	fs.record(lines...)
	fs.live = append(fs.live, f)
	if err := os.MkdirAll(filepath.Dir(sf.Path), 0o755); err != nil {
		return f, err
	}
	sf.Lines = lines
	return f, sessiontest.AppendBytes(sf.Path, mirrortest.JoinLines(lines))
}

// finish writes the rest of a torn line, as the writer that started it would.
func (fs *files) finish(f *file) error {
	if f.torn == nil {
		return nil
	}
	if err := sessiontest.AppendBytes(f.sf.Path, f.rest); err != nil {
		return err
	}
	line := append(f.torn, f.rest[:len(f.rest)-1]...)
	f.sf.Lines = append(f.sf.Lines, line)
	f.torn, f.rest = nil, nil
	fs.record(line)
	return nil
}

// appendLines appends whole lines, one write each, after finishing a torn line.
func (fs *files) appendLines(f *file, pace func(), lines ...[]byte) error {
	if err := fs.finish(f); err != nil {
		return err
	}
	for _, l := range lines {
		fs.record(l)
		if err := f.sf.Append(l); err != nil {
			return err
		}
		if pace != nil {
			pace()
		}
	}
	return nil
}

// startTorn writes a line up to split (the whole line but its newline when split is its
// length); finish writes the rest.
func (fs *files) startTorn(f *file, line []byte, split int) error {
	if err := fs.finish(f); err != nil {
		return err
	}
	fs.record(line)
	full := append(append([]byte(nil), line...), '\n')
	if err := sessiontest.AppendBytes(f.sf.Path, full[:split]); err != nil {
		return err
	}
	f.torn, f.rest = full[:split:split], full[split:]
	return nil
}

// glue is a writer that crashed after the first part of a line: the next line is
// appended to the fragment, and the file holds one line that is not JSON.
func (fs *files) glue(f *file, fragment, next []byte) error {
	if err := fs.finish(f); err != nil {
		return err
	}
	if err := sessiontest.AppendBytes(f.sf.Path, append(append(append([]byte(nil), fragment...), next...), '\n')); err != nil {
		return err
	}
	glued := append(append([]byte(nil), fragment...), next...)
	fs.record(glued)
	f.sf.Reset(f.sf.Format, append(f.sf.Lines, glued))
	return nil
}

// rewriteInPlace rewrites the file the way Pi does when it migrates or repairs a file:
// open with truncation, then one write per line, with pauses between the writes drawn by
// rng to widen the window in which the daemon reads a half-written file.
func (fs *files) rewriteInPlace(f *file, rng *rand.Rand, format sessiontest.Format, lines [][]byte) error {
	fs.record(lines...)
	fh, err := os.OpenFile(f.sf.Path, os.O_WRONLY|os.O_TRUNC|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	for _, l := range lines {
		if _, err := fh.Write(append(append([]byte(nil), l...), '\n')); err != nil {
			fh.Close()
			return err
		}
		if rng.IntN(8) == 0 {
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond) // a slow writer
		}
	}
	if err := fh.Close(); err != nil {
		return err
	}
	f.torn, f.rest = nil, nil
	f.sf.Reset(format, lines)
	return nil
}

// replace writes lines to a temporary file and renames it over the file (newer Pi).
func (fs *files) replace(f *file, lines [][]byte) error {
	fs.record(lines...)
	tmp := f.sf.Path + ".tmp"
	if err := os.WriteFile(tmp, mirrortest.JoinLines(lines), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, f.sf.Path); err != nil {
		return err
	}
	f.torn, f.rest = nil, nil
	f.sf.Reset(f.sf.Format, lines)
	return nil
}

// move renames f to path (creating its directory).
func move(f *file, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.Rename(f.sf.Path, path); err != nil {
		return err
	}
	f.sf.Path = path
	f.moved = true
	return nil
}

// otherName is a file name for f's session in Pi's layout, with another timestamp.
func otherName(rng *rand.Rand, id string) string {
	ts := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.IntN(1e7)) * time.Millisecond)
	return session.FileName(ts.Format("2006-01-02T15:04:05.000Z"), id)
}

// sameSize changes one digit of a line's timestamp: the line keeps its length, the file
// its size and its line boundaries.
func sameSize(rng *rand.Rand, line []byte) ([]byte, bool) {
	i := bytes.Index(line, []byte(`"timestamp":"`))
	if i < 0 {
		return nil, false
	}
	i += len(`"timestamp":"`)
	var digits []int
	for j := i; j < len(line) && line[j] != '"'; j++ {
		if line[j] >= '0' && line[j] <= '9' {
			digits = append(digits, j)
		}
	}
	if len(digits) == 0 {
		return nil, false
	}
	out := append([]byte(nil), line...)
	j := digits[rng.IntN(len(digits))]
	out[j] = '0' + (out[j]-'0'+1+byte(rng.IntN(9)))%10
	return out, true
}

// migrate turns a v1 file's lines into what Pi's migration writes: a v3 header with the
// same id, and entries with new random ids, each the parent of the next.
func migrate(rng *rand.Rand, lines [][]byte) ([][]byte, error) {
	h, err := session.ParseHeader(lines[0])
	if err != nil {
		return nil, err
	}
	hdr, _ := jsonObject("type", "session", "version", 3, "id", h.ID, "timestamp", h.Timestamp, "cwd", h.Cwd)
	out := [][]byte{hdr}
	parent := "null"
	for _, l := range lines[1:] {
		env, err := session.ScanEntry(l)
		if err != nil || env.ID != "" || !bytes.HasPrefix(l, []byte("{")) || len(bytes.TrimSpace(l[1:])) < 2 {
			out = append(out, l) // not a v1 entry: carried as it is
			continue
		}
		id := fmt.Sprintf("%08x", rng.Uint32())
		out = append(out, []byte(fmt.Sprintf(`{"id":"%s","parentId":%s,%s`, id, parent, l[1:])))
		parent = `"` + id + `"`
	}
	return out, nil
}

// damaged is a line Pi's reader would refuse or skip: blank, not JSON, CRLF-ended.
func damaged(rng *rand.Rand, sf *sessiontest.File) []byte {
	switch rng.IntN(5) {
	case 0:
		return []byte{}
	case 1:
		return []byte("   \t")
	case 2:
		return []byte(`{"type":"message","id":"` + sessiontest.Text(rng, 10) + `","message":{"role":"user"`)
	case 3:
		e := sf.Message(200 + rng.IntN(400))
		return append(e, '\r')
	default:
		return []byte("garbage " + strings.Repeat("x", rng.IntN(200)))
	}
}

// jsonObject encodes key/value pairs in order (as JSON.stringify keeps insertion order).
func jsonObject(kv ...any) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:", kv[i])
		switch v := kv[i+1].(type) {
		case string:
			fmt.Fprintf(&b, "%q", v)
		default:
			fmt.Fprintf(&b, "%v", v)
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
