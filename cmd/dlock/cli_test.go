//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

// Process tests: they build the dlock binary once and run it, as a shell
// would, against a redis-server each test starts (internal/redistest). The
// commands dlock runs are sh scripts, or this test binary itself in a child
// mode (see childMain) where timestamps must be exact.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// childEnv makes the test binary, run by dlock, act as a command instead of
// running the tests.
const childEnv = "DLOCK_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(childMain(mode, os.Args[1:]))
	}
	code := m.Run()
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
	os.Exit(code)
}

// childMain is the command of the interval mode: "interval FILE HOLD"
// appends "start NS TOKEN NAME" to FILE, sleeps HOLD, then appends
// "end NS TOKEN NAME", NS being the wall clock in nanoseconds.
func childMain(mode string, args []string) int {
	if mode != "interval" || len(args) != 2 {
		fmt.Fprintf(os.Stderr, "child: bad mode %q or arguments %q\n", mode, args)
		return 2
	}
	hold, err := time.ParseDuration(args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	f, err := os.OpenFile(args[0], os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer f.Close()
	line := func(what string) {
		// One write each: O_APPEND keeps concurrent writers' lines whole.
		fmt.Fprintf(f, "%s %d %s %s\n", what, time.Now().UnixNano(), os.Getenv("DLOCK_TOKEN"), os.Getenv("DLOCK_NAME"))
	}
	line("start")
	time.Sleep(hold)
	line("end")
	return 0
}

// build is the dlock binary, built on first use.
var build struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// dlockBin returns the path of the dlock binary, building it the first
// time.
func dlockBin(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "dlock-cli-test-")
		if build.err != nil {
			return
		}
		build.path = filepath.Join(build.dir, "dlock")
		args := []string{"build", "-o", build.path}
		if raceEnabled {
			args = append(args, "-race")
		}
		// go test puts its own go command first on PATH.
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			build.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.path
}

// harness runs dlock processes against one Redis.
type harness struct {
	t    *testing.T
	url  string // the Redis URL, passed as $REDIS_URL
	addr string
	dir  string // for scripts' files and the processes' output
	bin  string
}

// procSeq numbers the processes' output files.
var procSeq atomic.Int64

// with returns a copy of h for the subtest t.
func (h *harness) with(t *testing.T) *harness {
	c := *h
	c.t = t
	return &c
}

// newHarness starts a redis-server for t (skipping t without one, unless
// DLOCK_REQUIRE_REDIS=1) and builds dlock.
func newHarness(t *testing.T) *harness {
	t.Helper()
	srv := redistest.Real(t)
	return &harness{t: t, url: "redis://" + srv.Addr + "/0", addr: srv.Addr, dir: t.TempDir(), bin: dlockBin(t)}
}

// proc is one dlock process.
type proc struct {
	h       *harness
	cmd     *exec.Cmd
	outPath string
	errPath string
	done    chan struct{} // closed when it exited
	ended   time.Time     // when Wait returned
	code    int           // its exit status; -1 when a signal killed it
}

// start starts dlock with args, and env added to its environment (which
// dlock passes on to its command).
func (h *harness) start(env []string, args ...string) *proc {
	h.t.Helper()
	return h.startArgv(env, append([]string{h.bin}, args...))
}

// startArgv is start for a command line of its own, which runs dlock.
func (h *harness) startArgv(env []string, argv []string) *proc {
	h.t.Helper()
	n := procSeq.Add(1)
	p := &proc{
		h:       h,
		outPath: filepath.Join(h.dir, fmt.Sprintf("dlock-%d.out", n)),
		errPath: filepath.Join(h.dir, fmt.Sprintf("dlock-%d.err", n)),
		done:    make(chan struct{}),
	}
	stdout, err := os.Create(p.outPath)
	if err != nil {
		h.t.Fatal(err)
	}
	stderr, err := os.Create(p.errPath)
	if err != nil {
		h.t.Fatal(err)
	}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = stdout, stderr
	p.cmd.Dir = h.dir
	p.cmd.Env = append(cleanEnv(), "REDIS_URL="+h.url)
	p.cmd.Env = append(p.cmd.Env, env...)
	if err := p.cmd.Start(); err != nil {
		h.t.Fatalf("start %q: %v", argv, err)
	}
	_ = stdout.Close()
	_ = stderr.Close()
	go func() {
		_ = p.cmd.Wait()
		p.ended = time.Now()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	h.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill() // its command dies with it (Pdeathsig)
			<-p.done
		}
	})
	return p
}

// cleanEnv is the test's environment without what would change dlock's
// behaviour.
func cleanEnv() []string {
	var env []string
	gorace := "atexit_sleep_ms=0" // a -race binary sleeps 1s at exit by default
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "REDIS_URL", "DLOCK_PREFIX", "DLOCK_NAME", "DLOCK_TOKEN", childEnv:
			continue
		case "GORACE":
			gorace = v + " " + gorace
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GORACE="+gorace)
}

// wait waits up to d for p to exit and returns its exit status.
func (p *proc) wait(d time.Duration) int {
	p.h.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		p.h.t.Fatalf("dlock %q still runs after %v; stderr:\n%s", p.cmd.Args[1:], d, p.stderr())
		return 0
	}
}

func (p *proc) stdout() string { return readFile(p.h.t, p.outPath) }
func (p *proc) stderr() string { return readFile(p.h.t, p.errPath) }

// run runs dlock to its end and returns its exit status and output.
func (h *harness) run(args ...string) (code int, stdout, stderr string) {
	h.t.Helper()
	p := h.start(nil, args...)
	code = p.wait(30 * time.Second)
	return code, p.stdout(), p.stderr()
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// file returns a path in the harness's directory.
func (h *harness) file(name string) string { return filepath.Join(h.dir, name) }

// client returns a library Client on the harness's Redis.
func (h *harness) client(opts ...dlock.Option) *dlock.Client {
	rdb := redis.NewClient(&redis.Options{Addr: h.addr})
	c := dlock.New(rdb, opts...)
	h.t.Cleanup(func() { _ = c.Close(); _ = rdb.Close() })
	return c
}

// eventually polls cond every 5ms until it holds, failing t after d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readyScript is sh code that writes the shell's PID to the file $1, once
// everything before it ran (its traps are set).
const readyScript = `echo $$ > "$1.tmp" && mv "$1.tmp" "$1"`

// waitReady waits for the file a readyScript writes and returns the PID in
// it.
func waitReady(t *testing.T, p *proc, path string) int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("ready file %s: %v", path, err)
			}
			return pid
		}
		select {
		case <-p.done:
			t.Fatalf("dlock exited with %d before its command was ready; stderr:\n%s", p.code, p.stderr())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("command not ready after 15s; dlock's stderr:\n%s", p.stderr())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// holderName is what the library names a Client of the process pid by
// default.
func defaultName(t *testing.T, pid int) string {
	t.Helper()
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return host + ":" + strconv.Itoa(pid)
}

// interval is one hold as a childMain in interval mode logged it.
type interval struct {
	start, end int64
	token      uint64
	name       string
}

// readIntervals parses an interval log; every start must have its end.
func readIntervals(t *testing.T, path string) []interval {
	t.Helper()
	open := map[uint64]*interval{}
	var out []interval
	for _, line := range strings.Split(strings.TrimSpace(readFile(t, path)), "\n") {
		var what, name string
		var ns int64
		var token uint64
		if _, err := fmt.Sscan(line, &what, &ns, &token, &name); err != nil {
			t.Fatalf("interval log line %q: %v", line, err)
		}
		switch what {
		case "start":
			if open[token] != nil {
				t.Fatalf("token %d started twice", token)
			}
			open[token] = &interval{start: ns, token: token, name: name}
		case "end":
			iv := open[token]
			if iv == nil {
				t.Fatalf("token %d ended without a start", token)
			}
			iv.end = ns
			out = append(out, *iv)
			delete(open, token)
		}
	}
	if len(open) > 0 {
		t.Fatalf("intervals without an end: %v", open)
	}
	return out
}

// maxOverlap returns the most intervals that were open at one time.
func maxOverlap(ivs []interval) int {
	most := 0
	for _, a := range ivs {
		n := 0
		for _, b := range ivs {
			if b.start <= a.start && a.start < b.end {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// processGone reports whether no process pid exists (dlock reaped its
// command, so a zombie does not count).
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
