package store

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/pisync/pisync/mirror"
)

// Options configure a Store.
type Options struct {
	Host          string // Pisync-Host of the lines the store writes (default "pisync-store")
	BlobThreshold int64  // lines above go to the object store (default 512 KiB, §2)
	MaxEntryBytes int64  // largest entry accepted (default 64 MiB)
	MaxPayload    int64  // the server's max_payload (default 1 MiB)
	// MaxHeaderBytes bounds a header line (metadata, cwd, parentSession): every reply
	// that carries a conversation's metadata must fit max_payload (default 64 KiB).
	MaxHeaderBytes int64
	MaxConvs       int // conversations whose state a replica caches (default 10,000)
	// HeadRepairGrace is how old the newest entry of a conversation whose head is behind
	// must be before a replica repairs the head: younger, the replica that stored it is
	// most likely writing it after its reply (default 5 s).
	HeadRepairGrace time.Duration
	// Per-owner quotas: conversations (default 100,000), and bytes of uploaded parts
	// waiting for their append on one replica (default 256 MiB). Negative: none.
	MaxConversations int
	MaxPartBytes     int64
	// PartTTL is how long an uploaded part waits for its append before it is deleted
	// (default 1 h); every PartSweep (default 10 min) a replica deletes those older.
	PartTTL, PartSweep time.Duration
	Logger             *zap.Logger
	Metrics            *Metrics // nil: counted on metrics registered nowhere
}

// Store is the session store of DESIGN §8 over the mirror. It holds no state of its own
// that the stream does not hold: its caches are rebuilt from the stream whenever the
// stream is ahead of them, so any number of replicas can serve the same conversations.
type Store struct {
	js    jetstream.JetStream
	names mirror.Names
	bound mirror.Bound
	kv    jetstream.KeyValue
	obj   jetstream.ObjectStore
	opts  Options
	log   *zap.Logger
	m     *Metrics

	// faults, set by tests only (export_test.go), stand for a replica dying or JetStream
	// failing at a chosen step.
	faults faults

	mu     sync.Mutex
	owners map[string]*ownerHandles // tenant.owner tokens → reader and writer
	convs  map[string]*conv         // head key → state
	opened *openCache
	parts  *partLedger
	counts ownerCounts
}

// faults are the steps a test can make fail. A nil func never fails.
type faults struct {
	// forkCopy is called before the copy of the n-th entry (0-based) of a fork.
	forkCopy atomic.Pointer[func(n int) error]
}

type ownerHandles struct {
	reader *mirror.Reader
	writer *mirror.Writer
}

// New binds a Store to the provisioned mirror.
func New(ctx context.Context, js jetstream.JetStream, names mirror.Names, opts Options) (*Store, error) {
	if opts.Host == "" {
		opts.Host = "pisync-store"
	}
	if opts.BlobThreshold <= 0 {
		opts.BlobThreshold = 512 << 10
	}
	if opts.MaxEntryBytes <= 0 {
		opts.MaxEntryBytes = 64 << 20
	}
	if opts.MaxPayload <= 0 {
		opts.MaxPayload = 1 << 20
	}
	if opts.MaxHeaderBytes <= 0 {
		opts.MaxHeaderBytes = 64 << 10
	}
	if opts.HeadRepairGrace <= 0 {
		opts.HeadRepairGrace = 5 * time.Second
	}
	if opts.MaxConversations == 0 {
		opts.MaxConversations = 100_000
	}
	if opts.MaxPartBytes == 0 {
		opts.MaxPartBytes = 256 << 20
	}
	if opts.PartTTL <= 0 {
		opts.PartTTL = time.Hour
	}
	if opts.PartSweep <= 0 {
		opts.PartSweep = 10 * time.Minute
	}
	if opts.MaxConvs <= 0 {
		opts.MaxConvs = 10000
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	bound, err := mirror.Bind(ctx, js, names)
	if err != nil {
		return nil, err
	}
	kv, obj := bound.Heads, bound.Blobs
	return &Store{js: js, names: names, bound: bound, kv: kv, obj: obj, opts: opts, log: opts.Logger, m: opts.Metrics,
		owners: map[string]*ownerHandles{}, convs: map[string]*conv{}, opened: newOpenCache(64 << 20),
		parts: newPartLedger(), counts: ownerCounts{n: map[string]ownerCount{}}}, nil
}

// handles returns the mirror reader and writer of an owner, binding them on first use.
// Binding costs a few API calls, so they are kept; their number is bounded by MaxConvs.
func (s *Store) handles(o mirror.Owner) *ownerHandles {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := o.KeyPrefix()
	if h, ok := s.owners[key]; ok {
		return h
	}
	if len(s.owners) >= s.opts.MaxConvs {
		for k := range s.owners {
			delete(s.owners, k)
			break
		}
	}
	h := &ownerHandles{reader: s.bound.Reader(o), writer: s.bound.Writer(o)}
	s.owners[key] = h
	return h
}

// conv returns the cached state of a conversation, locked. The caller unlocks it.
func (s *Store) conv(c mirror.Conv) *conv {
	s.mu.Lock()
	st, ok := s.convs[c.HeadKey()]
	if !ok {
		if len(s.convs) >= s.opts.MaxConvs {
			for k, v := range s.convs {
				if v.mu.TryLock() { // never evict a conversation in use
					delete(s.convs, k)
					v.mu.Unlock()
					break
				}
			}
		}
		st = &conv{c: c}
		s.convs[c.HeadKey()] = st
	}
	s.mu.Unlock()
	st.mu.Lock()
	return st
}

// forget drops a conversation's cached state (after delete).
func (s *Store) forget(c mirror.Conv) {
	s.mu.Lock()
	delete(s.convs, c.HeadKey())
	s.mu.Unlock()
}

func zapConv(c *conv) zap.Field { return zap.String("conversation", c.c.Key) }

func zapErr(err error) zap.Field { return zap.Error(err) }
