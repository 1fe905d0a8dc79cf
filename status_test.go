package dlock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// waitStatus polls st until ok accepts it.
func waitStatus(t *testing.T, read func() (dlock.Status, error), ok func(dlock.Status) bool) dlock.Status {
	t.Helper()
	var st dlock.Status
	require.Eventually(t, func() bool {
		var err error
		st, err = read()
		require.NoError(t, err)
		return ok(st)
	}, 5*time.Second, 2*time.Millisecond, "last status: %+v", st)
	return st
}

func TestStatus_Mutex_NamesTheHolderItsLeaseTheQueueAndTheToken(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	n := name(t)
	c := e.client(e.rdb(), dlock.WithClientName("web-1.prod:4242"), dlock.WithWatchdogTimeout(3*time.Second))
	operator := e.client(e.rdb())

	st, err := operator.Mutex(n).Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, dlock.Status{Name: n, Kind: dlock.KindMutex, Total: -1}, st, "a lock never used")
	_, err = operator.Status(ctx, n)
	assert.ErrorIs(t, err, dlock.ErrNotFound)

	m := c.Mutex(n)
	require.NoError(t, m.Lock(ctx))
	w1, w2 := e.client(e.rdb()).Mutex(n), e.client(e.rdb()).Mutex(n)
	d1 := lockInBackground(t, ctx, w1, nil)
	d2 := lockInBackground(t, ctx, w2, nil)
	st = waitStatus(t, func() (dlock.Status, error) { return operator.Mutex(n).Status(ctx) },
		func(st dlock.Status) bool { return st.Waiting == 2 })
	require.Len(t, st.Holders, 1)
	h := st.Holders[0]
	assert.Equal(t, "web-1.prod:4242", h.Client)
	assert.True(t, strings.HasPrefix(h.ID, c.ID()+"."), "holder ID %q not of Client %q", h.ID, c.ID())
	assert.Greater(t, h.Lease, time.Second)
	assert.LessOrEqual(t, h.Lease, 3*time.Second)
	assert.Equal(t, 1, h.Count)
	assert.Equal(t, m.Token(), st.Token)
	assert.True(t, st.Held())

	byName, err := operator.Status(ctx, n)
	require.NoError(t, err)
	assert.Equal(t, st.Holders[0].ID, byName.Holders[0].ID, "Client.Status reads the same lock")
	assert.Equal(t, dlock.KindMutex, byName.Kind)

	token := m.Token()
	require.NoError(t, m.Unlock(ctx))
	first, second, done := w1, w2, d2
	select {
	case <-d1:
	case <-d2:
		first, second, done = w2, w1, d1
	}
	st, err = operator.Status(ctx, n)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Waiting)
	require.Len(t, st.Holders, 1)
	assert.NotEqual(t, "web-1.prod:4242", st.Holders[0].Client, "handed over to a waiter")
	assert.Equal(t, first.Token(), st.Token, "the hand-over's token")
	assert.Greater(t, st.Token, token)
	require.NoError(t, first.Unlock(ctx))
	<-done
	require.NoError(t, second.Unlock(ctx))
}

func TestStatus_ReentrantRWMutexSemaphoreLatch(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	a := e.client(e.rdb(), dlock.WithClientName("a"))
	b := e.client(e.rdb(), dlock.WithClientName("b"))

	r := a.ReentrantMutex(name(t), dlock.WithHandleOwner())
	octx := dlock.WithOwner(ctx, "job")
	require.NoError(t, r.Lock(octx))
	require.NoError(t, r.Lock(octx))
	st, err := b.Status(ctx, r.Name())
	require.NoError(t, err)
	assert.Equal(t, dlock.KindReentrant, st.Kind)
	require.Len(t, st.Holders, 1)
	assert.Equal(t, 2, st.Holders[0].Count)
	assert.Equal(t, "a", st.Holders[0].Client)
	assert.Equal(t, r.Token(octx), st.Token)
	assert.True(t, strings.HasPrefix(st.Holders[0].ID, a.ID()+"."), "the holder %q is not of the owner's Client", st.Holders[0].ID)

	rwName := name(t)
	require.NoError(t, a.RWMutex(rwName, dlock.WithHandleOwner()).RLock(ctx))
	require.NoError(t, b.RWMutex(rwName, dlock.WithHandleOwner()).RLock(ctx))
	st, err = a.RWMutex(rwName, dlock.WithHandleOwner()).Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, dlock.KindRWMutex, st.Kind)
	require.Len(t, st.Holders, 2)
	clients := []string{st.Holders[0].Client, st.Holders[1].Client}
	assert.ElementsMatch(t, []string{"a", "b"}, clients)
	for _, h := range st.Holders {
		assert.True(t, h.Read)
		assert.Equal(t, 1, h.Count)
		assert.Positive(t, h.Lease)
	}

	s := a.Semaphore(name(t))
	require.NoError(t, s.SetPermits(ctx, 3))
	p1, err := s.Acquire(ctx, 2)
	require.NoError(t, err)
	go func() { _, _ = b.Semaphore(s.Name()).Acquire(ctx, 3) }() // waits
	st = waitStatus(t, func() (dlock.Status, error) { return b.Status(ctx, s.Name()) },
		func(st dlock.Status) bool { return st.Waiting == 1 })
	assert.Equal(t, dlock.KindSemaphore, st.Kind)
	assert.Equal(t, 3, st.Total)
	assert.Equal(t, 1, st.Free)
	require.Len(t, st.Holders, 1)
	assert.Equal(t, 2, st.Holders[0].Count)
	assert.Equal(t, "a", st.Holders[0].Client)
	assert.Equal(t, p1.Token(), st.Token)

	l := a.CountDownLatch(name(t))
	_, err = l.TrySetCount(ctx, 5)
	require.NoError(t, err)
	require.NoError(t, l.CountDown(ctx))
	st, err = b.Status(ctx, l.Name())
	require.NoError(t, err)
	assert.Equal(t, dlock.KindLatch, st.Kind)
	assert.EqualValues(t, 4, st.Count)
}

func TestStatus_WrongKindAndForeignKeys_ClearErrors(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	c := e.client(e.rdb())
	s := c.Semaphore(name(t))
	require.NoError(t, s.SetPermits(ctx, 1))
	_, err := c.Mutex(s.Name()).Status(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	assert.Contains(t, err.Error(), key(s.Name()))
	assert.Contains(t, err.Error(), "semaphore")

	n := name(t)
	require.NoError(t, e.rdb().Set(ctx, key(n), "user data", 0).Err())
	_, err = c.Status(ctx, n)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	assert.Contains(t, err.Error(), "string")
	require.NoError(t, e.rdb().HSet(ctx, key(n+"h"), "x", "1").Err())
	_, err = c.Status(ctx, n+"h")
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	v, _ := e.rdb().Get(ctx, key(n)).Result()
	assert.Equal(t, "user data", v, "inspection wrote to a foreign key")

	_, err = c.Status(ctx, "")
	assert.ErrorIs(t, err, dlock.ErrInvalid)
}

func TestList_ByPattern_SortedWithKinds(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	prefix := "list-" + name(t) + ":"
	c := e.client(e.rdb(), dlock.WithKeyPrefix(prefix), dlock.WithClientName("lister"))
	require.NoError(t, c.Mutex("job-b").Lock(ctx))
	require.NoError(t, c.ReentrantMutex("job-a", dlock.WithHandleOwner()).Lock(ctx))
	require.NoError(t, c.Semaphore("pool").SetPermits(ctx, 2))
	require.NoError(t, c.RWMutex("job-c", dlock.WithHandleOwner()).RLock(ctx))
	require.NoError(t, c.Mutex("other").Lock(ctx))

	all, err := c.List(ctx, "*")
	require.NoError(t, err)
	var names, kinds []string
	for _, st := range all {
		names, kinds = append(names, st.Name), append(kinds, st.Kind)
	}
	assert.Equal(t, []string{"job-a", "job-b", "job-c", "other", "pool"}, names)
	assert.Equal(t, []string{dlock.KindReentrant, dlock.KindMutex, dlock.KindRWMutex, dlock.KindMutex, dlock.KindSemaphore}, kinds)
	assert.Equal(t, "lister", all[1].Holders[0].Client)

	jobs, err := c.List(ctx, "job-*")
	require.NoError(t, err)
	assert.Len(t, jobs, 3)
	none, err := c.List(ctx, "nothing*")
	require.NoError(t, err)
	assert.Empty(t, none)
}

func TestForceUnlock_ByNameAndRWMutex_WakesTheQueueAndTellsHolders(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	n := name(t)
	holder := e.client(e.rdb(), dlock.WithWatchdogTimeout(600*time.Millisecond))
	local := holder.RWMutex(n, dlock.WithHandleOwner())
	remote := e.client(e.rdb(), dlock.WithWatchdogTimeout(600*time.Millisecond)).RWMutex(n, dlock.WithHandleOwner())
	require.NoError(t, local.RLock(ctx))
	require.NoError(t, remote.RLock(ctx))
	writer := e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner())
	wrote := make(chan struct{})
	go func() {
		if assert.NoError(t, writer.Lock(ctx)) {
			close(wrote)
		}
	}()
	waitStatus(t, func() (dlock.Status, error) { return local.Status(ctx) },
		func(st dlock.Status) bool { return st.Waiting == 1 })

	released, err := holder.ForceUnlock(ctx, n)
	require.NoError(t, err)
	assert.True(t, released)
	within(t, wrote, 2*time.Second, "the queued writer let in")
	within(t, local.RLost(ctx), 10*time.Millisecond, "the reader on the forcing Client told at once")
	within(t, remote.RLost(ctx), 2*time.Second, "the reader elsewhere told at its next renewal")
	st, err := writer.Status(ctx)
	require.NoError(t, err)
	require.Len(t, st.Holders, 1)
	assert.False(t, st.Holders[0].Read)

	released, err = writer.ForceUnlock(ctx)
	require.NoError(t, err)
	assert.True(t, released)
	released, err = writer.ForceUnlock(ctx)
	require.NoError(t, err)
	assert.False(t, released, "nobody held it")

	s := holder.Semaphore(name(t))
	require.NoError(t, s.SetPermits(ctx, 1))
	_, err = holder.ForceUnlock(ctx, s.Name())
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	_, err = holder.ForceUnlock(ctx, name(t))
	assert.ErrorIs(t, err, dlock.ErrNotFound)
}
