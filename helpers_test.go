package dlock_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	if os.Getenv(fenceChildEnv) != "" {
		os.Exit(fenceChildMain())
	}
	code := m.Run()
	redistest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines left after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// counter is a go-redis hook that counts what a client sends: round trips
// (a command or a pipeline) and commands, by name and, for scripts, by SHA.
// A call is counted once done, and only if it was sent since the last reset:
// a reply that lands after a reset belongs to what came before it.
type counter struct {
	mu        sync.Mutex
	epoch     int // resets so far
	trips     int
	commands  map[string]int
	renewKeys int // keys carried by renewal script calls
}

func newCounter() *counter { return &counter{commands: map[string]int{}} }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sent := c.now()
		err := next(ctx, cmd) // counted once done, with any connection set-up it needed
		c.mu.Lock()
		defer c.mu.Unlock()
		if sent != c.epoch {
			return err
		}
		if !setup(cmd) {
			c.trips++
		}
		c.add(cmd)
		return err
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		sent := c.now()
		err := next(ctx, cmds)
		c.mu.Lock()
		defer c.mu.Unlock()
		if sent != c.epoch {
			return err
		}
		if len(cmds) == 0 || !setup(cmds[0]) {
			c.trips++
		}
		for _, cmd := range cmds {
			c.add(cmd)
		}
		return err
	}
}

// now returns the counter's epoch: the number of resets so far.
func (c *counter) now() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// setup reports whether cmd is part of go-redis setting up a connection
// (HELLO, CLIENT ...): not a round trip of any call of dlock's.
func setup(cmd redis.Cmder) bool {
	name := strings.ToLower(cmd.Name())
	return name == "hello" || name == "client"
}

func (c *counter) add(cmd redis.Cmder) {
	name := strings.ToLower(cmd.Name())
	c.commands[name]++
	if name == "evalsha" || name == "eval" {
		if args := cmd.Args(); len(args) > 2 {
			c.commands[name+":"+fmt.Sprint(args[1])]++
			if args[1] == scripts.Renew.Hash() {
				n, _ := args[2].(int)
				c.renewKeys += n
			}
		}
	}
}

func (c *counter) snapshot() (trips int, commands map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.commands))
	for k, v := range c.commands {
		out[k] = v
	}
	return c.trips, out
}

func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, v := range c.commands {
		if !strings.Contains(k, ":") {
			n += v
		}
	}
	return n
}

func (c *counter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	c.trips = 0
	c.renewKeys = 0
	clear(c.commands)
}

// warmedUp waits until a Client on a client counted by c has warmed its
// pool (one PING a connection, after its first round trip), so that a test
// that counts commands counts only those of the calls it makes.
func warmedUp(t *testing.T, c *counter) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, cmds := c.snapshot()
		if cmds["ping"] >= dlock.WarmConns {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("renewal connections not set up: %v", cmds)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// env is one test's Redis: the shared server unless the test asked for a
// dedicated real one.
type env struct {
	t   *testing.T
	srv *redistest.Server
}

func sharedEnv(t *testing.T) *env { return &env{t: t, srv: redistest.Shared(t)} }

// long skips a test that takes seconds (a failover, a fault that must
// outlast leases, a cluster, a soak) unless DLOCK_LONG is set, so that the
// README's test command stays quick; CI runs them in a step of their own
// (.ci/run), which finds them by this call, the first line of each.
func long(t *testing.T) {
	t.Helper()
	if os.Getenv("DLOCK_LONG") == "" {
		t.Skip("a long test: set DLOCK_LONG=1 to run it")
	}
}

// realEnv starts a dedicated redis-server, for tests that kill connections,
// flush scripts or restart the server.
func realEnv(t *testing.T) *env { return &env{t: t, srv: redistest.Real(t)} }

func (e *env) rdb(hooks ...redis.Hook) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr, PoolSize: 64})
	for _, h := range hooks {
		rdb.AddHook(h)
	}
	e.t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func (e *env) client(rdb redis.UniversalClient, opts ...dlock.Option) *dlock.Client {
	c := dlock.New(rdb, opts...)
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

// name returns a lock name no other test uses.
func name(t *testing.T) string {
	return strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + rand.Text()[:8]
}

func key(name string) string { return dlock.DefaultKeyPrefix + "{" + name + "}" }

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// within fails the test unless ch closes within d.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-ch:
		return time.Since(start)
	case <-time.After(d):
		t.Fatalf("%s did not happen within %v", what, d)
		return 0
	}
}

// pubsubConns counts the server's pub/sub connections.
func pubsubConns(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	list, err := rdb.Do(context.Background(), "client", "list", "type", "pubsub").Text()
	require.NoError(t, err)
	return len(strings.Fields(strings.ReplaceAll(strings.TrimSpace(list), " ", "_")))
}

// scriptCalls counts the calls of one script a go-redis client sends.
type scriptCalls struct {
	s *redis.Script
	n atomic.Int64
}

func (h *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isScript(cmd, h.s) {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}
func (h *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd, h.s) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
