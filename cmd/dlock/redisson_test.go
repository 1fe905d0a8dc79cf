//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redisson"
)

// run --redisson takes the Redisson RLock a Java service (here: another
// redisson Client) takes: busy while the other side holds it, woken by the
// other side's unlock message, and status --redisson shows the holder.
func TestRunRedisson_SharesTheRLockWithAnotherRedissonClient(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rdb := redis.NewClient(&redis.Options{Addr: h.addr})
	t.Cleanup(func() { _ = rdb.Close() })
	other := redisson.New(rdb)
	t.Cleanup(func() { _ = other.Close() })
	ctx := dlock.WithOwner(ctxFor(t, 20*time.Second), "java-thread")
	l := other.Lock("job")
	if err := l.Lock(ctx); err != nil {
		t.Fatal(err)
	}

	if code, _, stderr := h.run("run", "--redisson", "--no-wait", "job", "--", "true"); code != exitBusy {
		t.Fatalf("run --no-wait on a held RLock exited %d, want %d; stderr:\n%s", code, exitBusy, stderr)
	}
	code, stdout, stderr := h.run("status", "--redisson", "job")
	if code != 0 || !strings.Contains(stdout, other.ID()+":") || !strings.Contains(stdout, "redisson-lock") {
		t.Fatalf("status --redisson exited %d, stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}

	log := h.file("intervals")
	p := h.start(intervalEnv(), "run", "--redisson", "job", "--", testBinary(t), log, "200ms")
	eventually(t, 10*time.Second, "run subscribed", func() bool {
		n, err := rdb.PubSubNumSub(context.Background(), "redisson_lock__channel:{job}").Result()
		return err == nil && n["redisson_lock__channel:{job}"] == 1
	})
	released := time.Now().UnixNano()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("run --redisson exited %d; stderr:\n%s", code, p.stderr())
	}
	ivs := readIntervals(t, log)
	if len(ivs) != 1 || ivs[0].start < released {
		t.Fatalf("intervals %+v, want one starting after the release at %d", ivs, released)
	}
	if n, err := rdb.Exists(context.Background(), "job").Result(); err != nil || n != 0 {
		t.Fatalf("the RLock is still there after the run (%d, %v)", n, err)
	}
	if code, _, _ := h.run("status", "--redisson", "job"); code != exitError {
		t.Fatalf("status --redisson of a free lock exited %d, want %d", code, exitError)
	}
}
