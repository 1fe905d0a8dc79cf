// Package faultnet is a TCP proxy for tests that puts faults between a client
// and a server: latency in either direction, a partition that holds every
// byte back until it heals, and the drop of every connection.
//
// A partition here is what a real one looks like to both ends: connections
// stay open, nothing arrives, and when it heals whatever was sent meanwhile
// is delivered, as TCP's retransmission would deliver it.
package faultnet

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards connections accepted on Addr to a target address. Its
// methods are safe for concurrent use.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu          sync.Mutex
	up, down    time.Duration
	partitioned bool
	closed      bool
	links       map[*link]struct{}

	wg sync.WaitGroup // every goroutine of the proxy
}

// Start listens on a free loopback port and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, links: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetLatency delays every byte from the client to the server by up, and
// from the server to the client by down, from now on.
func (p *Proxy) SetLatency(up, down time.Duration) {
	p.mu.Lock()
	p.up, p.down = up, down
	p.mu.Unlock()
}

// Partition stops forwarding in both directions: connections stay open and
// new ones are accepted, but nothing passes until Heal.
func (p *Proxy) Partition() { p.setPartitioned(true) }

// Heal ends a partition: what was held back is delivered, in order.
func (p *Proxy) Heal() { p.setPartitioned(false) }

func (p *Proxy) setPartitioned(on bool) {
	p.mu.Lock()
	p.partitioned = on
	p.mu.Unlock()
}

// DropAll closes every open connection, on both sides. New connections are
// accepted as before.
func (p *Proxy) DropAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.DropAll()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		l := &link{client: client, server: server, done: make(chan struct{})}
		p.mu.Lock()
		closed := p.closed
		if !closed {
			p.links[l] = struct{}{}
		}
		p.mu.Unlock()
		if closed {
			l.close()
			return
		}
		var pumps sync.WaitGroup
		pumps.Add(2)
		p.wg.Add(3)
		go p.pump(l, client, server, true, &pumps)
		go p.pump(l, server, client, false, &pumps)
		go func() {
			defer p.wg.Done()
			pumps.Wait()
			p.mu.Lock()
			delete(p.links, l)
			p.mu.Unlock()
		}()
	}
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{} // closed with the link
}

func (l *link) close() {
	l.once.Do(func() {
		_ = l.client.Close()
		_ = l.server.Close()
		close(l.done)
	})
}

// chunk is bytes read from one side, with the time they were read.
type chunk struct {
	b  []byte
	at time.Time
}

// pump forwards from src to dst: a reader queues what it reads, stamped;
// the pump delivers each chunk once its direction's latency has passed
// since it was read and no partition holds it back. Either side failing
// closes the whole link.
func (p *Proxy) pump(l *link, src, dst net.Conn, upstream bool, pumps *sync.WaitGroup) {
	defer p.wg.Done()
	defer pumps.Done()
	defer l.close()
	queue := make(chan chunk, 1024)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(queue)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case queue <- chunk{buf[:n], time.Now()}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range queue {
		if !p.hold(l, c.at, upstream) {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

// hold waits until a chunk read at `at` may be delivered: its direction's
// latency has passed and no partition is on. It returns false when the link
// or the proxy closed meanwhile. It looks at the settings at least every
// 5 ms, so that a change (a heal, say) takes effect at once.
func (p *Proxy) hold(l *link, at time.Time, upstream bool) bool {
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		p.mu.Lock()
		delay := p.down
		if upstream {
			delay = p.up
		}
		partitioned, closed := p.partitioned, p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		wait := time.Until(at.Add(delay))
		if !partitioned && wait <= 0 {
			return true
		}
		if partitioned || wait > 5*time.Millisecond {
			wait = 5 * time.Millisecond
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-l.done:
			return false
		}
	}
}
