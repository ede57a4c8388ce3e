package store

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/zap"
)

// Service names of docs/store-protocol.md.
const (
	ServiceName     = "pisync-store"
	QueueGroup      = "pisync-store"
	ProtocolVersion = "1.0.0"
	// InboxPrefix is the reply prefix of the service's own connection, so that NATS
	// permissions can give it its own replies and no owner's (deploy/nats).
	InboxPrefix = "_INBOX_PISYNC_STORE"
)

// requestTimeout bounds the work on one request; a client waiting longer retries anyway.
const requestTimeout = 30 * time.Second

// maxConcurrent bounds the requests one replica works on at once. micro delivers the
// requests of an endpoint one after the other; each is handed to a goroutine so that a
// slow conversation does not hold up the others.
const maxConcurrent = 256

// Service is the store answering on NATS.
type Service struct {
	svc    micro.Service
	ctx    context.Context
	cancel context.CancelFunc
	sem    chan struct{}

	mu      sync.Mutex // orders wg.Add before Stop's wg.Wait
	stopped bool
	wg      sync.WaitGroup
	swept   chan struct{} // closed when the sweep of expired parts has ended
}

// Serve registers the store as the micro service pisync-store on nc and answers until
// Stop.
func (s *Store) Serve(nc *nats.Conn) (*Service, error) {
	ctx, cancel := context.WithCancel(context.Background())
	sv := &Service{ctx: ctx, cancel: cancel, sem: make(chan struct{}, maxConcurrent), swept: make(chan struct{})}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     ProtocolVersion,
		Description: "pisync session store (docs/store-protocol.md)",
		QueueGroup:  QueueGroup,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("add service %s: %w", ServiceName, err)
	}
	sv.svc = svc
	go func() {
		defer close(sv.swept)
		s.sweepParts(ctx)
	}()
	for _, op := range Ops {
		op := op
		h := micro.HandlerFunc(func(r micro.Request) {
			sv.mu.Lock()
			if sv.stopped { // delivered while stopping: another replica answers the retry
				sv.mu.Unlock()
				return
			}
			sv.wg.Add(1)
			sv.mu.Unlock()
			sv.sem <- struct{}{}
			go func() {
				defer func() { <-sv.sem; sv.wg.Done() }()
				s.handle(sv.ctx, nc, op, r)
			}()
		})
		if err := svc.AddEndpoint(op, h, micro.WithEndpointSubject(s.names.StoreService(op))); err != nil {
			_ = svc.Stop()
			cancel()
			return nil, fmt.Errorf("add endpoint %s: %w", op, err)
		}
	}
	// The subscriptions are in place on the server once this round trip is over: only
	// then is the replica ready (a request before could find no responders).
	if err := nc.Flush(); err != nil {
		_ = sv.Stop()
		return nil, fmt.Errorf("add service %s: %w", ServiceName, err)
	}
	return sv, nil
}

// Stop unsubscribes (draining what NATS delivered) and waits for the requests at work.
func (sv *Service) Stop() error {
	err := sv.svc.Stop()
	sv.mu.Lock()
	sv.stopped = true
	sv.mu.Unlock()
	sv.wg.Wait()
	sv.cancel()
	<-sv.swept
	return err
}

// Stopped reports whether the service has stopped (the connection closed under it).
func (sv *Service) Stopped() bool { return sv.svc.Stopped() }

// handle answers one request. It runs on its own goroutine, after the micro handler has
// returned: it must not call the request's Respond or Error, which write fields that
// micro reads once the handler returns (a data race). It publishes the reply on nc
// instead, with micro's error headers; micro's own stats therefore count requests but
// not errors (pisync_store_requests_total has the codes).
func (s *Store) handle(ctx context.Context, nc *nats.Conn, op string, r micro.Request) {
	start := time.Now()
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	later := func() {}
	defer func() { later() }() // once the reply is sent: the head an append left to write
	reply, e := s.dispatch(ctx, op, r, &later)
	msg := &nats.Msg{Subject: r.Reply()}
	if e == nil {
		var err error
		if r, ok := reply.(interface{ replyJSON() ([]byte, error) }); ok {
			msg.Data, err = r.replyJSON() // encoded as it was built (open's entries)
		} else {
			msg.Data, err = json.Marshal(reply)
		}
		if err != nil {
			s.log.Error("encode reply", zap.String("op", op), zap.Error(err))
			e = errorf(CodeUnavailable, "%s: the reply could not be encoded", op)
		} else if limit := nc.MaxPayload(); int64(len(msg.Data)) > limit {
			// Sent, it would be refused by the connection and the client would wait for
			// nothing: it is told instead, and it counts as the error it is.
			s.log.Warn("reply above max_payload", zap.String("op", op), zap.String("subject", r.Subject()),
				zap.Int("bytes", len(msg.Data)), zap.Int64("max_payload", limit))
			e = errorf(CodeUnavailable, "%s: a reply of %d bytes, above max_payload (%d)", op, len(msg.Data), limit)
		}
	}
	code := CodeOK
	if e != nil {
		code = e.Code
		msg.Data, _ = json.Marshal(struct {
			OK    bool   `json:"ok"`
			Error *Error `json:"error"`
		}{false, e})
		msg.Header = nats.Header{micro.ErrorHeader: {e.Message}, micro.ErrorCodeHeader: {httpCode(e.Code)}}
		if e.Code == CodeUnavailable {
			s.log.Warn("request failed", zap.String("op", op), zap.String("subject", r.Subject()), zap.String("error", e.Message))
		}
	} else if op == "append" {
		s.m.appendLat.Observe(time.Since(start).Seconds())
	}
	// Counted before the reply leaves: a client that has its answer finds it in /metrics.
	s.m.requests.WithLabelValues(op, code).Inc()
	if err := nc.PublishMsg(msg); err != nil {
		s.m.unsent.WithLabelValues(op).Inc()
		s.log.Warn("reply not sent", zap.String("op", op), zap.String("subject", r.Subject()), zap.String("code", code), zap.Error(err))
	}
}

// okReply wraps a successful reply's fields with "ok": true.
type okReply map[string]any

// dispatch answers one request; work that may wait until the reply is sent (an append's
// head update) is left in *later.
func (s *Store) dispatch(ctx context.Context, op string, r micro.Request, later *func()) (any, *Error) {
	o, _, err := s.names.ParseStoreSubject(r.Subject())
	if err != nil {
		return nil, errorf(CodeInvalid, "%v", err)
	}
	decode := func(v any) *Error {
		if err := json.Unmarshal(r.Data(), v); err != nil {
			return errorf(CodeInvalid, "%s request: %v", op, err)
		}
		return nil
	}
	switch op {
	case "create":
		var req createReq
		if e := decode(&req); e != nil {
			return nil, e
		}
		seq, meta, e := s.Create(ctx, o, []byte(req.Line))
		if e != nil {
			return nil, e
		}
		return okReply{"ok": true, "seq": seq, "meta": meta}, nil
	case "list":
		var req listReq
		if len(r.Data()) > 0 {
			if e := decode(&req); e != nil {
				return nil, e
			}
		}
		sessions, next, e := s.List(ctx, o, req)
		if e != nil {
			return nil, e
		}
		rep := okReply{"ok": true, "sessions": sessions}
		if sessions == nil {
			rep["sessions"] = []Meta{}
		}
		if next > 0 {
			rep["next"] = next
		}
		return rep, nil
	case "open":
		var req openReq
		if e := decode(&req); e != nil {
			return nil, e
		}
		if e := needID(op, "id", req.ID); e != nil {
			return nil, e
		}
		if req.Ordinal != nil {
			return s.OpenPart(ctx, o, req)
		}
		return s.Open(ctx, o, req)
	case "append":
		var req appendReq
		if e := decode(&req); e != nil {
			return nil, e
		}
		if e := needID(op, "id", req.ID); e != nil {
			return nil, e
		}
		if req.Part != nil {
			received, e := s.Part(ctx, o, req.ID, *req.Part)
			if e != nil {
				return nil, e
			}
			return okReply{"ok": true, "received": received}, nil
		}
		expected, e := parseExpected(req.ExpectedHead)
		if e != nil {
			return nil, e
		}
		switch {
		case req.Line != nil && req.Blob == nil:
			return s.appendLine(ctx, o, req.ID, expected, []byte(*req.Line), later)
		case req.Blob != nil && req.Line == nil:
			return s.AppendBlob(ctx, o, req.ID, expected, *req.Blob)
		}
		return nil, errorf(CodeInvalid, "append: want one of line, blob or part")
	case "fork":
		var req forkReq
		if e := decode(&req); e != nil {
			return nil, e
		}
		meta, e := s.Fork(ctx, o, req)
		if e != nil {
			return nil, e
		}
		return okReply{"ok": true, "seq": meta.LastSeq, "meta": meta}, nil
	case "delete":
		var req deleteReq
		if e := decode(&req); e != nil {
			return nil, e
		}
		if e := needID(op, "id", req.ID); e != nil {
			return nil, e
		}
		if e := s.Delete(ctx, o, req.ID); e != nil {
			return nil, e
		}
		return okReply{"ok": true}, nil
	}
	return nil, errorf(CodeInvalid, "unknown operation %q", op)
}

// needID refuses a request that does not name its conversation.
func needID(op, field, id string) *Error {
	if id == "" {
		return errorf(CodeInvalid, "%s: %s is required", op, field)
	}
	return nil
}

// parseExpected reads expectedHead: a string, or null for no head. It is required, so
// that a client cannot append without saying where.
func parseExpected(raw json.RawMessage) (string, *Error) {
	if len(raw) == 0 {
		return "", errorf(CodeInvalid, "append: expectedHead is required (a string, or null)")
	}
	if string(raw) == "null" {
		return "", nil
	}
	var h string
	if err := json.Unmarshal(raw, &h); err != nil || h == "" {
		return "", errorf(CodeInvalid, "append: expectedHead must be a non-empty string or null")
	}
	return h, nil
}
