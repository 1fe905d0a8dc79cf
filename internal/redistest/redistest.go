// Package redistest starts throwaway Redis servers for tests: real
// redis-server processes on free loopback ports, with an embedded miniredis
// as the fallback for tests that only need plain Redis semantics. The
// fallback's clock follows the wall clock (see internal/embedded), so leases
// and other TTLs run out as on a real server.
//
// When redis-server is not on PATH, Start falls back to miniredis and Real
// skips the test, unless DLOCK_REQUIRE_REDIS=1 is set, in which case both fail
// the test instead, so that CI can never pass by skipping.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/embedded"
)

// RequireEnv is the environment variable that turns a missing redis-server
// into a test failure instead of a skip or a miniredis fallback.
const RequireEnv = "DLOCK_REQUIRE_REDIS"

// Server is one Redis server started for tests: a redis-server process, or an
// embedded miniredis when IsReal reports false.
type Server struct {
	Addr string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result once
	dir    string
	port   int
	args   []string // extra redis-server arguments
	mini   *embedded.Server
}

// Available reports whether a redis-server binary is on PATH.
func Available() bool {
	_, err := exec.LookPath("redis-server")
	return err == nil
}

func required() bool { return os.Getenv(RequireEnv) == "1" }

// Real starts a dedicated redis-server for tb and stops it at cleanup. Without
// a redis-server binary it skips tb, or fails it when DLOCK_REQUIRE_REDIS=1.
func Real(tb testing.TB) *Server {
	tb.Helper()
	if !Available() {
		if required() {
			tb.Fatalf("redis-server not on PATH and %s=1", RequireEnv)
		}
		tb.Skipf("needs a real redis-server (not on PATH); set %s=1 to fail instead", RequireEnv)
	}
	s, err := StartProcess(tb.TempDir())
	if err != nil {
		tb.Fatalf("start redis-server: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// Start starts a dedicated server for tb: a real redis-server when one is
// available, else miniredis (or a failure when DLOCK_REQUIRE_REDIS=1).
func Start(tb testing.TB) *Server {
	tb.Helper()
	if Available() || required() {
		return Real(tb)
	}
	m, err := embedded.Start("127.0.0.1:0")
	if err != nil {
		tb.Fatalf("start miniredis: %v", err)
	}
	s := &Server{Addr: m.Addr(), mini: m}
	tb.Cleanup(s.Stop)
	return s
}

// StartProcess starts a redis-server process with no persistence on a free
// loopback port, keeping its files in dir, and waits until it answers PING.
func StartProcess(dir string, args ...string) (*Server, error) {
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind; try again
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{dir: dir, port: port, args: args, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	return nil, lastErr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start() error {
	cmd := exec.Command("redis-server", append([]string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "no",
		"--enable-debug-command", "local",
		"--maxclients", "20000",
		"--loglevel", "warning",
	}, s.args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	// Keep a short tail of the log for error messages; drain the rest so the
	// server never blocks on a full pipe.
	tail := make(chan string, 1)
	go func() {
		var last []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			last = append(last, sc.Text())
			if len(last) > 5 {
				last = last[1:]
			}
		}
		tail <- strings.Join(last, "\n")
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server on port %d exited: %v: %s", s.port, err, <-tail)
		default:
		}
		if ping(s.Addr) == nil {
			s.mu.Lock()
			s.cmd = cmd
			s.exited = exited
			s.mu.Unlock()
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("redis-server on port %d did not answer within 10s", s.port)
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

// IsReal reports whether s is a redis-server process rather than miniredis.
func (s *Server) IsReal() bool { return s.mini == nil }

// Mini returns the embedded miniredis, or nil for a real server. Its clock
// follows the wall clock; do not call its SetTime.
func (s *Server) Mini() *miniredis.Miniredis {
	if s.mini == nil {
		return nil
	}
	return s.mini.Miniredis()
}

// NewClient returns a go-redis client for s, closed at tb's cleanup.
func (s *Server) NewClient(tb testing.TB) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Stop stops the server and waits for it to exit. It is safe to call twice.
func (s *Server) Stop() {
	if s.mini != nil {
		s.mini.Close()
		return
	}
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Restart stops a real server and starts a fresh one on the same port, with
// an empty dataset and an empty script cache.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	if err := s.RestartProcess(); err != nil {
		tb.Fatal(err)
	}
}

// RestartProcess is Restart for a caller without a testing.TB (the torture
// command): it stops a real server and starts a fresh, empty one on the
// same port.
func (s *Server) RestartProcess() error {
	if s.mini != nil {
		return fmt.Errorf("restart needs a real redis-server")
	}
	s.Stop()
	var err error
	for range 50 { // the port may linger briefly after the kill
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("restart redis-server: %w", err)
}

// shared is one server for a whole test package, started on first use and
// stopped by StopShared (call it from TestMain after m.Run).
var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Shared returns the package-wide server, starting it on first use: a real
// redis-server when available, else miniredis (or a failure when
// DLOCK_REQUIRE_REDIS=1). Tests sharing it must use their own key names.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	shared.once.Do(func() {
		if Available() {
			dir, err := os.MkdirTemp("", "redistest-*")
			if err != nil {
				shared.err = err
				return
			}
			shared.srv, shared.err = StartProcess(dir)
			if shared.srv == nil {
				_ = os.RemoveAll(dir)
			}
			return
		}
		if required() {
			shared.err = fmt.Errorf("redis-server not on PATH and %s=1", RequireEnv)
			return
		}
		var m *embedded.Server
		if m, shared.err = embedded.Start("127.0.0.1:0"); shared.err == nil {
			shared.srv = &Server{Addr: m.Addr(), mini: m}
		}
	})
	if shared.err != nil {
		tb.Fatalf("shared redis: %v", shared.err)
	}
	return shared.srv
}

// StopShared stops the package-wide server if one was started.
func StopShared() {
	if shared.srv != nil {
		shared.srv.Stop()
		if shared.srv.dir != "" {
			_ = os.RemoveAll(shared.srv.dir)
		}
	}
}

// Do runs one command against s on a short-lived connection; tests use it for
// fault injection (CLIENT KILL, SCRIPT FLUSH, DEBUG SLEEP).
func (s *Server) Do(ctx context.Context, args ...any) (any, error) {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	return rdb.Do(ctx, args...).Result()
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
