package natstest

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy relays TCP between clients and a server, and can hold back what the server
// sends: the connection stays up and the server keeps storing what clients publish,
// but nothing comes back (acknowledgements, replies, PONGs) until Release — a server
// too busy to answer in time, without a disconnection.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	held    chan struct{} // non-nil while held; closed by Release
	conns   []net.Conn
	wg      sync.WaitGroup
	stopped bool
}

// NewProxy relays a free loopback port to target (host:port); it stops when the test
// ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.stop)
	return p
}

// URL is the client URL of the proxy.
func (p *Proxy) URL() string { return fmt.Sprintf("nats://%s", p.ln.Addr()) }

// Hold stops relaying what the server sends until Release.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

// Release sends on what was held back, and everything after it.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.wg.Add(2)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(s, c)
			s.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.relayHeld(c, s)
			c.Close()
		}()
	}
}

// relayHeld copies from the server to the client, waiting while held.
func (p *Proxy) relayHeld(c, s net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			p.mu.Lock()
			held := p.held
			p.mu.Unlock()
			if held != nil {
				<-held
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) stop() {
	p.mu.Lock()
	p.stopped = true
	conns := p.conns
	p.mu.Unlock()
	p.Release()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}
