// Package checkpoint keeps pisync's position in each session file: a crash-safe local
// store, never the session file itself (DESIGN §3.5).
//
// Records live in a bbolt database: each Commit is one transaction that writes only the
// records changed since the previous one and fsyncs, so its cost does not grow with the
// number of files, and a SIGKILL or power loss leaves either the old or the new state.
// Losing the store costs nothing but time: the publisher rebuilds its position from the
// mirror.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	bolt "go.etcd.io/bbolt"
)

var bucketName = []byte("files")

// Record is the acknowledged frontier of one session file.
type Record struct {
	Dev          uint64 `json:"dev"`
	Ino          uint64 `json:"ino"`
	HeaderSHA    string `json:"header_sha"` // fingerprint of line 1: tells a reused inode from the same file
	Root         string `json:"root"`
	Rel          string `json:"rel"`
	Conversation string `json:"conversation"` // header id
	ConvKey      string `json:"conv_key"`     // conversation key in the mirror
	Format       string `json:"format"`
	Cwd          string `json:"cwd,omitempty"`
	Generation   int    `json:"generation"`
	// GenBase is how many messages the conversation's subject held before the first line
	// of this generation (older generations); 0 in records of generation 1 and in those
	// written before it was kept. With Ordinal it is what the subject holds when nothing
	// past the checkpoint was published.
	GenBase   uint64 `json:"gen_base,omitempty"`
	Offset    int64  `json:"offset"`   // byte offset after the last acknowledged line
	Ordinal   int64  `json:"ordinal"`  // ordinal of the next line
	StreamSeq uint64 `json:"seq"`      // stream sequence of the last acknowledged line
	LastSHA   string `json:"last_sha"` // digest of the last acknowledged line
	LastLen   int64  `json:"last_len"` // its length without the newline
	Leaf      string `json:"leaf"`
	Entries   int64  `json:"entries"`
	Bytes     int64  `json:"bytes"`
	Deleted   bool   `json:"deleted,omitempty"`
	// Unsettled says lines were delivered since a change that the watcher's settled check
	// had yet to confirm (a rewrite keeping the last line is found only by it): at the
	// next start the file is compared with the mirror, not trusted up to Offset.
	Unsettled bool `json:"unsettled,omitempty"`
	// MTime is the file's modification time (Unix nanoseconds) when its content was last
	// known to match the mirror (opened, or the settled check passed); a file written
	// since, while no watcher ran, is compared with the mirror at the next start. 0 in
	// records written before it was kept.
	MTime int64 `json:"mtime,omitempty"`
	// HeadSeq is the StreamSeq of the last head written to the mirror: a daemon killed
	// after committing a checkpoint but before writing the head rewrites it at start.
	HeadSeq uint64 `json:"head_seq,omitempty"`
	// ShrinkChecked is the generation last compared with the one before it (0: none),
	// and ShrunkFrom, ShrunkMissing and ShrunkReason what that found (ShrunkFrom 0: it
	// lacks nothing), so that a restart knows a shrunk session without reading the mirror.
	ShrinkChecked int    `json:"shrink_checked,omitempty"`
	ShrunkFrom    int    `json:"shrunk_from,omitempty"`
	ShrunkMissing int64  `json:"shrunk_missing,omitempty"`
	ShrunkReason  string `json:"shrunk_reason,omitempty"`
	// DivergedKey, DivergedGen, DivergedOrdinal and DivergedHost say that ConvKey holds
	// the file as a copy of conversation DivergedKey that another host continued past
	// their shared lines (mirror.Divergence), for the heads written after a restart.
	DivergedKey     string    `json:"diverged_key,omitempty"`
	DivergedGen     int       `json:"diverged_gen,omitempty"`
	DivergedOrdinal int64     `json:"diverged_ordinal,omitempty"`
	DivergedHost    string    `json:"diverged_host,omitempty"`
	UpdatedAt       time.Time `json:"updated_at"`
}

// Key is the store key of a file identity.
func Key(dev, ino uint64) string { return fmt.Sprintf("%d:%d", dev, ino) }

// ParseKey is the file identity a store key was made of by Key.
func ParseKey(key string) (dev, ino uint64, err error) {
	d, i, ok := strings.Cut(key, ":")
	if ok {
		if dev, err = strconv.ParseUint(d, 10, 64); err == nil {
			if ino, err = strconv.ParseUint(i, 10, 64); err == nil {
				return dev, ino, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("checkpoint key %q is not dev:ino", key)
}

// Key is the store key of r.
func (r Record) Key() string { return Key(r.Dev, r.Ino) }

// Store is the checkpoint store. It is safe for concurrent use.
type Store struct {
	path    string
	db      *bolt.DB
	metrics *Metrics

	mu    sync.Mutex
	dirty map[string]*Record // staged, not yet committed; nil value = delete
}

// Open opens (or creates) the store in dir. A store that cannot be opened (corrupt, or
// not a database) is moved aside and replaced by an empty one; rebuilt then reports it,
// and the caller falls back on the mirror.
func Open(dir string, m *Metrics) (s *Store, rebuilt bool, err error) {
	if m == nil {
		m = NewMetrics(nil)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("create state directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, "checkpoints.db")
	db, err := openDB(path)
	if err != nil {
		aside := fmt.Sprintf("%s.corrupt-%d", path, time.Now().UnixNano())
		if rerr := os.Rename(path, aside); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return nil, false, fmt.Errorf("open %s: %w (and moving it aside failed: %v)", path, err, rerr)
		}
		m.errors.WithLabelValues("corrupt").Inc()
		db, err = openDB(path)
		if err != nil {
			return nil, false, fmt.Errorf("open %s: %w", path, err)
		}
		rebuilt = true
	}
	return &Store{path: path, db: db, metrics: m, dirty: map[string]*Record{}}, rebuilt, nil
}

func openDB(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true})
	if err != nil {
		return nil, err
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketName)
		return err
	}); err != nil {
		db.Close()
		return nil, err
	}
	// A database that opens may still hold garbage records: check they decode.
	if err := db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketName).ForEach(func(k, v []byte) error {
			var r Record
			return json.Unmarshal(v, &r)
		})
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("corrupt record: %w", err)
	}
	return db, nil
}

// Get returns the record of a file identity, staged or committed.
func (s *Store) Get(key string) (Record, bool) {
	s.mu.Lock()
	if r, ok := s.dirty[key]; ok {
		s.mu.Unlock()
		if r == nil {
			return Record{}, false
		}
		return *r, true
	}
	s.mu.Unlock()
	var rec Record
	var found bool
	_ = s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketName).Get([]byte(key))
		if v != nil && json.Unmarshal(v, &rec) == nil {
			found = true
		}
		return nil
	})
	return rec, found
}

// Put stages r; it is durable after the next Commit.
func (s *Store) Put(r Record) {
	s.mu.Lock()
	s.dirty[r.Key()] = &r
	s.mu.Unlock()
}

// Delete stages the removal of a record.
func (s *Store) Delete(key string) {
	s.mu.Lock()
	s.dirty[key] = nil
	s.mu.Unlock()
}

// All returns every record, staged changes included.
func (s *Store) All() ([]Record, error) {
	var out []Record
	err := s.Each(func(r Record) error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// Each calls fn with every record, staged changes included, one at a time: a pass over
// 100k files that keeps a few of them, without holding them all.
func (s *Store) Each(fn func(Record) error) error {
	return s.each(func(key string, staged *Record, stored []byte) error {
		if staged != nil {
			return fn(*staged)
		}
		var r Record
		if err := json.Unmarshal(stored, &r); err != nil {
			return fmt.Errorf("record %s: %w", key, err)
		}
		return fn(r)
	})
}

// Keys returns the key of every record, staged changes included, without decoding the
// records: for a pass over 100k files that needs a few of them (Get those).
func (s *Store) Keys() ([]string, error) {
	var out []string
	err := s.each(func(key string, _ *Record, _ []byte) error {
		out = append(out, key)
		return nil
	})
	return out, err
}

// each calls fn for every record, staged changes included: with the staged record, or
// with nil and the committed bytes (valid during the call only).
func (s *Store) each(fn func(key string, staged *Record, stored []byte) error) error {
	s.mu.Lock()
	dirty := make(map[string]*Record, len(s.dirty))
	for k, v := range s.dirty {
		dirty[k] = v
	}
	s.mu.Unlock()
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketName).ForEach(func(k, v []byte) error {
			if _, ok := dirty[string(k)]; ok {
				return nil
			}
			return fn(string(k), nil, v)
		})
	})
	if err != nil {
		return err
	}
	for k, r := range dirty {
		if r != nil {
			if err := fn(k, r, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// Commit writes every staged change in one fsynced transaction. On failure the changes
// stay staged for the next attempt.
func (s *Store) Commit() error {
	s.mu.Lock()
	batch := s.dirty
	s.dirty = make(map[string]*Record, len(batch))
	s.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	start := time.Now()
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketName)
		for k, r := range batch {
			if r == nil {
				if err := b.Delete([]byte(k)); err != nil {
					return err
				}
				continue
			}
			v, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(k), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.mu.Lock()
		for k, r := range batch {
			if _, newer := s.dirty[k]; !newer {
				s.dirty[k] = r
			}
		}
		s.mu.Unlock()
		s.metrics.errors.WithLabelValues("commit").Inc()
		return fmt.Errorf("commit checkpoints to %s: %w", s.path, err)
	}
	s.metrics.commits.Inc()
	s.metrics.records.Add(float64(len(batch)))
	s.metrics.duration.Observe(time.Since(start).Seconds())
	return nil
}

// Close commits what is staged and closes the store.
func (s *Store) Close() error {
	err := s.Commit()
	if cerr := s.db.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close %s: %w", s.path, cerr)
	}
	return err
}

// Metrics of the checkpoint store.
type Metrics struct {
	commits  prometheus.Counter
	records  prometheus.Counter
	errors   *prometheus.CounterVec
	duration prometheus.Histogram
}

// NewMetrics declares the store's metrics and registers them on reg; a nil reg leaves
// them unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		commits: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_checkpoint_commits_total",
			Help: "Checkpoint transactions committed to the local store.",
		}),
		records: f.NewCounter(prometheus.CounterOpts{
			Name: "pisync_checkpoint_records_written_total",
			Help: "File checkpoint records written by those transactions.",
		}),
		errors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "pisync_checkpoint_errors_total",
			Help: "Checkpoint store failures by reason (commit, corrupt).",
		}, []string{"reason"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "pisync_checkpoint_commit_duration_seconds",
			Help:    "Time to commit one checkpoint transaction, fsync included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	m.errors.WithLabelValues("commit")
	m.errors.WithLabelValues("corrupt")
	return m
}
