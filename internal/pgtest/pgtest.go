// Package pgtest starts throwaway PostgreSQL servers for tests: a real
// postgres process per server, initialized with initdb into a temporary
// directory (trust authentication, no fsync), listening on a free loopback
// port and on a unix socket in that directory.
//
// The binaries are looked up on PATH (initdb, then postgres beside it) and
// then under /usr/lib/postgresql/<version>/bin, the newest version first, as
// Debian installs them. When they are missing, Start and Shared skip the
// test, unless DLOCK_REQUIRE_POSTGRES=1 is set, in which case they fail it,
// so that CI can never pass by skipping.
//
// PostgreSQL refuses to run as root. Run as root, pgtest runs initdb and
// postgres as the "postgres" OS user (it exists wherever Debian's package is
// installed), hands that user the data directory, and lets it traverse the
// directories above it.
//
// A server never touches a PostgreSQL already running on the machine: it has
// its own data directory, port and socket directory.
package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RequireEnv is the environment variable that turns missing PostgreSQL
// binaries into a test failure instead of a skip.
const RequireEnv = "DLOCK_REQUIRE_POSTGRES"

// Superuser is the database superuser every server is initialized with; the
// DSN connects as it, with no password.
const Superuser = "postgres"

const (
	startTimeout = 30 * time.Second
	stopTimeout  = 10 * time.Second
	// socketPathMax is the longest unix socket path Linux accepts, less one
	// for the terminating NUL.
	socketPathMax = 107
)

// Server is one running postgres process.
type Server struct {
	// DSN connects to the "postgres" database as Superuser over TCP, for
	// example "postgres://postgres@127.0.0.1:40123/postgres?sslmode=disable".
	DSN string
	// Addr is the TCP address, "127.0.0.1:<port>".
	Addr string
	// SocketDir holds the unix socket .s.PGSQL.<port>.
	SocketDir string
	// DataDir is the cluster's data directory, <dir>/data.
	DataDir string

	port    int
	tempDir string // removed by Stop; "" when the caller owns every directory

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait has returned
	log    *tail
}

// Bin returns the directory holding initdb and postgres, or an error saying
// where it looked.
func Bin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		// PATH often holds symlinks (/usr/local/bin/initdb ->
		// /usr/lib/postgresql/15/bin/initdb); postgres is beside the target.
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if dir := filepath.Dir(p); hasBinaries(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, dir := range dirs {
		if hasBinaries(dir) {
			return dir, nil
		}
	}
	return "", errors.New("initdb and postgres not found on PATH nor under /usr/lib/postgresql/*/bin")
}

func hasBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// version is the major version in /usr/lib/postgresql/<version>/bin, or 0.
func version(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// Available reports whether the PostgreSQL server binaries were found.
func Available() bool {
	_, err := Bin()
	return err == nil
}

func required() bool { return os.Getenv(RequireEnv) == "1" }

// skipOrFail skips tb when the binaries are missing, or fails it when
// DLOCK_REQUIRE_POSTGRES=1.
func skipOrFail(tb testing.TB) {
	tb.Helper()
	if _, err := Bin(); err != nil {
		if required() {
			tb.Fatalf("%v, and %s=1", err, RequireEnv)
		}
		tb.Skipf("needs PostgreSQL server binaries (%v); set %s=1 to fail instead", err, RequireEnv)
	}
}

// Start starts a dedicated server for tb, in tb.TempDir(), and stops it at
// cleanup. Without the binaries it skips tb, or fails it when
// DLOCK_REQUIRE_POSTGRES=1. It takes a second or two, most of it initdb:
// tests that can share one server should use Shared.
func Start(tb testing.TB) *Server {
	tb.Helper()
	skipOrFail(tb)
	s, err := StartProcess(tb.TempDir())
	if err != nil {
		tb.Fatalf("start postgres: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// StartProcess initializes a cluster in dir/data, starts postgres on a free
// loopback port with its socket in dir (or in a short temporary directory
// when dir's path is too long for a socket), and waits until it accepts
// connections. The caller must call Stop.
func StartProcess(dir string) (*Server, error) {
	bin, err := Bin()
	if err != nil {
		return nil, err
	}
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	s := &Server{DataDir: filepath.Join(dir, "data"), SocketDir: dir}
	if len(dir)+len("/.s.PGSQL.65535") > socketPathMax {
		if s.SocketDir, err = os.MkdirTemp("", "pg"); err != nil {
			return nil, err
		}
		s.tempDir = s.SocketDir
	}
	fail := func(err error) (*Server, error) {
		if s.tempDir != "" {
			_ = os.RemoveAll(s.tempDir)
		}
		return nil, err
	}
	if err := handOver(cred, dir, s.SocketDir); err != nil {
		return fail(err)
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.DataDir, "-U", Superuser,
		"--auth=trust", "--no-sync", "--no-locale", "--encoding=UTF8")
	initdb.Env = childEnv()
	initdb.SysProcAttr = sysProcAttr(cred, syscall.SIGKILL)
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %v\n%s", err, out))
	}
	for range 5 { // a free port can be taken between probe and bind; try again
		if s.port, err = freePort(); err != nil {
			break
		}
		if err = s.start(bin, cred); err == nil {
			s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
			s.DSN = fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", Superuser, s.Addr)
			return s, nil
		}
	}
	return fail(err)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// childEnv is the environment of initdb and postgres: the test's, with a C
// locale, and without PG* variables that could point them elsewhere.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "LC_") && !strings.HasPrefix(kv, "LANG=") {
			env = append(env, kv)
		}
	}
	return append(env, "LC_ALL=C")
}

func (s *Server) start(bin string, cred *credential) error {
	cmd := exec.Command(filepath.Join(bin, "postgres"),
		"-D", s.DataDir,
		"-p", strconv.Itoa(s.port),
		"-k", s.SocketDir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB",
		"-c", "max_connections=200",
		"-c", "logging_collector=off",
		"-c", "log_min_messages=warning",
	)
	cmd.Env = childEnv()
	cmd.SysProcAttr = sysProcAttr(cred, syscall.SIGQUIT)
	log := &tail{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()

	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("postgres on port %d exited: %s", s.port, log)
		default:
		}
		if s.ready() {
			s.mu.Lock()
			s.cmd, s.exited, s.log = cmd, exited, log
			s.mu.Unlock()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopProcess(cmd, exited)
	return fmt.Errorf("postgres on port %d not ready within %v: %s", s.port, startTimeout, log)
}

// ready reports whether postgres accepts connections: the status line of
// postmaster.pid (the 8th, as pg_ctl reads it) says "ready", and the port
// takes a TCP connection.
func (s *Server) ready() bool {
	b, err := os.ReadFile(filepath.Join(s.DataDir, "postmaster.pid"))
	if err != nil {
		return false
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 8 || strings.TrimSpace(lines[7]) != "ready" {
		return false
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)), 200*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// Stop shuts the server down and waits until it and every process it
// started have exited, then removes any directory pgtest made. It is safe to
// call twice.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		stopProcess(cmd, exited)
	}
	if s.tempDir != "" {
		_ = os.RemoveAll(s.tempDir)
	}
}

// stopProcess asks for a fast shutdown (SIGINT: disconnect clients, stop
// the children, exit), falls back to killing, then kills what is left of the
// process group: postgres's children share it, so none outlives the test.
func stopProcess(cmd *exec.Cmd, exited <-chan struct{}) {
	_ = cmd.Process.Signal(os.Interrupt)
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-exited:
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-exited
	}
	killGroup(cmd.Process.Pid)
}

// Log returns the last lines postgres wrote.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return s.log.String()
}

// tail keeps the last few kilobytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailMax = 4 << 10

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailMax {
		t.buf = t.buf[len(t.buf)-tailMax:]
		if i := bytes.IndexByte(t.buf, '\n'); i >= 0 {
			t.buf = t.buf[i+1:]
		}
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}
