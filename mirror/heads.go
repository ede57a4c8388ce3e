package mirror

import (
	"encoding/json"
	"fmt"
	"time"
)

// Head is the value of a conversation's key in the heads bucket: its metadata and how far
// it is mirrored. It is written after acknowledgements, with compare-and-set on the revision.
type Head struct {
	Conversation string `json:"conversation"`            // header id
	Key          string `json:"key"`                     // conversation key (differs from the id after a clash)
	Tenant       string `json:"tenant"`                  //
	Owner        string `json:"owner"`                   //
	Host         string `json:"host"`                    //
	Root         string `json:"root"`                    // the watched root the file was under
	Source       string `json:"source"`                  // path relative to Root
	Cwd          string `json:"cwd,omitempty"`           // from the header
	Format       string `json:"format"`                  //
	Generation   int    `json:"generation"`              //
	Entries      int64  `json:"entries"`                 // lines mirrored in this generation, header included
	LastOrdinal  int64  `json:"last_ordinal"`            //
	LastSeq      uint64 `json:"last_seq"`                // stream sequence of the last acknowledged line
	Bytes        int64  `json:"bytes"`                   // file bytes mirrored (newlines included)
	Head         string `json:"head"`                    // the leaf after the last mirrored line (DESIGN §1)
	LocalDeleted bool   `json:"local_deleted,omitempty"` //
	// Headerless: the file has no header line (Pi recreated it, or appended to it, without
	// one): its id is its file name's, and recovery writes its lines after a header.
	Headerless bool      `json:"headerless,omitempty"`
	UpdatedAt  time.Time `json:"updated_at"` //
	// Shrunk is set while Generation lacks entries of the generation before it (the
	// file was overwritten by a fresh header, cut back, or rewritten without some of its
	// lines): the user's data is in the generation it names (History).
	Shrunk *Shrink `json:"shrunk,omitempty"`

	// Written by the session store (DESIGN §8). Writer is WriterStore from the store's
	// first write on: the daemon then no longer extends this generation.
	Writer        string          `json:"writer,omitempty"`
	CreatedAt     string          `json:"created_at,omitempty"`     // header timestamp
	ParentSession string          `json:"parent_session,omitempty"` // header parentSession
	Metadata      json.RawMessage `json:"metadata,omitempty"`       // header metadata, exact bytes

	// Local is written by the daemon into a head the store writes, never over the rest
	// of it: the local file of the conversation was appended to after the store took it
	// over, and those lines are mirrored as a generation of their own (DESIGN §8).
	Local *LocalCopy `json:"local,omitempty"`

	// DivergedFrom is set on the key a host's copy of a conversation is mirrored under
	// once another host continued that conversation past the lines the two copies share
	// (an old primary and its standby both appended): the conversation's own key keeps
	// the other host's lines, this one the whole of this host's file.
	DivergedFrom *Divergence `json:"diverged_from,omitempty"`
}

// Divergence says where a copy of a conversation left it: lines 0 to Ordinal-1 of
// generation Generation of conversation Key are the copy's first lines as well; Host
// continued Key there with lines of its own, and the copy with others.
type Divergence struct {
	Key        string `json:"key"`
	Generation int    `json:"generation"`
	Ordinal    int64  `json:"ordinal"`
	Host       string `json:"host"`
}

// LocalCopy is how far the daemon mirrors the local file of a conversation the session
// store writes, as a generation apart from the store's.
type LocalCopy struct {
	Host       string    `json:"host"`
	Root       string    `json:"root"`
	Source     string    `json:"source"`
	Generation int       `json:"generation"`
	Entries    int64     `json:"entries"`  // lines mirrored in Generation, header included
	LastSeq    uint64    `json:"last_seq"` //
	Bytes      int64     `json:"bytes"`    // file bytes mirrored (newlines included)
	UpdatedAt  time.Time `json:"updated_at"`
}

// StoreWrites reports whether the session store writes the conversation: the daemon
// then no longer extends generation h.Generation (DESIGN §8, one writer at a time).
func (h Head) StoreWrites() bool { return h.Writer == WriterStore && h.Generation > 0 }

// WriterStore is Head.Writer of a conversation the session store writes.
const WriterStore = "store"

// ConvKey is the conversation's key in the mirror: Key, or the header id for a head
// written before keys were recorded.
func (h Head) ConvKey() string {
	if h.Key != "" {
		return h.Key
	}
	return h.Conversation
}

// EncodeHead is the bucket value of h.
func EncodeHead(h Head) []byte {
	b, _ := json.Marshal(h) // a struct of plain fields cannot fail to marshal
	return b
}

// DecodeHead parses a bucket value.
func DecodeHead(b []byte) (Head, error) {
	var h Head
	if err := json.Unmarshal(b, &h); err != nil {
		return Head{}, fmt.Errorf("decode head: %w", err)
	}
	return h, nil
}
