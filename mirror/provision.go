package mirror

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultDuplicateWindow is the stream's duplicate window: a retry aid measured in minutes,
// since the server keeps every id of the window in memory and reads the window back at
// start-up. Exactly-once never rests on it (DESIGN §3.2).
const DefaultDuplicateWindow = 20 * time.Minute

// ProvisionMode says what Provision may change.
type ProvisionMode string

// The provisioning modes. A daemon running as a tenant's user should not hold the
// STREAM.UPDATE permission (it could change retention for everyone in the account), so
// by default existing objects are left as they are.
const (
	ProvisionCreate ProvisionMode = "create" // create what is missing, leave the rest alone
	ProvisionUpdate ProvisionMode = "update" // create or update to this configuration
	ProvisionOff    ProvisionMode = "off"    // only check that everything exists
)

// Config sizes the mirror's objects.
type Config struct {
	Mode            ProvisionMode // default ProvisionCreate
	Replicas        int           // 1 embedded, 3 in a cluster
	DuplicateWindow time.Duration // default DefaultDuplicateWindow
	MaxMsgSize      int32         // 0 = server limit
}

// Provision makes sure the stream, the heads bucket and the blobs bucket exist, creating
// them (or updating them, in ProvisionUpdate mode) as cfg says. It is idempotent, so
// every daemon start calls it.
func Provision(ctx context.Context, js jetstream.JetStream, n Names, cfg Config) error {
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.DuplicateWindow <= 0 {
		cfg.DuplicateWindow = DefaultDuplicateWindow
	}
	if cfg.Mode == "" {
		cfg.Mode = ProvisionCreate
	}
	switch cfg.Mode {
	case ProvisionCreate, ProvisionUpdate, ProvisionOff:
	default:
		return fmt.Errorf("provision mode %q: want create, update or off", cfg.Mode)
	}
	sc := jetstream.StreamConfig{
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
	}
	kc := jetstream.KeyValueConfig{
		Bucket:      n.HeadsBucket(),
		Description: "pisync: metadata and head of each mirrored conversation",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}
	oc := jetstream.ObjectStoreConfig{
		Bucket:      n.BlobsBucket(),
		Description: "pisync: payloads of lines too large for one message",
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}
	if cfg.Mode == ProvisionUpdate {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("provision stream %s: %w", sc.Name, err)
		}
		if _, err := js.CreateOrUpdateKeyValue(ctx, kc); err != nil {
			return fmt.Errorf("provision key-value bucket %s: %w", kc.Bucket, err)
		}
		if _, err := js.CreateOrUpdateObjectStore(ctx, oc); err != nil {
			return fmt.Errorf("provision object store %s: %w", oc.Bucket, err)
		}
		return nil
	}
	create := cfg.Mode == ProvisionCreate
	if _, err := js.Stream(ctx, sc.Name); errors.Is(err, jetstream.ErrStreamNotFound) && create {
		if _, err := js.CreateStream(ctx, sc); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s: %w", sc.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("stream %s: %w", sc.Name, err)
	}
	if _, err := js.KeyValue(ctx, kc.Bucket); errors.Is(err, jetstream.ErrBucketNotFound) && create {
		if _, err := js.CreateKeyValue(ctx, kc); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fmt.Errorf("create key-value bucket %s: %w", kc.Bucket, err)
		}
	} else if err != nil {
		return fmt.Errorf("key-value bucket %s: %w", kc.Bucket, err)
	}
	if _, err := js.ObjectStore(ctx, oc.Bucket); (errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)) && create {
		if _, err := js.CreateObjectStore(ctx, oc); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fmt.Errorf("create object store %s: %w", oc.Bucket, err)
		}
	} else if err != nil {
		return fmt.Errorf("object store %s: %w", oc.Bucket, err)
	}
	return nil
}
