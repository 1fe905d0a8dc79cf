package main

import (
	"context"
	"crypto/rand"
	"errors"
	"math"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/dlock-go/dlock"
)

// handle is one goroutine's view of one lock name.
type handle interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
}

// instance is one "process" of a library: its own Redis connections.
type instance interface {
	Handle(key string) handle
	Close()
}

type lib struct {
	name     string
	settings string
	floor    bool // a reference floor, not a lock library
	// open makes one instance; cnt, when not nil, counts the round trips
	// of every client the instance makes (the contention section).
	open func(addr string, cnt *rtCounter) (instance, error)
}

// poolSize is the go-redis pool size used by every go-redis based entry, so
// that 32 goroutines never queue for a connection.
const poolSize = 64

func newGoRedis(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, PoolSize: poolSize})
}

// newCounted is newGoRedis with cnt's hook on the client, if cnt is not nil.
func newCounted(addr string, cnt *rtCounter) *redis.Client {
	rdb := newGoRedis(addr)
	if cnt != nil {
		rdb.AddHook(cnt)
	}
	return rdb
}

var errNotObtained = errors.New("not obtained")

func libraries() []lib {
	return []lib{
		{
			name:     "dlock",
			settings: "dlock.New(go-redis client) with defaults (watchdog lease 30s, pub/sub wake-up); c.Mutex(key).Lock/Unlock",
			open: func(addr string, cnt *rtCounter) (instance, error) {
				rdb := newCounted(addr, cnt)
				return &dlockInst{rdb: rdb, c: dlock.New(rdb)}, nil
			},
		},
		{
			name:     "redsync",
			settings: "redsync/v4 v4.18.1, one goredis/v9 pool; NewMutex(key, WithTries(MaxInt32), WithRetryDelay(1ms)), default expiry 8s; LockContext/UnlockContext",
			open: func(addr string, cnt *rtCounter) (instance, error) {
				rdb := newCounted(addr, cnt)
				return &redsyncInst{rdb: rdb, rs: redsync.New(redsyncgoredis.NewPool(rdb))}, nil
			},
		},
		{
			name:     "redislock",
			settings: "bsm/redislock v0.9.4; Obtain(ctx, key, ttl 30s, RetryStrategy: LinearBackoff(1ms)); Release",
			open: func(addr string, cnt *rtCounter) (instance, error) {
				rdb := newCounted(addr, cnt)
				return &redislockInst{rdb: rdb, c: redislock.New(rdb)}, nil
			},
		},
		{
			name:     "rueidislock",
			settings: "rueidis/rueidislock v1.0.79 with defaults (KeyMajority 2 = 3 keys per lock, validity 5s, client-side-caching wake-up); WithContext / cancel",
			open: func(addr string, cnt *rtCounter) (instance, error) {
				opt := rueidislock.LockerOption{
					ClientOption: rueidis.ClientOption{InitAddress: []string{addr}},
				}
				if cnt != nil {
					opt.ClientBuilder = cnt.rueidisBuilder
				}
				l, err := rueidislock.NewLocker(opt)
				if err != nil {
					return nil, err
				}
				return &rueidisInst{l: l}, nil
			},
		},
		{
			name:     "rueidislock-1key",
			settings: "rueidis/rueidislock v1.0.79 with KeyMajority 1 (one key per lock, as every other library here), otherwise defaults (validity 5s, client-side-caching wake-up); WithContext / cancel",
			open: func(addr string, cnt *rtCounter) (instance, error) {
				opt := rueidislock.LockerOption{
					ClientOption: rueidis.ClientOption{InitAddress: []string{addr}},
					KeyMajority:  1,
				}
				if cnt != nil {
					opt.ClientBuilder = cnt.rueidisBuilder
				}
				l, err := rueidislock.NewLocker(opt)
				if err != nil {
					return nil, err
				}
				return &rueidisInst{l: l}, nil
			},
		},
	}
}

func floors() []lib {
	return []lib{
		{
			name:     "PING floor",
			settings: "go-redis: PING, PING (two round trips, no lock)",
			floor:    true,
			open: func(addr string, cnt *rtCounter) (instance, error) {
				return &pingInst{rdb: newCounted(addr, cnt)}, nil
			},
		},
		{
			name:     "minimal safe lock",
			settings: "go-redis: SET key token NX PX 30000; one Lua script: if GET==token then DEL+PUBLISH (no client logic)",
			floor:    true,
			open: func(addr string, cnt *rtCounter) (instance, error) {
				return &minimalInst{rdb: newCounted(addr, cnt)}, nil
			},
		},
	}
}

// dlock

type dlockInst struct {
	rdb *redis.Client
	c   *dlock.Client
}

func (i *dlockInst) Handle(key string) handle { return i.c.Mutex(key) }
func (i *dlockInst) Close()                   { _ = i.c.Close(); _ = i.rdb.Close() }

// redsync

type redsyncInst struct {
	rdb *redis.Client
	rs  *redsync.Redsync
}

func (i *redsyncInst) Handle(key string) handle {
	return &redsyncH{m: i.rs.NewMutex(key, redsync.WithTries(math.MaxInt32), redsync.WithRetryDelay(time.Millisecond))}
}
func (i *redsyncInst) Close() { _ = i.rdb.Close() }

type redsyncH struct{ m *redsync.Mutex }

func (h *redsyncH) Lock(ctx context.Context) error { return h.m.LockContext(ctx) }
func (h *redsyncH) Unlock(ctx context.Context) error {
	ok, err := h.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock returned false")
	}
	return err
}

// redislock

type redislockInst struct {
	rdb *redis.Client
	c   *redislock.Client
}

func (i *redislockInst) Handle(key string) handle { return &redislockH{c: i.c, key: key} }
func (i *redislockInst) Close()                   { _ = i.rdb.Close() }

type redislockH struct {
	c    *redislock.Client
	key  string
	lock *redislock.Lock
}

var redislockOpts = &redislock.Options{RetryStrategy: redislock.LinearBackoff(time.Millisecond)}

func (h *redislockH) Lock(ctx context.Context) error {
	l, err := h.c.Obtain(ctx, h.key, 30*time.Second, redislockOpts)
	if err != nil {
		return err
	}
	h.lock = l
	return nil
}

func (h *redislockH) Unlock(ctx context.Context) error {
	l := h.lock
	h.lock = nil
	if l == nil {
		return errors.New("redislock: not held")
	}
	return l.Release(ctx)
}

// rueidislock

type rueidisInst struct{ l rueidislock.Locker }

func (i *rueidisInst) Handle(key string) handle { return &rueidisH{l: i.l, key: key} }
func (i *rueidisInst) Close()                   { i.l.Close() }

type rueidisH struct {
	l      rueidislock.Locker
	key    string
	cancel context.CancelFunc
}

func (h *rueidisH) Lock(ctx context.Context) error {
	// ctx must outlive the hold: rueidislock derives the hold's context
	// from it and caps the key validity at its deadline.
	_, cancel, err := h.l.WithContext(ctx, h.key)
	if err != nil {
		return err
	}
	h.cancel = cancel
	return nil
}

func (h *rueidisH) Unlock(context.Context) error {
	c := h.cancel
	h.cancel = nil
	if c == nil {
		return errors.New("rueidislock: not held")
	}
	c() // blocks until every key is deleted
	return nil
}

// PING floor

type pingInst struct{ rdb *redis.Client }

func (i *pingInst) Handle(string) handle { return i }
func (i *pingInst) Close()               { _ = i.rdb.Close() }
func (i *pingInst) Lock(ctx context.Context) error {
	return i.rdb.Ping(ctx).Err()
}
func (i *pingInst) Unlock(ctx context.Context) error { return i.rdb.Ping(ctx).Err() }

// minimal safe lock floor

var minimalRelease = redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[1], 'u')
  return 1
end
return 0`)

type minimalInst struct{ rdb *redis.Client }

func (i *minimalInst) Handle(key string) handle { return &minimalH{rdb: i.rdb, key: key} }
func (i *minimalInst) Close()                   { _ = i.rdb.Close() }

type minimalH struct {
	rdb   *redis.Client
	key   string
	token string
}

func (h *minimalH) Lock(ctx context.Context) error {
	tok := rand.Text()
	err := h.rdb.Do(ctx, "set", h.key, tok, "nx", "px", 30000).Err()
	if errors.Is(err, redis.Nil) {
		return errNotObtained
	}
	if err != nil {
		return err
	}
	h.token = tok
	return nil
}

func (h *minimalH) Unlock(ctx context.Context) error {
	n, err := minimalRelease.Run(ctx, h.rdb, []string{h.key}, h.token).Int()
	if err == nil && n != 1 {
		err = errors.New("minimal: not held")
	}
	return err
}
