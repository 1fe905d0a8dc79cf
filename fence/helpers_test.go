package fence_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines left after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// attempt is one guarded write in a race: its token, when it ran (on the
// monotonic clock), and what the guard said.
type attempt struct {
	token      uint64
	start, end time.Time
	err        error
}

// race runs writers goroutines that each make perWriter guarded writes with
// write, and checks what fencing promises of the outcome. The tokens are
// distinct; a writer's i-th write has one of the tokens i*writers+1 through
// (i+1)*writers, dealt at random, so tokens rise over time as a lock's do
// while writers of neighbouring rounds keep overtaking one another.
// The promises:
//
//   - every write is admitted or refused with a *StaleError naming its own
//     token and a higher admitted one that some admitted write carried and
//     had started by then;
//   - no write was admitted after a write with a higher token had been
//     admitted (had returned before it started);
//   - the highest token of all was admitted;
//   - both outcomes happened, so the race tested something.
//
// It returns the highest token, whose write must be the final state.
func race(t *testing.T, writers, perWriter int, write func(token uint64) error) uint64 {
	t.Helper()
	n := writers * perWriter
	attempts := make([]attempt, n)
	for i := range perWriter {
		for w, p := range rand.Perm(writers) {
			attempts[w*perWriter+i].token = uint64(i*writers + p + 1)
		}
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := w * perWriter; i < (w+1)*perWriter; i++ {
				a := &attempts[i]
				a.start = time.Now()
				a.err = write(a.token)
				a.end = time.Now()
			}
		})
	}
	wg.Wait()

	admitted := map[uint64]*attempt{}
	for i := range attempts {
		if attempts[i].err == nil {
			admitted[attempts[i].token] = &attempts[i]
		}
	}
	var stale int
	for _, a := range attempts {
		if a.err == nil {
			continue
		}
		stale++
		var se *fence.StaleError
		require.ErrorAs(t, a.err, &se, "token %d: want admitted or stale", a.token)
		require.ErrorIs(t, a.err, fence.ErrStale)
		require.Equal(t, a.token, se.Token, "StaleError.Token")
		require.Greater(t, se.Admitted, a.token, "StaleError.Admitted")
		by, ok := admitted[se.Admitted]
		require.True(t, ok, "token %d refused by %d, which no write was admitted with", a.token, se.Admitted)
		require.True(t, by.start.Before(a.end), "token %d refused by %d, whose write started after the refusal", a.token, se.Admitted)
	}
	for _, b := range admitted {
		for _, a := range admitted {
			if a.token > b.token && a.end.Before(b.start) {
				t.Fatalf("token %d admitted after token %d had been", b.token, a.token)
			}
		}
	}
	highest := uint64(n)
	require.Contains(t, admitted, highest, "the highest token was refused")
	require.NotZero(t, stale, "no write was refused: the race tested nothing")
	require.Greater(t, len(admitted), 1, "only the highest token was admitted: the race tested nothing")
	t.Logf("%d writes: %d admitted, %d stale", n, len(admitted), stale)
	return highest
}

// requireStale asserts that err is a *StaleError for token, refused by
// admitted.
func requireStale(t *testing.T, err error, token, admitted uint64) {
	t.Helper()
	require.ErrorIs(t, err, fence.ErrStale)
	var se *fence.StaleError
	require.True(t, errors.As(err, &se), "got %T %v, want *fence.StaleError", err, err)
	require.Equal(t, token, se.Token, "Token")
	require.Equal(t, admitted, se.Admitted, "Admitted")
}
