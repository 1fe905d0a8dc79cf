package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// The cross-process test re-executes the test binary; with childEnv set,
// TestMain runs childMain instead of the tests.
const childEnv = "DLOCK_TEST_CHILD"

// childMain increments a counter under a Mutex from a separate OS process:
// DLOCK_TEST_CHILD="addr name rounds goroutines".
func childMain() int {
	var addr, lockName string
	var rounds, goroutines int
	if _, err := fmt.Sscan(os.Getenv(childEnv), &addr, &lockName, &rounds, &goroutines); err != nil {
		fmt.Fprintln(os.Stderr, "child: bad arguments:", err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.Mutex(lockName)
			for range rounds {
				if err := m.Lock(ctx); err != nil {
					errs <- err
					return
				}
				v, err := rdb.Get(ctx, lockName+":counter").Int()
				if err != nil && !errors.Is(err, redis.Nil) {
					errs <- err
					return
				}
				time.Sleep(50 * time.Microsecond)
				if err := rdb.Set(ctx, lockName+":counter", v+1, time.Minute).Err(); err != nil {
					errs <- err
					return
				}
				if err := m.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func TestMutex_SeparateProcesses_CounterExact(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	const procs, rounds, goroutines = 3, 30, 4
	exe, err := os.Executable()
	require.NoError(t, err)
	cmds := make([]*exec.Cmd, procs)
	for i := range cmds {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+e.srv.Addr+" "+n+" "+strconv.Itoa(rounds)+" "+strconv.Itoa(goroutines))
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		cmds[i] = cmd
	}
	for i, cmd := range cmds {
		require.NoError(t, cmd.Wait(), "child %d", i)
	}
	got, err := e.rdb().Get(context.Background(), n+":counter").Int()
	require.NoError(t, err)
	require.Equal(t, procs*rounds*goroutines, got, "counter incremented under the lock by %d processes", procs)
	t.Logf("cross-process acquisitions checked: %d, lost updates: %d", procs*rounds*goroutines, procs*rounds*goroutines-got)
}
