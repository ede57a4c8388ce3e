package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pisync/pisync/internal/testutil/natstest"
	"github.com/pisync/pisync/mirror"
	"github.com/pisync/pisync/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a JetStream server with the mirror provisioned and store replicas serving it,
// each on its own connection, and a client connection.
type env struct {
	t      *testing.T
	srv    *natstest.Server
	client *nats.Conn
	js     jetstream.JetStream
	names  mirror.Names
	stores []*store.Store
}

func newEnv(t *testing.T, replicas int, opts store.Options) *env {
	t.Helper()
	return newEnvWith(t, replicas, opts, nil)
}

// newEnvWith is newEnv on a server configured by configure (nil: natstest's defaults).
func newEnvWith(t *testing.T, replicas int, opts store.Options, configure func(*server.Options)) *env {
	t.Helper()
	srv := natstest.RunWith(t, configure)
	e := &env{t: t, srv: srv, names: mirror.DefaultNames()}
	e.client = natstest.Connect(t, srv.URL())
	js, err := jetstream.New(e.client)
	if err != nil {
		t.Fatal(err)
	}
	e.js = js
	ctx := ctxFor(t)
	if err := mirror.Provision(ctx, js, e.names, mirror.Config{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < replicas; i++ {
		e.addReplica(opts)
	}
	return e
}

func (e *env) addReplica(opts store.Options) *store.Service {
	e.t.Helper()
	nc := natstest.Connect(e.t, e.srv.URL())
	js, err := jetstream.New(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := store.New(ctxFor(e.t), js, e.names, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	svc, err := s.Serve(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = svc.Stop() })
	e.stores = append(e.stores, s)
	return svc
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// reply is every field a reply may have.
type reply struct {
	OK    bool `json:"ok"`
	Error *struct {
		Code    string          `json:"code"`
		Reason  string          `json:"reason"`
		Message string          `json:"message"`
		Head    json.RawMessage `json:"head"`
	} `json:"error"`
	Seq        uint64            `json:"seq"`
	Ordinal    int64             `json:"ordinal"`
	Head       *string           `json:"head"`
	Duplicate  bool              `json:"duplicate"`
	Received   int64             `json:"received"`
	Meta       store.Meta        `json:"meta"`
	Sessions   []store.Meta      `json:"sessions"`
	Generation int               `json:"generation"`
	LastSeq    uint64            `json:"lastSeq"`
	Entries    []store.OpenEntry `json:"entries"`
	Next       *store.OpenNext   `json:"next"`
	Data       []byte            `json:"data"`
	Size       int64             `json:"size"`
	EOF        bool              `json:"eof"`

	hdrCode string
}

func (r reply) code() string {
	if r.OK {
		return "ok"
	}
	if r.Error == nil {
		return "?"
	}
	return r.Error.Code
}

func (r reply) errHead() string {
	var h *string
	_ = json.Unmarshal(r.Error.Head, &h)
	if h == nil {
		return ""
	}
	return *h
}

// request sends one request as owner and returns the reply message.
func (e *env) request(owner, op string, body any) *nats.Msg {
	e.t.Helper()
	o, err := mirror.NewOwner("t1", owner)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := json.Marshal(body)
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := e.client.Request(e.names.StoreSubject(o, op), b, 20*time.Second)
	if err != nil {
		e.t.Fatalf("%s: %v", op, err)
	}
	return m
}

// reqRaw sends one request as owner and returns the reply's body.
func (e *env) reqRaw(owner, op string, body any) []byte {
	e.t.Helper()
	return e.request(owner, op, body).Data
}

// req sends one request as owner and decodes the reply.
func (e *env) req(owner, op string, body any) reply {
	e.t.Helper()
	m := e.request(owner, op, body)
	var r reply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		e.t.Fatalf("%s reply %q: %v", op, m.Data, err)
	}
	r.hdrCode = m.Header.Get(errorCodeHeader)
	return r
}

const errorCodeHeader = "Nats-Service-Error-Code"

// headerLine is what Pi's JsonlSessionStorage.create writes for id.
func headerLine(id, cwd string) string {
	return fmt.Sprintf(`{"type":"session","version":3,"id":%q,"timestamp":"2026-12-01T18:00:00.000Z","cwd":%q}`, id, cwd)
}

// entryLine is a message entry as Pi's JSON.stringify writes it.
func entryLine(id, parent, text string) string {
	p := "null"
	if parent != "" {
		p = fmt.Sprintf("%q", parent)
	}
	return fmt.Sprintf(`{"type":"message","id":%q,"parentId":%s,"timestamp":"2026-12-01T18:00:01.000Z","message":{"role":"user","content":[{"type":"text","text":%q}],"timestamp":1764612001000}}`, id, p, text)
}

func leafLine(id, parent, target string) string {
	return fmt.Sprintf(`{"type":"leaf","id":%q,"parentId":%q,"timestamp":"2026-12-01T18:00:02.000Z","targetId":%q}`, id, parent, target)
}

func appendReq(id string, head string, line string) map[string]any {
	var h any
	if head != "" {
		h = head
	}
	return map[string]any{"id": id, "expectedHead": h, "line": line}
}

// create makes a conversation and fails the test unless it is ok.
func (e *env) create(owner, id string) {
	e.t.Helper()
	if r := e.req(owner, "create", map[string]any{"line": headerLine(id, "/srv/app")}); !r.OK {
		e.t.Fatalf("create %s: %+v", id, r.Error)
	}
}

// mustAppend appends and fails the test unless it is ok.
func (e *env) mustAppend(owner, id, head, line string) reply {
	e.t.Helper()
	r := e.req(owner, "append", appendReq(id, head, line))
	if !r.OK {
		e.t.Fatalf("append to %s: %+v", id, r.Error)
	}
	return r
}

// openAll reads every entry of a conversation through open continuations and parts.
func (e *env) openAll(owner, id string) (reply, []string) {
	e.t.Helper()
	first := e.req(owner, "open", map[string]any{"id": id})
	if !first.OK {
		return first, nil
	}
	var lines []string
	r := first
	for {
		for _, en := range r.Entries {
			if en.Line != nil {
				lines = append(lines, *en.Line)
				continue
			}
			var b []byte
			for off := int64(0); ; {
				p := e.req(owner, "open", map[string]any{"id": id, "generation": first.Generation, "lastSeq": first.LastSeq, "ordinal": en.Ordinal, "offset": off})
				if !p.OK {
					e.t.Fatalf("part %d@%d: %+v", en.Ordinal, off, p.Error)
				}
				b = append(b, p.Data...)
				off += int64(len(p.Data))
				if p.EOF {
					break
				}
			}
			lines = append(lines, string(b))
		}
		if r.Next == nil {
			return first, lines
		}
		r = e.req(owner, "open", map[string]any{"id": id, "generation": first.Generation, "lastSeq": first.LastSeq, "after": r.Next.After})
		if !r.OK {
			e.t.Fatalf("open continuation: %+v", r.Error)
		}
	}
}

// streamLines are the bodies of a conversation's messages in the stream, with kinds.
func (e *env) streamMsgs(owner, id string) []mirror.Msg {
	e.t.Helper()
	ctx := ctxFor(e.t)
	r, c := e.reader(owner, id)
	var msgs []mirror.Msg
	if err := r.Scan(ctx, c, mirror.ScanOptions{}, func(m mirror.Msg) error {
		msgs = append(msgs, m)
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	return msgs
}

// kvHead is the conversation's head in the heads bucket once it has caught up with the
// stream: an append's reply may come before its head is written (appendLine). After a
// deadline it is the head as it is.
func (e *env) kvHead(owner, id string) mirror.Head {
	e.t.Helper()
	r, c := e.reader(owner, id)
	ctx := ctxFor(e.t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, _, err := r.Head(ctx, c)
		if err != nil {
			e.t.Fatal(err)
		}
		last, err := r.LastSeq(ctx, c)
		if err != nil {
			e.t.Fatal(err)
		}
		if h.LastSeq >= last || time.Now().After(deadline) {
			return h
		}
		time.Sleep(time.Millisecond) // the interval of a poll with a deadline
	}
}

// kvHeadNow is the conversation's head in the heads bucket as it is.
func (e *env) kvHeadNow(owner, id string) mirror.Head {
	e.t.Helper()
	r, c := e.reader(owner, id)
	h, _, err := r.Head(ctxFor(e.t), c)
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

func (e *env) reader(owner, id string) (*mirror.Reader, mirror.Conv) {
	e.t.Helper()
	o, _ := mirror.NewOwner("t1", owner)
	r, err := mirror.NewReader(ctxFor(e.t), e.js, e.names, o)
	if err != nil {
		e.t.Fatal(err)
	}
	c, _ := r.Conv(id)
	return r, c
}
