package bench

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pisync/pisync/internal/session"
	"github.com/pisync/pisync/internal/testutil/sessiontest"
	"github.com/pisync/pisync/mirror"
)

// blobThreshold is the publisher's default: lines above it go to the object store.
const blobThreshold = 512 << 10

// lineSize draws the size of one line: log-uniform from 200 B to 8 KiB (many short
// entries, model changes and prompts, fewer long tool results), one line in 500 from
// 100 to 300 KiB (a large tool output), and one in 5,000 a base64 image of 0.6 to 2 MiB
// (above the blob threshold: stored in the object store).
func lineSize(rng *rand.Rand) (size int, image bool) {
	switch r := rng.IntN(5000); {
	case r == 0:
		return 600<<10 + rng.IntN(1400<<10), true
	case r <= 10:
		return 100<<10 + rng.IntN(200<<10), false
	}
	return int(200 * math.Exp(rng.Float64()*math.Log(8192.0/200))), false
}

// spec describes a workload: sessions × entries, written once per process.
type spec struct {
	name     string
	sessions int
	entries  int
	perDir   int    // sessions per working directory
	bigBytes int64  // > 0: one session of about this many bytes instead
	seed     uint64 // of the line contents
	blob     bool   // session 0's first entry is a blob, whatever the draw (smoke test)
}

// sessionFile is one session of a workload.
type sessionFile struct {
	path  string // absolute
	rel   string // relative to the workload's root, slash-separated
	id    string
	lines int
	bytes int64
	meta  string // file of the publisher's metadata of each line (not for big workloads)
	blobs int
	large int
}

// lineMeta is the mirror metadata of one line, as the publisher classifies it, so that
// the raw ceiling publishes exactly pisync's headers without paying for classifying.
type lineMeta struct {
	kind      mirror.Kind
	entryID   string
	parentID  string
	entryType string
	sha       string
	len       int64
}

// workload is a tree of session files.
type workload struct {
	spec
	root  string
	files []*sessionFile
	lines int   // complete lines, headers included
	bytes int64 // file bytes
	blobs int   // lines above the blob threshold
	large int   // lines of 100 KiB and more
}

func (w *workload) String() string {
	return fmt.Sprintf("%d sessions, %d lines, %.1f MB (%d lines ≥ 100 KiB, %d blobs)",
		len(w.files), w.lines, float64(w.bytes)/1e6, w.large, w.blobs)
}

var (
	workloadMu sync.Mutex
	workloads  = map[spec]*workload{}
)

// getWorkload writes the workload of s once per process and returns it; its files are
// removed when the process ends.
func getWorkload(tb testing.TB, s spec) *workload {
	tb.Helper()
	workloadMu.Lock()
	defer workloadMu.Unlock()
	if w, ok := workloads[s]; ok {
		return w
	}
	dir, err := os.MkdirTemp("", "pisync-bench-"+s.name+"-")
	if err != nil {
		tb.Fatal(err)
	}
	atExit(func() { os.RemoveAll(dir) })
	w := &workload{spec: s, root: filepath.Join(dir, "sessions")}
	if s.bigBytes > 0 {
		err = w.writeBig()
	} else {
		err = w.writeSessions()
	}
	if err != nil {
		tb.Fatalf("write workload %s: %v", s.name, err)
	}
	workloads[s] = w
	return w
}

// writeSessions writes sessions × entries lines, one session per file, with one
// generator per core; session i's content depends only on the seed and i.
func (w *workload) writeSessions() error {
	w.files = make([]*sessionFile, w.sessions)
	var next int
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, runtime.NumCPU())
	for range runtime.NumCPU() {
		wg.Go(func() {
			var content, meta []byte
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= w.sessions {
					return
				}
				f, c, m, err := w.writeSession(i, content[:0], meta[:0])
				if err != nil {
					errs <- err
					return
				}
				content, meta = c, m
				w.files[i] = f
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	for _, f := range w.files {
		w.lines += f.lines
		w.bytes += f.bytes
		w.blobs += f.blobs
		w.large += f.large
	}
	return nil
}

func (w *workload) writeSession(i int, content, meta []byte) (*sessionFile, []byte, []byte, error) {
	rng := rand.New(rand.NewPCG(w.seed, uint64(i)))
	perDir := max(w.perDir, 1)
	cwd := "/home/dev/repo-" + strconv.Itoa(i/perDir)
	format := sessiontest.Format(i % 3)
	if i%50 == 49 {
		format = sessiontest.CLIV1 // legacy files are rare
	}
	f := sessiontest.New(rng, w.root, cwd, format)
	sf := &sessionFile{path: f.Path, id: f.ID}
	rel, err := filepath.Rel(w.root, f.Path)
	if err != nil {
		return nil, nil, nil, err
	}
	sf.rel = filepath.ToSlash(rel)
	add := func(line []byte, ord int64) {
		content = append(append(content, line...), '\n')
		meta = classify(line, ord).append(meta)
		sf.lines++
		if len(line) > blobThreshold {
			sf.blobs++
		}
		if len(line) >= 100<<10 {
			sf.large++
		}
	}
	add(f.HeaderLine(cwd), 0)
	for j := range w.entries {
		size, image := lineSize(rng)
		if w.blob && i == 0 && j == 0 {
			size, image = 600<<10, true
		}
		if image {
			add(f.ImageEntry(size*3/4), int64(j+1))
		} else {
			add(f.Entry(size), int64(j+1))
		}
	}
	if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
		return nil, nil, nil, err
	}
	// One write per file: writing is not what is measured.
	if err := os.WriteFile(f.Path, content, 0o644); err != nil {
		return nil, nil, nil, err
	}
	sf.meta = filepath.Join(filepath.Dir(w.root), "meta", strconv.Itoa(i))
	if err := os.MkdirAll(filepath.Dir(sf.meta), 0o755); err != nil {
		return nil, nil, nil, err
	}
	if err := os.WriteFile(sf.meta, meta, 0o644); err != nil {
		return nil, nil, nil, err
	}
	sf.bytes = int64(len(content))
	return sf, content, meta, nil
}

// writeBig writes one session of about bigBytes bytes, streaming.
func (w *workload) writeBig() error {
	rng := rand.New(rand.NewPCG(w.seed, 0))
	cwd := "/home/dev/big"
	f := sessiontest.New(rng, w.root, cwd, sessiontest.HarnessV3)
	if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
		return err
	}
	fh, err := os.Create(f.Path)
	if err != nil {
		return err
	}
	defer fh.Close()
	bw := bufio.NewWriterSize(fh, 1<<20)
	sf := &sessionFile{path: f.Path, id: f.ID}
	rel, _ := filepath.Rel(w.root, f.Path)
	sf.rel = filepath.ToSlash(rel)
	write := func(line []byte) {
		bw.Write(line)
		bw.WriteByte('\n')
		sf.lines++
		sf.bytes += int64(len(line)) + 1
		if len(line) > blobThreshold {
			w.blobs++
		}
		if len(line) >= 100<<10 {
			w.large++
		}
	}
	write(f.HeaderLine(cwd))
	for sf.bytes < w.bigBytes {
		size, image := lineSize(rng)
		if image {
			write(f.ImageEntry(size * 3 / 4))
		} else {
			write(f.Entry(size))
		}
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	w.files = []*sessionFile{sf}
	w.lines, w.bytes = sf.lines, sf.bytes
	return fh.Close()
}

// classify is what the publisher makes of a line (publisher.classify and entryID):
// line 1 the header; a blank line, a line that is not a JSON entry, or one whose id
// cannot be mirrored is raw; lines above the blob threshold become blob references.
func classify(line []byte, ord int64) lineMeta {
	sum := sha256.Sum256(line)
	m := lineMeta{sha: hex.EncodeToString(sum[:]), len: int64(len(line))}
	switch env, err := session.ScanEntry(line); {
	case ord == 0:
		m.kind, m.entryID, m.entryType = mirror.KindHeader, mirror.HeaderEntryType, mirror.HeaderEntryType
	case session.IsBlank(line) || err != nil || (env.ID != "" && !mirror.ValidEntryID(env.ID)):
		m.kind, m.entryID = mirror.KindRaw, mirror.OrdinalID(ord)
	default:
		m.kind, m.entryID, m.parentID, m.entryType = mirror.KindEntry, env.ID, env.ParentID, env.Type
		if env.ID == "" {
			m.entryID = mirror.OrdinalID(ord)
		}
	}
	if m.len > blobThreshold {
		m.kind = mirror.KindBlob
	}
	return m
}

// append encodes m as one line of a metadata file.
func (m lineMeta) append(b []byte) []byte {
	b = append(b, m.kind...)
	for _, f := range []string{m.entryID, m.parentID, m.entryType, m.sha} {
		b = append(append(b, '\t'), f...)
	}
	b = append(b, '\t')
	return append(strconv.AppendInt(b, m.len, 10), '\n')
}

// readMeta reads a metadata file written by writeSession.
func readMeta(path string) ([]lineMeta, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []lineMeta
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		f := strings.Split(l, "\t")
		if len(f) != 6 {
			return nil, fmt.Errorf("%s: bad line %q", path, l)
		}
		n, err := strconv.ParseInt(f[5], 10, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, lineMeta{kind: mirror.Kind(f[0]), entryID: f[1], parentID: f[2], entryType: f[3], sha: f[4], len: n})
	}
	return out, nil
}

// formatOf is the session format of a header line, as the publisher records it.
func formatOf(header []byte) string {
	h, err := session.ParseHeader(header)
	if err != nil {
		return ""
	}
	return string(h.Format)
}

// backfillSpec is the back-fill workload of items 1, 6 and 7.
func backfillSpec(sessions, entries int) spec {
	return spec{name: "backfill", sessions: sessions, entries: entries, perDir: 60, seed: 1}
}

// filesSpec is a tree of n small sessions (idle and scaling).
func filesSpec(n, entries int) spec {
	return spec{name: "files" + strconv.Itoa(n), sessions: n, entries: entries, perDir: 100, seed: 2}
}

func splitInts(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}
