package fence_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/fence"
)

// rowSetup makes a table of accounts, with a fence column, holding account 1
// (balance 0, fence 0), and returns its guard.
func rowSetup(t *testing.T) (fence.Row, *sql.DB) {
	t.Helper()
	db := pgDB(t)
	table := uniq("accounts")
	_, err := db.Exec("CREATE TABLE " + table + " (id int PRIMARY KEY, balance bigint NOT NULL, fence bigint NOT NULL DEFAULT 0);" +
		"INSERT INTO " + table + " (id, balance) VALUES (1, 0)")
	require.NoError(t, err)
	return fence.Row{Table: table, Key: "id"}, db
}

func balance(t *testing.T, db *sql.DB, r fence.Row, id int) (bal, fenceVal int64) {
	t.Helper()
	require.NoError(t, db.QueryRow("SELECT balance, fence FROM "+r.Table+" WHERE id = $1", id).Scan(&bal, &fenceVal))
	return bal, fenceVal
}

func TestRow_Update_AdmitsEqualAndHigherTokens_RefusesLower(t *testing.T) {
	ctx := context.Background()
	r, db := rowSetup(t)
	require.NoError(t, r.Update(ctx, db, 1, 3, map[string]any{"balance": 10}))
	require.NoError(t, r.Update(ctx, db, 1, 3, map[string]any{"balance": 11}), "same token again")
	err := r.Update(ctx, db, 1, 2, map[string]any{"balance": 99})
	requireStale(t, err, 2, 3)
	assert.Contains(t, err.Error(), r.Table+" id=1")
	bal, f := balance(t, db, r, 1)
	assert.Equal(t, int64(11), bal, "a stale write landed")
	assert.Equal(t, int64(3), f)

	require.NoError(t, r.Update(ctx, db, 1, 4, nil), "raising only the fence")
	requireStale(t, r.Update(ctx, db, 1, 3, map[string]any{"balance": 99}), 3, 4)
}

func TestRow_Update_MissingRow_IsErrNoRowsNotStale(t *testing.T) {
	ctx := context.Background()
	r, db := rowSetup(t)
	err := r.Update(ctx, db, 99, 5, map[string]any{"balance": 1})
	assert.ErrorIs(t, err, sql.ErrNoRows)
	assert.NotErrorIs(t, err, fence.ErrStale)
}

func TestRow_Update_InvalidInput_WritesNothing(t *testing.T) {
	ctx := context.Background()
	r, db := rowSetup(t)
	set := map[string]any{"balance": 7}
	assert.ErrorIs(t, r.Update(ctx, db, 1, 0, set), fence.ErrInvalid, "token 0")
	assert.ErrorIs(t, r.Update(ctx, db, 1, 1, map[string]any{"fence": 7}), fence.ErrInvalid, "set names the fence")
	assert.ErrorIs(t, r.Update(ctx, db, 1, 1, map[string]any{"Balance": 7}), fence.ErrInvalid, "not lowercase")
	assert.ErrorIs(t, r.Update(ctx, db, 1, 1, map[string]any{"balance = 0; --": 7}), fence.ErrInvalid, "injection")
	for _, bad := range []fence.Row{{Key: "id"}, {Table: r.Table}, {Table: r.Table, Key: "id", Fence: "F"}} {
		assert.ErrorIs(t, bad.Update(ctx, db, 1, 1, set), fence.ErrInvalid, "%+v", bad)
	}
	bal, f := balance(t, db, r, 1)
	assert.Equal(t, [2]int64{0, 0}, [2]int64{bal, f})
}

// A NULL fence counts as 0; reserved words work as names; Fence names the
// column; Update runs inside a caller's transaction.
func TestRow_Update_NullFence_ReservedWords_InTransaction(t *testing.T) {
	ctx := context.Background()
	db := pgDB(t)
	schema := uniq("s")
	_, err := db.Exec(`CREATE SCHEMA ` + schema + `; CREATE TABLE ` + schema + `."order" ("user" text PRIMARY KEY, "select" text, tok numeric(20, 0));` +
		`INSERT INTO ` + schema + `."order" ("user") VALUES ('ann')`)
	require.NoError(t, err)
	r := fence.Row{Table: schema + ".order", Key: "user", Fence: "tok"}

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	require.NoError(t, r.Update(ctx, tx, "ann", 1, map[string]any{"select": "x"}), "NULL fence")
	require.NoError(t, r.Update(ctx, tx, "ann", 2, map[string]any{"select": "y"}))
	requireStale(t, r.Update(ctx, tx, "ann", 1, map[string]any{"select": "z"}), 1, 2)
	var sel, tok string
	require.NoError(t, tx.QueryRow(`SELECT "select", tok::text FROM `+schema+`."order" WHERE "user" = 'ann'`).Scan(&sel, &tok))
	assert.Equal(t, [2]string{"y", "2"}, [2]string{sel, tok})
}

func TestRow_ConcurrentWriters_FinalValueIsTheHighestToken(t *testing.T) {
	ctx := context.Background()
	r, db := rowSetup(t)
	highest := race(t, 12, 25, func(token uint64) error {
		return r.Update(ctx, db, 1, token, map[string]any{"balance": int64(token)})
	})
	bal, f := balance(t, db, r, 1)
	assert.Equal(t, strconv.FormatUint(highest, 10), strconv.FormatInt(bal, 10))
	assert.Equal(t, int64(highest), f)
}

func TestRow_Update_NonUniqueKey_ReportsIt(t *testing.T) {
	ctx := context.Background()
	db := pgDB(t)
	table := uniq("groups")
	_, err := db.Exec("CREATE TABLE " + table + " (grp int, v int, fence bigint NOT NULL DEFAULT 0); INSERT INTO " + table + " (grp) VALUES (1), (1)")
	require.NoError(t, err)
	err = fence.Row{Table: table, Key: "grp"}.Update(ctx, db, 1, 1, map[string]any{"v": 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "2 rows matched")
}
