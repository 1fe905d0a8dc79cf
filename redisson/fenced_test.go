package redisson_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFencedLock_TokensRiseStrictlyAcrossGoAndJava(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 30*time.Second)
	const workers, rounds = 3, 8
	var mu sync.Mutex
	var tokens []int64
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for w := range workers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			f := e.go_.FencedLock("ledger")
			g := owner(ctx, "go-"+string(rune('a'+w)))
			for range rounds {
				tok, err := f.Lock(g)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				tokens = append(tokens, tok)
				mu.Unlock()
				if err := f.Unlock(g); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			tid := int64(10 + w)
			for range rounds {
				tok, err := e.java.LockAndGetToken(ctx, "ledger", tid)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				tokens = append(tokens, tok)
				mu.Unlock()
				if err := e.java.Unlock(ctx, "ledger", tid); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, tokens, 2*workers*rounds)
	for i := 1; i < len(tokens); i++ {
		require.Greater(t, tokens[i], tokens[i-1], "tokens in grant order: %v", tokens)
	}
	last, err := e.go_.FencedLock("ledger").Token(ctx)
	require.NoError(t, err)
	assert.Equal(t, tokens[len(tokens)-1], last)
}

func TestFencedLock_ExcludesJavaRLock_AndReentryTakesAToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "job-1")
	f := e.go_.FencedLock("ledger")
	t1, err := f.Lock(g)
	require.NoError(t, err)
	t2, ok, err := f.TryLock(g)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, t1+1, t2, "a re-entry takes the next token")
	ok, err = e.java.TryLock(ctx, "ledger", 7, 0)
	require.NoError(t, err)
	assert.False(t, ok, "a Java RLock of the name is excluded")
	require.NoError(t, f.Unlock(g))
	require.NoError(t, f.Unlock(g))
	jt, err := e.java.LockAndGetToken(ctx, "ledger", 7)
	require.NoError(t, err)
	assert.Equal(t, t2+1, jt)
	_, ok, err = f.TryLock(g)
	require.NoError(t, err)
	assert.False(t, ok)
	require.NoError(t, e.java.Unlock(ctx, "ledger", 7))
}

func TestFencedLock_HeldKeyWithoutTTL_IsNotTakenForAGrant(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	// A hold with no TTL, which Redisson's own reply {PTTL, -1} would read
	// as {-1, -1}: "acquired".
	require.NoError(t, e.rdb.HSet(ctx, "ledger", e.java.Field(7), 1).Err())
	tok, ok, err := e.go_.FencedLock("ledger").TryLock(owner(ctx, "job-1"))
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Zero(t, tok)
}
