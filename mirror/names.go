package mirror

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// DefaultPrefix names the objects of a deployment unless configured otherwise.
const DefaultPrefix = "pisync"

var prefixPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// Names derives every JetStream name of one deployment from its prefix, so that several
// deployments can share a NATS system (DESIGN §2).
type Names struct {
	lower string // subjects: <prefix>.entries.…
	upper string // streams, buckets: <PREFIX>_ENTRIES, …
}

// NewNames validates prefix (lower case letters, digits, '_', at most 32) and returns the
// names under it.
func NewNames(prefix string) (Names, error) {
	if !prefixPattern.MatchString(prefix) {
		return Names{}, fmt.Errorf("prefix %q: want lower-case letters, digits and '_', starting with a letter", prefix)
	}
	return Names{lower: prefix, upper: strings.ToUpper(prefix)}, nil
}

// DefaultNames are the names under DefaultPrefix.
func DefaultNames() Names {
	n, _ := NewNames(DefaultPrefix)
	return n
}

// Stream is the entries stream.
func (n Names) Stream() string { return n.upper + "_ENTRIES" }

// HeadsBucket is the KV bucket of conversation heads.
func (n Names) HeadsBucket() string { return n.upper + "_HEADS" }

// HeadsStream is the stream that holds the heads bucket, as JetStream names a bucket's.
func (n Names) HeadsStream() string { return "KV_" + n.HeadsBucket() }

// HeadsSubjectPrefix is what the heads stream puts before a key to make its subject.
func (n Names) HeadsSubjectPrefix() string { return "$KV." + n.HeadsBucket() + "." }

// BlobsBucket is the object store of large payloads.
func (n Names) BlobsBucket() string { return n.upper + "_BLOBS" }

// StreamSubjects is the subject filter of the entries stream.
func (n Names) StreamSubjects() string { return n.lower + ".entries.>" }

// OwnerSubjects matches every conversation of one owner.
func (n Names) OwnerSubjects(o Owner) string {
	return n.lower + ".entries." + o.tenant + "." + o.owner + ".>"
}

// Subject is the subject of one conversation's messages.
func (n Names) Subject(c Conv) string {
	return n.lower + ".entries." + c.Owner.tenant + "." + c.Owner.owner + "." + c.key
}

// Owner is a validated (tenant, owner) pair with its encoded tokens. Everything pisync
// publishes or reads is scoped by one.
type Owner struct {
	Tenant, Name  string
	tenant, owner string
}

// NewOwner encodes tenant and owner; it fails for empty or over-long names.
func NewOwner(tenant, owner string) (Owner, error) {
	t, err := EncodeToken(tenant)
	if err != nil {
		return Owner{}, fmt.Errorf("tenant %q: %w", shorten(tenant), err)
	}
	o, err := EncodeToken(owner)
	if err != nil {
		return Owner{}, fmt.Errorf("owner %q: %w", shorten(owner), err)
	}
	return Owner{Tenant: tenant, Name: owner, tenant: t, owner: o}, nil
}

// InboxPrefix is the reply-subject prefix of this owner's connections. NATS permissions
// can then allow each owner only its own replies (a shared "_INBOX.>" would let any user
// read the answers others get, message contents included).
func (o Owner) InboxPrefix() string { return "_INBOX." + o.tenant + "." + o.owner }

// KeyPrefix is the KV key prefix of this owner's heads ("<tenant>.<owner>.").
func (o Owner) KeyPrefix() string { return o.tenant + "." + o.owner + "." }

// Conv names one mirrored conversation of an owner. Key is the conversation id as found
// in the session header, except when two local files carry the same id: the later one is
// then mirrored under a distinct key (see publisher) so that neither overwrites the other.
type Conv struct {
	Owner Owner
	Key   string // raw conversation key
	key   string // encoded
}

// NewConv encodes a conversation key under owner.
func NewConv(o Owner, key string) (Conv, error) {
	k, err := EncodeToken(key)
	if err != nil {
		return Conv{}, fmt.Errorf("conversation %q: %w", shorten(key), err)
	}
	return Conv{Owner: o, Key: key, key: k}, nil
}

// HeadKey is the conversation's key in the heads bucket.
func (c Conv) HeadKey() string { return c.Owner.KeyPrefix() + c.key }

// MsgID is the Nats-Msg-Id of one line: <tenant>.<owner>.<conversation>.<generation>.<entryId>.
// The entry id is encoded like a token so that an id from a file cannot forge another
// line's message id.
func (c Conv) MsgID(generation int, entryID string) string {
	var buf [128]byte
	return string(appendIDTail(c.appendPath(buf[:0]), generation, entryID))
}

// appendPath appends "<tenant>.<owner>.<conversation>", the tokens that the subject ends
// with and the message id starts with.
func (c Conv) appendPath(b []byte) []byte {
	b = append(b, c.Owner.tenant...)
	b = append(b, '.')
	b = append(b, c.Owner.owner...)
	b = append(b, '.')
	return append(b, c.key...)
}

// appendIDTail appends the message id's tokens after appendPath's: ".<generation>.<entryId>".
func appendIDTail(b []byte, generation int, entryID string) []byte {
	e, err := EncodeToken(entryID)
	if err != nil {
		// Ids are checked before publishing (see ValidEntryID); an id that still fails here
		// falls back to an unambiguous form instead of panicking.
		e = "_invalid"
	}
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(generation), 10)
	b = append(b, '.')
	return append(b, e...)
}

// ObjectName is the object-store name of a blob: owner-scoped and content-addressed.
func (o Owner) ObjectName(sha256hex string) string {
	return o.tenant + "." + o.owner + "." + sha256hex
}

// ValidEntryID reports whether id can appear in message ids and headers.
func ValidEntryID(id string) bool {
	_, err := EncodeToken(id)
	return err == nil && strings.IndexFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f }) < 0
}

// shorten keeps an error message readable when a name is thousands of bytes long.
func shorten(s string) string {
	const keep = 64
	if len(s) <= keep {
		return s
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:keep], len(s))
}

// StoreSubject is the subject of one operation of the session store for owner o:
// <prefix>.store.<tenant>.<owner>.<op> (docs/store-protocol.md).
func (n Names) StoreSubject(o Owner, op string) string {
	return n.lower + ".store." + o.tenant + "." + o.owner + "." + op
}

// StoreService is the subject the session store listens on for op, every owner's.
func (n Names) StoreService(op string) string { return n.lower + ".store.*.*." + op }

// StoreOwners matches every request to the session store of owner o: what o's NATS
// user may publish.
func (n Names) StoreOwners(o Owner) string {
	return n.lower + ".store." + o.tenant + "." + o.owner + ".>"
}

// ParseStoreSubject reads the owner of a session store request subject.
func (n Names) ParseStoreSubject(subject string) (Owner, string, error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 5 || parts[0] != n.lower || parts[1] != "store" {
		return Owner{}, "", fmt.Errorf("subject %q: not a store request", shorten(subject))
	}
	t, err := DecodeToken(parts[2])
	if err != nil {
		return Owner{}, "", fmt.Errorf("subject %q: tenant: %w", shorten(subject), err)
	}
	o, err := DecodeToken(parts[3])
	if err != nil {
		return Owner{}, "", fmt.Errorf("subject %q: owner: %w", shorten(subject), err)
	}
	owner, err := NewOwner(t, o)
	return owner, parts[4], err
}
