package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Row guards single-statement UPDATEs of PostgreSQL rows that carry their
// own fence column: the row is the resource, and its fence column holds the
// highest token written to it. Update builds and runs
//
//	UPDATE "accounts" SET "balance" = $3, "fence" = $2::numeric
//	WHERE "id" = $1 AND COALESCE("fence", 0) <= $2::numeric
//
// in which the check and the write are one statement, atomic as any UPDATE
// is: a concurrent UPDATE of the row makes it wait, and then re-check the
// fence against the row as that one left it. The same pattern written by
// hand works as well; Update adds telling apart the two reasons an UPDATE
// can match no row (no such row, or a stale token).
//
// The fence column is bigint or numeric, and NULL counts as 0, so rows
// inserted without a token take any. Declare it, for example,
//
//	fence bigint NOT NULL DEFAULT 0
//
// (bigint holds tokens up to 2^63-1; numeric(20, 0) holds every uint64).
// Every write to the row that other writers could overwrite must go through
// the guard, and an INSERT that makes the row should set the fence to the
// inserter's token.
//
// Names are lowercase identifiers, as PostgreSQL stores unquoted ones; Table
// may be schema-qualified.
type Row struct {
	Table string // the table, e.g. "accounts" or "billing.accounts"
	Key   string // the column that names the row: its primary key, or a unique column
	Fence string // the fence column; "" means "fence"
}

// rowAttempts bounds Update's tries when the row changes between its UPDATE
// and the look that explains why nothing matched.
const rowAttempts = 3

// Update sets the columns in set (column name to value, passed as query
// arguments) and the fence column to token, in the row whose Key column
// equals key, if token is at least the row's fence. It returns nil when the
// row was written; a *StaleError (matching ErrStale) when the row's fence is
// above token, with nothing written; an error matching sql.ErrNoRows when no
// row has that key; ErrInvalid for token 0 or a bad name (set may not name
// the fence column; it may be empty, to raise only the fence); and any error
// from the database as is.
//
// It takes one statement when the row is written, two when not. Only when
// the row changed between the two (it appeared, or its fence went down) does
// Update try again, at most three times in all. db is a *sql.DB, *sql.Conn
// or *sql.Tx. If key matches several rows, all of them are written and
// Update reports an error saying so: make Key unique.
func (r Row) Update(ctx context.Context, db Querier, key any, token uint64, set map[string]any) error {
	q, err := r.statements(set)
	if err != nil {
		return err
	}
	resource := fmt.Sprintf("%s %s=%v", r.Table, r.Key, key)
	if err := checkArgs(resource, token); err != nil {
		return err
	}
	args := []any{key, strconv.FormatUint(token, 10)}
	for _, col := range q.cols {
		args = append(args, set[col])
	}
	for range rowAttempts {
		res, err := db.ExecContext(ctx, q.update, args...)
		if err != nil {
			return fmt.Errorf("fence: update %s: %w", resource, err)
		}
		n, err := res.RowsAffected()
		switch {
		case err != nil:
			return fmt.Errorf("fence: update %s: %w", resource, err)
		case n == 1:
			return nil
		case n > 1:
			return fmt.Errorf("fence: update %s: %d rows matched and were written; %s must be unique", resource, n, r.Key)
		}
		var s string
		err = db.QueryRowContext(ctx, q.fence, key).Scan(&s)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("fence: update %s: %w", resource, err)
		}
		if err != nil {
			return fmt.Errorf("fence: update %s: matched no row, and reading its fence failed: %w", resource, err)
		}
		admitted, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return fmt.Errorf("fence: update %s: fence %q is not a token", resource, s)
		}
		if err := admit(resource, token, admitted); err != nil {
			return err
		}
		// The row admits token now, yet the UPDATE matched nothing: it was
		// made, or its fence lowered, in between. Try again.
	}
	return fmt.Errorf("fence: update %s: the row kept changing under %d attempts", resource, rowAttempts)
}

// Querier is what Row.Update needs: a *sql.DB, *sql.Conn or *sql.Tx.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type rowStatements struct {
	update, fence string
	cols          []string // set's columns, in the order of their placeholders $3...
}

func (r Row) statements(set map[string]any) (rowStatements, error) {
	fenceCol := r.Fence
	if fenceCol == "" {
		fenceCol = "fence"
	}
	table, err := quoteIdent(r.Table, true)
	if err != nil {
		return rowStatements{}, err
	}
	keyCol, err := quoteIdent(r.Key, false)
	if err != nil {
		return rowStatements{}, err
	}
	fence, err := quoteIdent(fenceCol, false)
	if err != nil {
		return rowStatements{}, err
	}
	var b strings.Builder
	b.WriteString("UPDATE " + table + " SET ")
	cols := slices.Sorted(maps.Keys(set))
	for i, c := range cols {
		if c == fenceCol {
			return rowStatements{}, invalidf("set names the fence column %q, which Update sets to the token", c)
		}
		q, err := quoteIdent(c, false)
		if err != nil {
			return rowStatements{}, err
		}
		b.WriteString(q + " = $" + strconv.Itoa(i+3) + ", ")
	}
	b.WriteString(fence + " = $2::numeric WHERE " + keyCol + " = $1 AND COALESCE(" + fence + ", 0) <= $2::numeric")
	return rowStatements{
		update: b.String(),
		fence:  "SELECT COALESCE(" + fence + ", 0)::text FROM " + table + " WHERE " + keyCol + " = $1",
		cols:   cols,
	}, nil
}
