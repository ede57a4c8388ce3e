package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pisync/pisync/mirror"
)

// The store torture's client: protocol requests as a runtime sends them, retried with the
// same bytes when no reply comes or the reply is unavailable (as @pisync/pi-session-store
// does), so that every outcome the store acknowledges is seen.

// tReply is every field a store reply may have.
type tReply struct {
	OK    bool `json:"ok"`
	Error *struct {
		Code    string          `json:"code"`
		Reason  string          `json:"reason"`
		Message string          `json:"message"`
		Head    json.RawMessage `json:"head"`
	} `json:"error"`
	Seq        uint64          `json:"seq"`
	Ordinal    int64           `json:"ordinal"`
	Head       *string         `json:"head"`
	Duplicate  bool            `json:"duplicate"`
	Meta       tMeta           `json:"meta"`
	Sessions   []tMeta         `json:"sessions"`
	Generation int             `json:"generation"`
	LastSeq    uint64          `json:"lastSeq"`
	Entries    []tEntry        `json:"entries"`
	Next       json.RawMessage `json:"next"`
	Data       []byte          `json:"data"`
	EOF        bool            `json:"eof"`
}

type tMeta struct {
	ID      string  `json:"id"`
	Entries int64   `json:"entries"`
	Head    *string `json:"head"`
	Path    string  `json:"path"`
}

type tEntry struct {
	Ordinal int64   `json:"ordinal"`
	Line    *string `json:"line"`
	Size    int64   `json:"size"`
	SHA256  string  `json:"sha256"`
}

func (r tReply) code() string {
	switch {
	case r.OK:
		return "ok"
	case r.Error == nil:
		return "?"
	}
	return r.Error.Code
}

// errUndetermined is a request that never got an answer: it may or may not have been
// served.
var errUndetermined = errors.New("no answer after every attempt")

// tClient sends the requests of one owner.
type tClient struct {
	nc         *nats.Conn
	names      mirror.Names
	owner      mirror.Owner
	maxPayload int
	attempts   int
}

// call sends body to op until an answer that is not unavailable; errUndetermined if none.
// lost says whether an attempt went unanswered before the answer (its reply lost).
func (c *tClient) call(op string, body any) (r tReply, lost bool, err error) {
	b, err := json.Marshal(body)
	if err != nil {
		return tReply{}, false, err
	}
	subject := c.names.StoreSubject(c.owner, op)
	for attempt := 0; attempt < c.attempts; attempt++ {
		if attempt > 0 {
			time.Sleep(min(time.Second, 25*time.Millisecond<<attempt)) // the client's backoff
		}
		m, err := c.nc.Request(subject, b, 3*time.Second)
		if err != nil {
			lost = true
			continue
		}
		r = tReply{}
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return tReply{}, lost, fmt.Errorf("%s reply %.200q: %w", op, m.Data, err)
		}
		if r.code() == "unavailable" {
			continue
		}
		return r, lost, nil
	}
	return tReply{}, lost, errUndetermined
}

// appendLine appends line on expected ("" for null): inline when the request fits, else
// in parts and by reference, as the client package does.
func (c *tClient) appendLine(id, expected, line string) (tReply, bool, error) {
	var head any
	if expected != "" {
		head = expected
	}
	if len(line)+len(id)+256 < c.maxPayload/2 {
		return c.call("append", map[string]any{"id": id, "expectedHead": head, "line": line})
	}
	sum := sha256.Sum256([]byte(line))
	sha := hex.EncodeToString(sum[:])
	part := min(512<<10, (c.maxPayload-4096)*3/4) // decoded bytes whose base64 fits a request
	for off := 0; off < len(line); off += part {
		end := min(off+part, len(line))
		r, _, err := c.call("append", map[string]any{"id": id, "part": map[string]any{
			"sha256": sha, "size": len(line), "offset": off, "data": base64.StdEncoding.EncodeToString([]byte(line[off:end]))}})
		if err != nil {
			return r, true, err
		}
		if !r.OK {
			return r, false, nil
		}
	}
	return c.call("append", map[string]any{"id": id, "expectedHead": head, "blob": map[string]any{"sha256": sha, "size": len(line)}})
}

// open reads every entry of a conversation: continuations and parts included. The reply
// is the first one (meta, head); lines are the entries in order, with their ordinals.
func (c *tClient) open(id string) (tReply, []string, []int64, error) {
	first, _, err := c.call("open", map[string]any{"id": id})
	if err != nil || !first.OK {
		return first, nil, nil, err
	}
	var lines []string
	var ordinals []int64
	r := first
	for {
		for _, e := range r.Entries {
			ordinals = append(ordinals, e.Ordinal)
			if e.Line != nil {
				lines = append(lines, *e.Line)
				continue
			}
			var b []byte
			for off := int64(0); ; {
				p, _, err := c.call("open", map[string]any{"id": id, "generation": first.Generation, "lastSeq": first.LastSeq, "ordinal": e.Ordinal, "offset": off})
				if err != nil || !p.OK {
					return first, nil, nil, fmt.Errorf("part %d@%d of %s: %s %v", e.Ordinal, off, id, p.code(), err)
				}
				b = append(b, p.Data...)
				off += int64(len(p.Data))
				if p.EOF {
					break
				}
			}
			lines = append(lines, string(b))
		}
		var next struct {
			After int64 `json:"after"`
		}
		if len(r.Next) == 0 || json.Unmarshal(r.Next, &next) != nil {
			return first, lines, ordinals, nil
		}
		r, _, err = c.call("open", map[string]any{"id": id, "generation": first.Generation, "lastSeq": first.LastSeq, "after": next.After})
		if err != nil || !r.OK {
			return first, nil, nil, fmt.Errorf("continuation of %s after %d: %s %v", id, next.After, r.code(), err)
		}
	}
}

// list reads every page of the owner's conversations.
func (c *tClient) list() ([]tMeta, error) {
	var out []tMeta
	for offset := 0; ; {
		r, _, err := c.call("list", map[string]any{"offset": offset})
		if err == nil && !r.OK {
			err = fmt.Errorf("%s %+v", r.code(), r.Error)
		}
		if err != nil {
			return nil, fmt.Errorf("list at %d: %w", offset, err)
		}
		out = append(out, r.Sessions...)
		var next int
		if len(r.Next) == 0 || json.Unmarshal(r.Next, &next) != nil || next == 0 {
			return out, nil
		}
		offset = next
	}
}
