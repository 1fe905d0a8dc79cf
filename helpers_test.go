package dlock_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
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
type counter struct {
	mu       sync.Mutex
	trips    int
	commands map[string]int
}

func newCounter() *counter { return &counter{commands: map[string]int{}} }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.trips++
		c.add(cmd)
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		c.trips++
		for _, cmd := range cmds {
			c.add(cmd)
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (c *counter) add(cmd redis.Cmder) {
	name := strings.ToLower(cmd.Name())
	c.commands[name]++
	if name == "evalsha" || name == "eval" {
		if args := cmd.Args(); len(args) > 1 {
			c.commands[name+":"+fmt.Sprint(args[1])]++
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
	c.trips = 0
	clear(c.commands)
}

// env is one test's Redis: the shared server unless the test asked for a
// dedicated real one.
type env struct {
	t   *testing.T
	srv *redistest.Server
}

func sharedEnv(t *testing.T) *env { return &env{t: t, srv: redistest.Shared(t)} }

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
