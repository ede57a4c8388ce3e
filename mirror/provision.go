package mirror

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultDuplicateWindow is the stream's duplicate window: a retry aid measured in minutes,
// since the server keeps every id of the window in memory and reads the window back at
// start-up. Exactly-once never rests on it (DESIGN §3.2).
const DefaultDuplicateWindow = 20 * time.Minute

// Config sizes the mirror's objects.
type Config struct {
	Replicas        int           // 1 embedded, 3 in a cluster
	DuplicateWindow time.Duration // default DefaultDuplicateWindow
	MaxMsgSize      int32         // 0 = server limit
}

// Provision creates or updates the stream, the heads bucket and the blobs bucket. It is
// idempotent, so every daemon start calls it.
func Provision(ctx context.Context, js jetstream.JetStream, n Names, cfg Config) error {
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.DuplicateWindow <= 0 {
		cfg.DuplicateWindow = DefaultDuplicateWindow
	}
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        n.Stream(),
		Description: "pisync: one message per mirrored Pi session line",
		Subjects:    []string{n.StreamSubjects()},
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
		AllowDirect: true,
		MaxMsgSize:  cfg.MaxMsgSize,
		Discard:     jetstream.DiscardOld,
		Retention:   jetstream.LimitsPolicy,
	})
	if err != nil {
		return fmt.Errorf("provision stream %s: %w", n.Stream(), err)
	}
	_, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      n.HeadsBucket(),
		Description: "pisync: metadata and head of each mirrored conversation",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("provision key-value bucket %s: %w", n.HeadsBucket(), err)
	}
	_, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      n.BlobsBucket(),
		Description: "pisync: payloads of lines too large for one message",
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("provision object store %s: %w", n.BlobsBucket(), err)
	}
	return nil
}
