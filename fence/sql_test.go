package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/internal/pgtest"
)

// pgDB opens the package's shared PostgreSQL, closed at t's cleanup.
func pgDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", pgtest.Shared(t).DSN)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

var tableSeq atomic.Int64

// uniq returns a table name no other test uses on the shared server.
func uniq(prefix string) string { return prefix + "_" + strconv.FormatInt(tableSeq.Add(1), 10) }

// sqlSetup returns a guard with a fences table of its own, and a table
// docs(id int primary key, v text) holding row 1, with empty text.
func sqlSetup(t *testing.T) (*fence.SQL, *sql.DB, string) {
	t.Helper()
	ctx := context.Background()
	db := pgDB(t)
	g := fence.NewSQL(fence.WithTable(uniq("fences")))
	require.NoError(t, g.EnsureTable(ctx, db))
	require.NoError(t, g.EnsureTable(ctx, db), "EnsureTable twice")
	docs := uniq("docs")
	_, err := db.ExecContext(ctx, "CREATE TABLE "+docs+" (id int PRIMARY KEY, v text NOT NULL); INSERT INTO "+docs+" VALUES (1, '')")
	require.NoError(t, err)
	return g, db, docs
}

// setDoc returns an Exec fn that sets the document's text to v.
func setDoc(docs, v string) func(*sql.Tx) error {
	return func(tx *sql.Tx) error {
		_, err := tx.Exec("UPDATE "+docs+" SET v = $1 WHERE id = 1", v)
		return err
	}
}

func doc(t *testing.T, db *sql.DB, docs string) string {
	t.Helper()
	var v string
	require.NoError(t, db.QueryRow("SELECT v FROM "+docs+" WHERE id = 1").Scan(&v))
	return v
}

func fenceOf(t *testing.T, db *sql.DB, g *fence.SQL, resource string) string {
	t.Helper()
	var s string
	err := db.QueryRow("SELECT token::text FROM "+g.Table()+" WHERE resource = $1", resource).Scan(&s)
	if errors.Is(err, sql.ErrNoRows) {
		return "none"
	}
	require.NoError(t, err)
	return s
}

func TestSQL_Exec_AdmitsEqualAndHigherTokens_RefusesLowerWithoutRunningFn(t *testing.T) {
	ctx := context.Background()
	g, db, docs := sqlSetup(t)

	require.NoError(t, g.Exec(ctx, db, "doc", 5, setDoc(docs, "a")))
	require.NoError(t, g.Exec(ctx, db, "doc", 5, setDoc(docs, "b")), "same token again")
	require.NoError(t, g.Exec(ctx, db, "doc", 7, setDoc(docs, "c")))
	ran := false
	err := g.Exec(ctx, db, "doc", 6, func(*sql.Tx) error { ran = true; return nil })
	requireStale(t, err, 6, 7)
	assert.EqualError(t, err, `fence: stale token: "doc": token 6 < admitted 7`)
	assert.False(t, ran, "fn ran for a stale token")
	assert.Equal(t, "c", doc(t, db, docs))
	assert.Equal(t, "7", fenceOf(t, db, g, "doc"))

	require.NoError(t, g.Exec(ctx, db, "other", 1, setDoc(docs, "d")), "resources are fenced apart")
	assert.Equal(t, "d", doc(t, db, docs))
}

func TestSQL_Exec_FnErrorOrPanic_RollsBackWriteAndAdmission(t *testing.T) {
	ctx := context.Background()
	g, db, docs := sqlSetup(t)
	require.NoError(t, g.Exec(ctx, db, "doc", 3, setDoc(docs, "kept")))

	boom := errors.New("boom")
	err := g.Exec(ctx, db, "doc", 9, func(tx *sql.Tx) error {
		require.NoError(t, setDoc(docs, "lost")(tx))
		return boom
	})
	assert.ErrorIs(t, err, boom)
	assert.Panics(t, func() {
		_ = g.Exec(ctx, db, "doc", 9, func(tx *sql.Tx) error {
			require.NoError(t, setDoc(docs, "lost")(tx))
			panic("boom")
		})
	})
	assert.Equal(t, "kept", doc(t, db, docs))
	assert.Equal(t, "3", fenceOf(t, db, g, "doc"), "a rolled-back transaction's token stayed admitted")
	require.NoError(t, g.Exec(ctx, db, "doc", 4, setDoc(docs, "four")))
	assert.Equal(t, "four", doc(t, db, docs))
}

func TestSQL_Exec_ComparesTokensExactly(t *testing.T) {
	ctx := context.Background()
	g, db, docs := sqlSetup(t)
	for i, c := range []struct{ high, low uint64 }{
		{10, 9},
		{1<<60 + 1, 1 << 60},
		{math.MaxUint64, math.MaxUint64 - 1},
	} {
		r := "r" + strconv.Itoa(i)
		require.NoError(t, g.Exec(ctx, db, r, c.low, setDoc(docs, "low")))
		require.NoError(t, g.Exec(ctx, db, r, c.high, setDoc(docs, "high")))
		requireStale(t, g.Exec(ctx, db, r, c.low, setDoc(docs, "low")), c.low, c.high)
		assert.Equal(t, strconv.FormatUint(c.high, 10), fenceOf(t, db, g, r))
	}
}

func TestSQL_InvalidInput_WritesNothing(t *testing.T) {
	ctx := context.Background()
	g, db, docs := sqlSetup(t)
	fn := func(*sql.Tx) error { t.Error("fn ran"); return nil }
	assert.ErrorIs(t, g.Exec(ctx, db, "doc", 0, fn), fence.ErrInvalid, "token 0")
	assert.ErrorIs(t, g.Exec(ctx, db, "", 1, fn), fence.ErrInvalid, "empty resource")
	assert.Equal(t, "none", fenceOf(t, db, g, "doc"))
	assert.Equal(t, "", doc(t, db, docs))

	for _, name := range []string{"", "Fences", "a.b.c", "x;drop", "1abc"} {
		bad := fence.NewSQL(fence.WithTable(name))
		assert.ErrorIs(t, bad.EnsureTable(ctx, db), fence.ErrInvalid, "table %q", name)
		assert.ErrorIs(t, bad.Exec(ctx, db, "doc", 1, fn), fence.ErrInvalid, "table %q", name)
	}
}

func TestSQL_WithTable_SchemaQualifiedAndReservedWord(t *testing.T) {
	ctx := context.Background()
	db := pgDB(t)
	schema := uniq("s")
	_, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	g := fence.NewSQL(fence.WithTable(schema + ".order"))
	require.NoError(t, g.EnsureTable(ctx, db))
	require.NoError(t, g.Exec(ctx, db, "r", 2, func(*sql.Tx) error { return nil }))
	requireStale(t, g.Exec(ctx, db, "r", 1, func(*sql.Tx) error { return nil }), 1, 2)
}

// waitForLockWait waits until some backend is blocked on a lock, which says
// that the second of two racing transactions is waiting at its Admit.
func waitForLockWait(t *testing.T, db *sql.DB) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()").Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond, "the second transaction never waited for the first")
}

// Two holders race: the one with token 6 admits first and commits; the one
// with token 5, which started while 6's transaction was open, must wait for
// it and then be refused. Run for a resource that has a row already (the
// upsert waits on the row lock) and for a new one (it waits on the insert).
func TestSQL_RaceOfTwoTransactions_HigherCommitsFirst_LowerIsRefused(t *testing.T) {
	for _, fresh := range []bool{false, true} {
		t.Run(fmt.Sprintf("fresh=%v", fresh), func(t *testing.T) {
			ctx := context.Background()
			g, db, docs := sqlSetup(t)
			if !fresh {
				require.NoError(t, g.Exec(ctx, db, "doc", 1, setDoc(docs, "one")))
			}
			admitted, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			releaseOnce := func() { once.Do(func() { close(release) }) }
			defer releaseOnce() // a failed assertion must not leave a transaction open
			six := make(chan error, 1)
			go func() {
				six <- g.Exec(ctx, db, "doc", 6, func(tx *sql.Tx) error {
					close(admitted)
					<-release
					return setDoc(docs, "six")(tx)
				})
			}()
			<-admitted
			five := make(chan error, 1)
			go func() { five <- g.Exec(ctx, db, "doc", 5, setDoc(docs, "five")) }()
			waitForLockWait(t, db)
			releaseOnce()
			require.NoError(t, <-six)
			requireStale(t, <-five, 5, 6)
			assert.Equal(t, "six", doc(t, db, docs))
			assert.Equal(t, "6", fenceOf(t, db, g, "doc"))
		})
	}
}

// The other order: 5 holds the row, 6 waits, 5 commits, then 6 is admitted
// and commits after it. Both writes land, in token order.
func TestSQL_RaceOfTwoTransactions_LowerCommitsFirst_BothCommitInTokenOrder(t *testing.T) {
	ctx := context.Background()
	g, db, docs := sqlSetup(t)
	admitted, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	releaseOnce := func() { once.Do(func() { close(release) }) }
	defer releaseOnce()
	five := make(chan error, 1)
	go func() {
		five <- g.Exec(ctx, db, "doc", 5, func(tx *sql.Tx) error {
			close(admitted)
			<-release
			return setDoc(docs, "five")(tx)
		})
	}()
	<-admitted
	six := make(chan error, 1)
	go func() { six <- g.Exec(ctx, db, "doc", 6, setDoc(docs, "six")) }()
	waitForLockWait(t, db)
	releaseOnce()
	require.NoError(t, <-five)
	require.NoError(t, <-six)
	assert.Equal(t, "six", doc(t, db, docs))
	assert.Equal(t, "6", fenceOf(t, db, g, "doc"))
}

func TestSQL_ConcurrentWriters_FinalValueIsTheHighestToken(t *testing.T) {
	ctx := context.Background()
	g, db, docs := sqlSetup(t)
	highest := race(t, 12, 25, func(token uint64) error {
		return g.Exec(ctx, db, "doc", token, setDoc(docs, strconv.FormatUint(token, 10)))
	})
	assert.Equal(t, strconv.FormatUint(highest, 10), doc(t, db, docs))
	assert.Equal(t, strconv.FormatUint(highest, 10), fenceOf(t, db, g, "doc"))
}

// Admit in a transaction of the caller's own: its admission is undone with
// the transaction.
func TestSQL_Admit_InOwnTransaction_RollbackUndoesIt(t *testing.T) {
	ctx := context.Background()
	g, db, _ := sqlSetup(t)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, g.Admit(ctx, tx, "doc", 8))
	require.NoError(t, tx.Rollback())
	assert.Equal(t, "none", fenceOf(t, db, g, "doc"))

	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, g.Admit(ctx, tx, "doc", 8))
	requireStale(t, g.Admit(ctx, tx, "doc", 7), 7, 8)
	require.NoError(t, tx.Rollback())
}

// At REPEATABLE READ a transaction that waited for another's admission of
// the same resource fails with a serialization error (SQLSTATE 40001), as
// the SQL doc says, rather than being admitted against a row it cannot see.
func TestSQL_Admit_RepeatableRead_WaiterGetsSerializationFailure(t *testing.T) {
	ctx := context.Background()
	g, db, _ := sqlSetup(t)
	require.NoError(t, g.Exec(ctx, db, "doc", 1, func(*sql.Tx) error { return nil }))
	rr := &sql.TxOptions{Isolation: sql.LevelRepeatableRead}

	first, err := db.BeginTx(ctx, rr)
	require.NoError(t, err)
	defer func() { _ = first.Rollback() }()
	require.NoError(t, g.Admit(ctx, first, "doc", 5))

	second, err := db.BeginTx(ctx, rr)
	require.NoError(t, err)
	defer func() { _ = second.Rollback() }()
	var one int
	require.NoError(t, second.QueryRow("SELECT 1").Scan(&one)) // takes its snapshot now
	done := make(chan error, 1)
	go func() { done <- g.Admit(ctx, second, "doc", 6) }()
	waitForLockWait(t, db)
	require.NoError(t, first.Commit())
	err = <-done
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "40001", pgErr.Code)
	assert.NotErrorIs(t, err, fence.ErrStale)
}
