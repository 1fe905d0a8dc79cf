package dlock_test

// The fencing scenario end to end, across OS processes: a holder paused
// (SIGSTOP) past its lease, another process that takes the lock and writes
// through a guard, and the first, resumed, writing with its old token. Only
// the guard can stop that write; these tests check that it does.

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/internal/pgtest"
)

// fenceChildEnv runs the test binary as a fenced writer:
// DLOCK_TEST_FENCE="guard redisAddr lockName dsn rounds". guard is redis or
// sql; rounds 0 takes the lock once and writes when told to on stdin, more
// loops that many times (lock, write, unlock) on its own.
const fenceChildEnv = "DLOCK_TEST_FENCE"

const fenceTimeout = time.Second // the children's watchdog timeout

// fencedWrite writes through guard with token on behalf of writer: for
// redis, the data key; for sql, a history row, in the transaction that
// admits the token.
type fencedWrite func(ctx context.Context, token uint64, writer string) error

func newFencedWrite(guard, addr, dsn, lockName string) (fencedWrite, func(), error) {
	switch guard {
	case "redis":
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		g := fence.NewRedis(rdb)
		return func(ctx context.Context, token uint64, writer string) error {
			return g.Set(ctx, lockName+":data", token, writer, 0)
		}, func() { _ = rdb.Close() }, nil
	case "sql":
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, nil, err
		}
		g := fence.NewSQL()
		return func(ctx context.Context, token uint64, writer string) error {
			return g.Exec(ctx, db, lockName, token, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO fenced_history (token, writer) VALUES ($1, $2)`, int64(token), writer)
				return err
			})
		}, func() { _ = db.Close() }, nil
	}
	return nil, nil, fmt.Errorf("unknown guard %q", guard)
}

func fenceChildMain() int {
	var guard, addr, lockName, dsn string
	var rounds int
	if _, err := fmt.Sscan(os.Getenv(fenceChildEnv), &guard, &addr, &lockName, &dsn, &rounds); err != nil {
		fmt.Fprintln(os.Stderr, "fence child: bad arguments:", err)
		return 2
	}
	write, done, err := newFencedWrite(guard, addr, dsn, lockName)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fence child:", err)
		return 2
	}
	defer done()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c := dlock.New(rdb, dlock.WithWatchdogTimeout(fenceTimeout))
	defer c.Close()
	ctx := context.Background()
	m := c.Mutex(lockName)
	if rounds == 0 {
		if err := m.Lock(ctx); err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("locked", m.Token())
		in := bufio.NewScanner(os.Stdin)
		in.Scan() // "write", once resumed
		err := write(ctx, m.Token(), fmt.Sprint(os.Getpid()))
		switch {
		case err == nil:
			fmt.Println("admitted")
		case errors.Is(err, fence.ErrStale):
			fmt.Println("stale")
		default:
			fmt.Println("error", err)
		}
		return 0
	}
	fmt.Println("client", c.ID()) // so that the test can pause the holder
	admitted, stale := 0, 0
	for range rounds {
		if err := m.Lock(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "fence child: lock:", err)
			return 1
		}
		// Two writes a hold, some time apart: a pause between them makes
		// the second one stale.
		for range 2 {
			time.Sleep(time.Duration(2+rand.IntN(8)) * time.Millisecond)
			switch err := write(ctx, m.Token(), fmt.Sprint(os.Getpid())); {
			case err == nil:
				admitted++
			case errors.Is(err, fence.ErrStale):
				stale++
			default:
				fmt.Fprintln(os.Stderr, "fence child: write:", err)
				return 1
			}
		}
		_ = m.Unlock(ctx) // ErrLost after a pause is expected
	}
	fmt.Println("done", admitted, stale)
	return 0
}

// fenceChild starts the test binary as a fenced writer.
func fenceChild(t *testing.T, args string) (*exec.Cmd, io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), fenceChildEnv+"="+args)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, stdin, bufio.NewScanner(stdout)
}

// historyDB starts PostgreSQL with the table the sql children write to.
func historyDB(t *testing.T) (dsn string, db *sql.DB) {
	t.Helper()
	dsn = pgtest.Start(t).DSN
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx := context.Background()
	require.NoError(t, fence.NewSQL().EnsureTable(ctx, db))
	_, err = db.ExecContext(ctx, `CREATE TABLE fenced_history (id bigserial PRIMARY KEY, token bigint NOT NULL, writer text NOT NULL)`)
	require.NoError(t, err)
	return dsn, db
}

func TestFencing_HolderPausedPastItsLease_StaleWriteRejected(t *testing.T) {
	long(t)
	for _, guard := range []string{"redis", "sql"} {
		t.Run(guard, func(t *testing.T) {
			e := realEnv(t)
			n := name(t)
			dsn := "-"
			if guard == "sql" {
				dsn, _ = historyDB(t)
			}
			ctx := ctxTimeout(t, 30*time.Second)
			child, stdin, out := fenceChild(t, fmt.Sprintf("%s %s %s %s 0", guard, e.srv.Addr, n, dsn))
			require.True(t, out.Scan(), "the child's first line")
			var old uint64
			_, err := fmt.Sscanf(out.Text(), "locked %d", &old)
			require.NoError(t, err, "child said %q", out.Text())

			// The holder stops, past its lease.
			require.NoError(t, child.Process.Signal(syscall.SIGSTOP))
			m := e.client(e.rdb()).Mutex(n)
			start := time.Now()
			require.NoError(t, m.Lock(ctx), "the lock comes free when the paused holder's lease runs out")
			t.Logf("another process held the lock %v after the pause; tokens %d then %d",
				time.Since(start).Round(time.Millisecond), old, m.Token())
			require.Greater(t, m.Token(), old)
			write, done, err := newFencedWrite(guard, e.srv.Addr, dsn, n)
			require.NoError(t, err)
			defer done()
			require.NoError(t, write(ctx, m.Token(), "new holder"), "the new holder's write is admitted")

			// The old holder resumes and writes with its old token.
			require.NoError(t, child.Process.Signal(syscall.SIGCONT))
			_, err = io.WriteString(stdin, "write\n")
			require.NoError(t, err)
			require.True(t, out.Scan(), "the resumed child's verdict")
			assert.Equal(t, "stale", out.Text(), "the guard must reject the paused holder's write")
			require.NoError(t, m.Unlock(ctx))
		})
	}
}

// Several processes lock, write through the PostgreSQL guard (twice a hold)
// and unlock in a loop, while the test pauses whichever holds the lock, at
// random moments, for longer than the lease. The history the guard
// admitted, in commit order, must never go back in tokens: that would be a
// stale write accepted.
func TestFencing_ChurnWithRandomPauses_NoStaleWriteAccepted(t *testing.T) {
	long(t)
	e := realEnv(t)
	n := name(t)
	dsn, db := historyDB(t)
	const procs, rounds = 3, 60
	var children []*exec.Cmd
	var outs []*bufio.Scanner
	byClient := map[string]*exec.Cmd{}
	for range procs {
		cmd, _, out := fenceChild(t, fmt.Sprintf("sql %s %s %s %d", e.srv.Addr, n, dsn, rounds))
		children, outs = append(children, cmd), append(outs, out)
		require.True(t, out.Scan())
		id, ok := strings.CutPrefix(out.Text(), "client ")
		require.True(t, ok, "child said %q", out.Text())
		byClient[id] = cmd
	}
	probe := e.rdb()
	stop := make(chan struct{})
	var pauser sync.WaitGroup
	pauses := 0
	pauser.Add(1)
	go func() {
		defer pauser.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(100+rand.IntN(200)) * time.Millisecond):
			}
			holder, _, _ := strings.Cut(probe.HGet(context.Background(), key(n), "o").Val(), ".")
			victim := byClient[holder]
			if victim == nil || victim.Process.Signal(syscall.SIGSTOP) != nil {
				continue
			}
			pauses++
			time.Sleep(fenceTimeout + time.Duration(rand.IntN(400))*time.Millisecond)
			_ = victim.Process.Signal(syscall.SIGCONT)
		}
	}()
	admitted, stale := 0, 0
	for i, out := range outs {
		require.True(t, out.Scan(), "child %d's summary", i)
		var a, s int
		_, err := fmt.Sscanf(out.Text(), "done %d %d", &a, &s)
		require.NoError(t, err, "child %d said %q", i, out.Text())
		admitted, stale = admitted+a, stale+s
	}
	close(stop)
	pauser.Wait()
	for _, c := range children {
		require.NoError(t, c.Wait())
	}

	rows, err := db.QueryContext(context.Background(), `SELECT token FROM fenced_history ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var last uint64
	var history, backwards int
	for rows.Next() {
		var tok int64
		require.NoError(t, rows.Scan(&tok))
		history++
		if uint64(tok) < last {
			backwards++
		}
		last = max(last, uint64(tok))
	}
	require.NoError(t, rows.Err())
	t.Logf("%d processes x %d rounds, %d pauses past the lease: %d writes admitted, %d rejected as stale; history %d rows, %d went back in tokens",
		procs, rounds, pauses, admitted, stale, history, backwards)
	assert.Equal(t, admitted, history, "every admitted write, and only those, in the history")
	assert.Zero(t, backwards, "a stale write was accepted")
	assert.Equal(t, 2*procs*rounds, admitted+stale, "two writes a hold")
	assert.Positive(t, pauses)
	assert.Positive(t, stale, "no paused holder wrote after its lease: the scenario did not happen")
}
