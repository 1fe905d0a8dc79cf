// Package embedded runs an in-process Redis (miniredis) whose clock follows
// the wall clock, so that keys expire as they do on a real server.
//
// A plain miniredis never expires a key unless its clock is moved by hand
// (FastForward), so a lock lease written there never runs out. A Server from
// Start pins miniredis's clock (SetTime) and has miniredis count TTLs down
// against it (ClockTTL), and moves the clock to time.Now() at the start of
// every command a client sends, and every Step from a goroutine besides. The
// contract:
//
//   - TIME (also from a Lua script), PTTL/TTL, the expiry of keys and of hash
//     fields, and the absolute forms (PEXPIREAT, EXPIRETIME, SET PXAT) all
//     read that one clock, so they always agree with each other.
//   - A command sees the wall clock as of its arrival, to the microsecond, or
//     if it has to wait for another client's command or script, as of about
//     when that one ends; so commands sent one after another see TIME
//     strictly increase (dlock orders its queues by TIME). The exception is
//     a connection whose every command so far arrived while another one ran:
//     until the server has seen it idle once, it cannot tell it from a
//     script's own redis.call, which must not wait for the lock its script
//     holds, so such a command sees the clock as last moved, up to Step plus
//     the goroutine's scheduling delay old (or older, behind a long script).
//   - So a key written with PX n is gone for every command arriving from n ms
//     after the write on, and present before, to within that staleness:
//     usually exact to well under a millisecond, a few ms at worst on a
//     loaded machine. Measured, polling every 0.2 ms: PX 300 gone 300.1 to
//     301.1 ms after the SET's reply (redis-server 7.0, which keeps time to
//     the millisecond: 300.6 to 301.8 ms).
//   - The clock does not move while a command, a Lua script or a MULTI/EXEC
//     runs, so a key cannot expire halfway through a script, as on Redis 7.
//     Unlike Redis, TIME and PTTL stand still within a script too (Redis 7.0
//     reports a moving TIME, and a PTTL against it, while keeping the key).
//   - Expiry is lazy, as in Redis: an expired key is removed when a command
//     touches the database. Nothing observable depends on when that happens
//     (miniredis has no keyspace notifications).
//
// The clock is moved by the server's pre-command hook: do not call the
// Miniredis's SetError (it replaces that hook, leaving only the goroutine's
// steps) or SetTime (the next step overwrites it); FastForward still
// shortens every TTL at once. The goroutine stops in Close.
//
// Cost: a move of the clock costs miniredis a pass over every key (sorted)
// at the next command, so each command pays for the number of keys:
// measured, a GET round trip takes about 4 µs longer than on a plain
// miniredis (about 20 µs) with no keys, 14 µs longer at 100 keys, 0.17 ms
// at 1,000 and 1.6 ms at 10,000. Fine for tests and demos, which keep a few
// hundred keys at most; not for loads of keys.
//
// Elsewhere the Server is a plain miniredis, with its limits: no CLIENT
// KILL, DEBUG, WAIT or INFO commandstats, and errors raised inside scripts
// are worded differently (WRONGTYPE comes back as "ERR Error compiling
// script ... WRONGTYPE ...").
package embedded

import (
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// Step is how often the clock of a Server is moved to the wall clock.
const Step = time.Millisecond

// Server is a running miniredis with a real-time clock.
type Server struct {
	mr      *miniredis.Miniredis
	clockMu sync.Mutex // orders the clock's moves, so that it never goes back
	peers   sync.Map   // *server.Peer: client connections seen idle once
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// Start starts a Server listening on addr ("127.0.0.1:0" picks a free
// loopback port; so does an empty addr).
func Start(addr string) (*Server, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	mr := miniredis.NewMiniRedis()
	// Pin the clock before ClockTTL takes it as its baseline. time.Now keeps
	// its monotonic reading, so TTLs count down by monotonic time even if the
	// wall clock is stepped; TIME reports the wall clock.
	mr.SetTime(time.Now())
	mr.ClockTTL(true)
	if err := mr.StartAddr(addr); err != nil {
		return nil, err
	}
	s := &Server{mr: mr, stop: make(chan struct{}), done: make(chan struct{})}
	mr.Server().SetPreHook(s.beforeCommand)
	go s.tick()
	return s, nil
}

// beforeCommand runs before every command: those of client connections,
// and each redis.call of a script, which runs with the Miniredis locked by
// the script itself and so must not wait for that lock. If the lock is free,
// nothing runs, so p is a client connection: the clock moves, and p is
// remembered. If it is held, the clock moves (waiting for the lock) only for
// a connection remembered so; a script's calls are never remembered, as
// they always meet the lock held.
func (s *Server) beforeCommand(p *server.Peer, _ string, _ ...string) bool {
	if s.mr.TryLock() {
		s.mr.Unlock()
		if _, seen := s.peers.LoadOrStore(p, struct{}{}); !seen {
			// Runs on p's own goroutine, as do its disconnect callbacks.
			p.OnDisconnect(func() { s.peers.Delete(p) })
		}
		// A command may take the lock in between: then SetTime waits for
		// it, and the clock moves once it is done.
		s.advance()
	} else if _, ok := s.peers.Load(p); ok {
		s.advance()
	}
	return false // go on with the command
}

// tick moves the clock every Step until Close, for when no command moves
// it: direct reads through the Miniredis, and commands that arrive while
// another runs. miniredis applies the elapsed time to TTLs lazily, at the
// next command that touches a database, so an idle Server costs only the
// wake-ups.
func (s *Server) tick() {
	defer close(s.done)
	t := time.NewTicker(Step)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.advance()
		}
	}
}

func (s *Server) advance() {
	s.clockMu.Lock()
	defer s.clockMu.Unlock()
	s.mr.SetTime(time.Now())
}

// Addr returns the host:port the Server listens on.
func (s *Server) Addr() string { return s.mr.Addr() }

// Miniredis returns the underlying miniredis, for inspection in tests.
func (s *Server) Miniredis() *miniredis.Miniredis { return s.mr }

// Close stops the clock's goroutine, then the server, closing its
// connections. It is safe to call more than once.
func (s *Server) Close() {
	s.once.Do(func() {
		close(s.stop)
		<-s.done
		s.mr.Close()
	})
}
