package store

import (
	"encoding/json"
	"fmt"
)

// The request and reply bodies of docs/store-protocol.md. Field names are the wire names.

// Ops are the operations of the service, in the order of the protocol document.
var Ops = []string{"create", "list", "open", "append", "fork", "delete"}

// Error codes of the protocol.
const (
	CodeNotFound    = "not_found"
	CodeConflict    = "conflict"
	CodeInvalid     = "invalid"
	CodeTooLarge    = "too_large"
	CodeUnavailable = "unavailable"
	CodeOK          = "ok" // metrics label of a successful request
)

// Conflict reasons.
const (
	ReasonHead        = "head"
	ReasonEntryExists = "entry_exists"
	ReasonExists      = "exists"
)

// Reasons of too_large: what was above which limit.
const (
	ReasonEntry  = "entry"  // an entry above the entry limit
	ReasonHeader = "header" // a header line above the header limit
	// Per-owner quotas.
	ReasonConversations = "conversations" // the owner has as many conversations as allowed
	ReasonParts         = "parts"         // the owner has as many bytes waiting in parts as allowed
)

// Error is a failed request: the error object of a reply.
type Error struct {
	Code    string  `json:"code"`
	Reason  string  `json:"reason,omitempty"`
	Message string  `json:"message"`
	Head    *string `json:"head,omitempty"`  // conflict only; a null head is written as null
	Limit   int64   `json:"limit,omitempty"` // too_large only

	headSet bool // Head is meaningful (conflict), even when it is null
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// MarshalJSON writes "head": null for a conflict on a null head.
func (e *Error) MarshalJSON() ([]byte, error) {
	type plain Error
	if e.Code != CodeConflict || !e.headSet {
		return json.Marshal((*plain)(e))
	}
	return json.Marshal(struct {
		*plain
		Head *string `json:"head"`
	}{(*plain)(e), e.Head})
}

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// tooLarge is the too_large error of what (a size or a count) at n, above limit.
func tooLarge(reason, what string, n, limit int64) *Error {
	e := errorf(CodeTooLarge, "%s: %d, the limit is %d", what, n, limit)
	e.Reason, e.Limit = reason, limit
	return e
}

func conflict(reason string, head string, format string, args ...any) *Error {
	e := errorf(CodeConflict, format, args...)
	e.Reason, e.Head, e.headSet = reason, headPtr(head), true
	return e
}

// httpCode is the Nats-Service-Error-Code header of an error code.
func httpCode(code string) string {
	switch code {
	case CodeNotFound:
		return "404"
	case CodeConflict:
		return "409"
	case CodeInvalid:
		return "400"
	case CodeTooLarge:
		return "413"
	}
	return "503"
}

// headPtr maps the internal head ("" = null) to its wire form.
func headPtr(h string) *string {
	if h == "" {
		return nil
	}
	return &h
}

// Meta is the metadata of a conversation in replies.
type Meta struct {
	ID                string          `json:"id"`
	CreatedAt         string          `json:"createdAt"`
	Cwd               string          `json:"cwd"`
	ParentSessionPath string          `json:"parentSessionPath,omitempty"`
	Metadata          json.RawMessage `json:"metadata,omitempty"`
	Path              string          `json:"path"`
	Writer            string          `json:"writer"`
	Generation        int             `json:"generation"`
	Entries           int64           `json:"entries"`
	Head              *string         `json:"head"`
	LastSeq           uint64          `json:"lastSeq"`
	// MetadataOmitted says that metadata was left out: with it the reply would not fit
	// max_payload (a daemon-mirrored header can be of any size; create bounds it).
	MetadataOmitted bool `json:"metadataOmitted,omitempty"`
}

type createReq struct {
	Line string `json:"line"`
}

type listReq struct {
	Cwd    string `json:"cwd,omitempty"`
	Offset int    `json:"offset,omitempty"`
}

type openReq struct {
	ID         string `json:"id"`
	Generation int    `json:"generation,omitempty"`
	LastSeq    uint64 `json:"lastSeq,omitempty"`
	After      *int64 `json:"after,omitempty"`
	Ordinal    *int64 `json:"ordinal,omitempty"`
	Offset     int64  `json:"offset,omitempty"`
}

type blobRef struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

type partReq struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Offset int64  `json:"offset"`
	Data   []byte `json:"data"` // base64 on the wire
}

type appendReq struct {
	ID           string          `json:"id"`
	ExpectedHead json.RawMessage `json:"expectedHead"` // string or null; required
	Line         *string         `json:"line,omitempty"`
	Blob         *blobRef        `json:"blob,omitempty"`
	Part         *partReq        `json:"part,omitempty"`
}

type forkReq struct {
	Source   string `json:"source"`
	Line     string `json:"line"`
	EntryID  string `json:"entryId,omitempty"`
	Position string `json:"position,omitempty"`
}

type deleteReq struct {
	ID string `json:"id"`
}

// OpenEntry is one entry of an open reply: the line, or a reference to read in parts.
type OpenEntry struct {
	Ordinal int64   `json:"ordinal"`
	Line    *string `json:"line,omitempty"`
	Raw     bool    `json:"raw,omitempty"`
	Size    int64   `json:"size,omitempty"`
	SHA256  string  `json:"sha256,omitempty"`
}

// AppendReply is the reply of a successful append.
type AppendReply struct {
	OK        bool    `json:"ok"`
	Seq       uint64  `json:"seq"`
	Ordinal   int64   `json:"ordinal"`
	Head      *string `json:"head"`
	Duplicate bool    `json:"duplicate"`
}
