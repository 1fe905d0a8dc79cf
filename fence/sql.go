package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
)

// DefaultTable is the fences table of an SQL guard.
const DefaultTable = "dlock_fences"

// SQL guards PostgreSQL transactions made through database/sql. It keeps,
// in a fences table, one row per resource name holding the highest token
// admitted for it; a guarded transaction first raises that row to its token
// (Admit), which fails with ErrStale when a higher token is there, and then
// writes. The row and the writes commit or roll back together, so a write
// commits only if its token was admitted.
//
// # Concurrency
//
// Admit's upsert locks the resource's row until the transaction ends. A
// second transaction for the same resource waits at its Admit until the
// first commits or rolls back, then compares its token with the token the
// first left (PostgreSQL re-checks the condition against the latest row
// version). So guarded transactions of one resource run one at a time, and
// once a token has committed, no transaction with a lower one commits: if
// tokens 5 and 6 race and 6 commits first, 5 fails with ErrStale. If 5 gets
// the row first, it commits, and 6 is admitted after it.
//
// This holds at READ COMMITTED, PostgreSQL's default. At REPEATABLE READ or
// SERIALIZABLE the waiting transaction fails instead with a serialization
// error (SQLSTATE 40001), which Admit returns as is; retry the transaction.
//
// # Growth
//
// The table holds one row per resource ever admitted, and rows are never
// deleted: a deleted row would admit the stale writer it exists to stop. To
// retire a resource for good, once no writer can still hold a token for it,
// delete its row. The admitted_at column tells when each was last raised.
//
// An SQL guard holds no connection and is safe for concurrent use.
type SQL struct {
	table string
	err   error // from NewSQL; every call returns it

	ddl, upsert, current string
}

// SQLOption configures an SQL guard. See NewSQL.
type SQLOption func(*sqlConfig)

type sqlConfig struct {
	table string
}

// WithTable sets the fences table: a lowercase name, optionally
// schema-qualified ("locking.fences"). Default DefaultTable, "dlock_fences".
func WithTable(name string) SQLOption {
	return func(c *sqlConfig) { c.table = name }
}

// NewSQL returns an SQL guard. It never fails: an invalid option makes
// every later call return an error wrapping ErrInvalid, with nothing sent to
// the database.
func NewSQL(opts ...SQLOption) *SQL {
	cfg := sqlConfig{table: DefaultTable}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	g := &SQL{table: cfg.table}
	t, err := quoteIdent(cfg.table, true)
	if err != nil {
		g.err = err
		return g
	}
	g.ddl = `CREATE TABLE IF NOT EXISTS ` + t + ` (
	resource    text PRIMARY KEY,
	token       numeric(20, 0) NOT NULL CHECK (token > 0),
	admitted_at timestamptz NOT NULL DEFAULT now()
)`
	// The WHERE of DO UPDATE is the fencing rule. A row it rejects is still
	// locked, and no row comes back.
	g.upsert = `INSERT INTO ` + t + ` AS f (resource, token) VALUES ($1, $2::numeric)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, admitted_at = now()
WHERE f.token <= EXCLUDED.token
RETURNING 1`
	g.current = `SELECT token::text FROM ` + t + ` WHERE resource = $1`
	return g
}

// Table returns the fences table's name.
func (g *SQL) Table() string { return g.table }

// DDL returns the CREATE TABLE IF NOT EXISTS statement of the fences table,
// for a migration tool; EnsureTable runs it.
func (g *SQL) DDL() string { return g.ddl }

// Execer is what EnsureTable needs: a *sql.DB, *sql.Conn or *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// EnsureTable creates the fences table unless it exists. Run it once, from
// one place (a migration or start-up): two runs at the same moment on a
// database without the table can make one of them fail with a duplicate
// key error from PostgreSQL's catalog.
func (g *SQL) EnsureTable(ctx context.Context, db Execer) error {
	if g.err != nil {
		return g.err
	}
	if _, err := db.ExecContext(ctx, g.ddl); err != nil {
		return fmt.Errorf("fence: create table %s: %w", g.table, err)
	}
	return nil
}

// Admit admits token for resource within tx: if token is at least the
// highest token admitted for resource, it records token as that highest, in
// tx, and returns nil; otherwise it returns a *StaleError (matching
// ErrStale), and tx should be rolled back. It returns ErrInvalid for an
// empty resource or token 0, and any error from the database as is.
//
// Call Admit before the transaction's writes: the row lock it takes is what
// orders guarded transactions (see SQL). The admission commits with tx, and
// is undone if tx rolls back. It costs one statement, two when stale.
func (g *SQL) Admit(ctx context.Context, tx *sql.Tx, resource string, token uint64) error {
	if g.err != nil {
		return g.err
	}
	if err := checkArgs(resource, token); err != nil {
		return err
	}
	tok := strconv.FormatUint(token, 10)
	var one int
	err := tx.QueryRowContext(ctx, g.upsert, resource, tok).Scan(&one)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("fence: admit %q: %w", resource, err)
	}
	// Refused. The row is locked by the upsert, so this reads the token
	// that refused it.
	var s string
	if err := tx.QueryRowContext(ctx, g.current, resource).Scan(&s); err != nil {
		return fmt.Errorf("fence: admit %q: refused, and reading the admitted token failed: %w", resource, err)
	}
	admitted, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("fence: admit %q: refused, by a token %q out of range", resource, s)
	}
	return admit(resource, token, admitted)
}

// TxBeginner is what Exec needs: a *sql.DB or *sql.Conn.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Exec runs fn in a transaction that commits only if token is admitted for
// resource. It begins a transaction (at the database's default isolation
// level), admits token as Admit does, runs fn with the transaction, and
// commits. When the token is stale it returns a *StaleError (matching
// ErrStale) without running fn; when fn returns an error, Exec returns it;
// either way, and if fn panics, the transaction is rolled back and nothing
// of it, the admission included, persists. Otherwise it returns Commit's
// error (after a failed Commit on a broken connection, whether the
// transaction committed is unknown, as with any transaction).
//
// fn must use the transaction it is given, not db, for the writes to be
// guarded, and must not commit or roll it back. ctx bounds the whole
// transaction: if it ends, database/sql rolls the transaction back. For
// other isolation levels or a transaction of your own, use Admit.
func (g *SQL) Exec(ctx context.Context, db TxBeginner, resource string, token uint64, fn func(*sql.Tx) error) error {
	if g.err != nil {
		return g.err
	}
	if err := checkArgs(resource, token); err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("fence: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err := g.Admit(ctx, tx, resource, token); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	committed = true // Commit ends tx whatever it returns
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("fence: commit %q: %w", resource, err)
	}
	return nil
}
