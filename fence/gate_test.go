package fence_test

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/fence"
)

func TestGate_AdmitsEqualAndHigherTokens_RefusesLower(t *testing.T) {
	var g fence.Gate // the zero value is ready
	require.NoError(t, g.Admit("doc", 5))
	require.NoError(t, g.Admit("doc", 5), "same token again")
	require.NoError(t, g.Admit("doc", 8))
	err := g.Admit("doc", 7)
	requireStale(t, err, 7, 8)
	assert.EqualError(t, err, `fence: stale token: "doc": token 7 < admitted 8`)
	assert.Equal(t, uint64(8), g.Admitted("doc"))
	require.NoError(t, g.Admit("other", 1), "resources are fenced apart")
	assert.Equal(t, uint64(0), g.Admitted("never"))
}

func TestGate_InvalidInput(t *testing.T) {
	var g fence.Gate
	ran := false
	fn := func() error { ran = true; return nil }
	assert.ErrorIs(t, g.Do("doc", 0, fn), fence.ErrInvalid, "token 0")
	assert.ErrorIs(t, g.Do("", 1, fn), fence.ErrInvalid, "empty resource")
	assert.ErrorIs(t, g.Admit("doc", 0), fence.ErrInvalid)
	assert.False(t, ran)
	assert.Equal(t, uint64(0), g.Admitted("doc"))
}

func TestGate_Do_StaleDoesNotRunFn_FnErrorKeepsAdmission(t *testing.T) {
	var g fence.Gate
	boom := errors.New("boom")
	assert.ErrorIs(t, g.Do("doc", 4, func() error { return boom }), boom)
	assert.Equal(t, uint64(4), g.Admitted("doc"), "a failed fn undid the admission")
	ran := false
	requireStale(t, g.Do("doc", 3, func() error { ran = true; return nil }), 3, 4)
	assert.False(t, ran, "fn ran for a stale token")

	assert.Panics(t, func() { _ = g.Do("doc", 6, func() error { panic("boom") }) })
	assert.Equal(t, uint64(6), g.Admitted("doc"))
	require.NoError(t, g.Admit("doc", 6), "a panicking fn left the resource held")
}

// While fn runs, Do and Admit for the same resource wait, whatever their
// token, and those for other resources do not.
func TestGate_Do_HoldsTheResourceUntilFnReturns(t *testing.T) {
	var g fence.Gate
	inFn, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	var once sync.Once
	releaseOnce := func() { once.Do(func() { close(release) }) }
	defer releaseOnce() // before wg.Wait: a failed assertion must not hang the test
	wg.Go(func() {
		assert.NoError(t, g.Do("doc", 5, func() error {
			close(inFn)
			<-release
			return nil
		}))
	})
	<-inFn
	stale, newer := make(chan error, 1), make(chan error, 1)
	wg.Go(func() { stale <- g.Admit("doc", 4) })
	wg.Go(func() { newer <- g.Do("doc", 6, func() error { return nil }) })

	require.NoError(t, g.Admit("elsewhere", 1), "another resource waited")
	timer := time.NewTimer(50 * time.Millisecond)
	defer timer.Stop()
	select {
	case err := <-stale:
		t.Fatalf("Admit returned %v while fn ran", err)
	case err := <-newer:
		t.Fatalf("Do returned %v while fn ran", err)
	case <-timer.C:
	}
	releaseOnce()
	err := <-stale
	var se *fence.StaleError
	require.ErrorAs(t, err, &se)
	assert.Contains(t, []uint64{5, 6}, se.Admitted, "4 is refused by 5, or by 6 if 6 went first")
	require.NoError(t, <-newer)
}

func TestGate_ConcurrentWriters_FnsNeverOverlap_FinalValueIsTheHighestToken(t *testing.T) {
	var g fence.Gate
	var (
		inside atomic.Int32
		value  string // written only inside fn, which Do serializes
	)
	highest := race(t, 16, 50, func(token uint64) error {
		return g.Do("doc", token, func() error {
			if n := inside.Add(1); n != 1 {
				t.Errorf("%d fns ran at once", n)
			}
			value = strconv.FormatUint(token, 10)
			time.Sleep(10 * time.Microsecond)
			inside.Add(-1)
			return nil
		})
	})
	assert.Equal(t, strconv.FormatUint(highest, 10), value)
	assert.Equal(t, highest, g.Admitted("doc"))
}

func TestGate_Forget_AdmitsAnyTokenAgain(t *testing.T) {
	var g fence.Gate
	require.NoError(t, g.Admit("doc", 9))
	g.Forget("doc")
	g.Forget("doc")
	g.Forget("never")
	assert.Equal(t, uint64(0), g.Admitted("doc"))
	require.NoError(t, g.Admit("doc", 1))
}

// Forget waits for a running Do, and a Do that was waiting behind it works
// on a fresh record, not the forgotten one: fns still never overlap.
func TestGate_Forget_DuringDo_KeepsFnsApart(t *testing.T) {
	var g fence.Gate
	var inside atomic.Int32
	fn := func() error {
		if n := inside.Add(1); n != 1 {
			t.Errorf("%d fns ran at once", n)
		}
		time.Sleep(20 * time.Microsecond)
		inside.Add(-1)
		return nil
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				if w == 0 && i%4 == 0 {
					g.Forget("doc")
					continue
				}
				_ = g.Do("doc", uint64(i+1), fn)
			}
		})
	}
	wg.Wait()
}
