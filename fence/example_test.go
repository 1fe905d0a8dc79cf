package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/fence"
)

// Kleppmann's scenario against a Redis key: client 1 (token 33) pauses past
// its lease, client 2 (token 34) takes the lock and writes, and client 1's
// late write is refused.
func ExampleRedis() {
	mr, err := miniredis.Run() // any Redis; miniredis so that the example runs anywhere
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	g := fence.NewRedis(rdb)
	fmt.Println(g.Set(ctx, "report", 33, "client 1, before the pause", 0))
	fmt.Println(g.Set(ctx, "report", 34, "client 2", 0))
	fmt.Println(g.Set(ctx, "report", 34, "client 2, again", 0))

	err = g.Set(ctx, "report", 33, "client 1, after the pause", 0)
	fmt.Println(err)
	fmt.Println(errors.Is(err, fence.ErrStale))
	fmt.Println(rdb.Get(ctx, "report").Val())
	// Output:
	// <nil>
	// <nil>
	// <nil>
	// fence: stale token: "report": token 33 < admitted 34
	// true
	// client 2, again
}

// A service applies writes that arrive tagged with their writers' tokens.
func ExampleGate() {
	var g fence.Gate
	balance := 0
	apply := func(token uint64, amount int) error {
		return g.Do("account:7", token, func() error {
			balance += amount // no stale writer can run here meanwhile
			return nil
		})
	}
	fmt.Println(apply(1, 100))
	fmt.Println(apply(2, -30))
	fmt.Println(apply(1, -100)) // token 1's lock was lost when token 2 was issued
	fmt.Println(balance)
	// Output:
	// <nil>
	// <nil>
	// fence: stale token: "account:7": token 1 < admitted 2
	// 70
}

// A guarded transaction: the write commits only if the token is admitted
// for the resource. (Not run: it needs a PostgreSQL server.)
func ExampleSQL_Exec() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	defer db.Close()

	g := fence.NewSQL() // fences in table dlock_fences
	if err := g.EnsureTable(ctx, db); err != nil {
		panic(err)
	}
	var token uint64 = 34 // from the lock on "invoice:42", e.g. m.Token()
	err = g.Exec(ctx, db, "invoice:42", token, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE invoices SET status = 'sent' WHERE id = 42")
		return err
	})
	switch {
	case errors.Is(err, fence.ErrStale):
		log.Print("lost the lock to a newer holder, who has written since: stopping")
	case err != nil:
		log.Print(err)
	}
}

// A row that carries its own fence column, written in one statement.
// (Not run: it needs a PostgreSQL server.)
func ExampleRow_Update() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	defer db.Close()

	// CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL,
	//                        fence bigint NOT NULL DEFAULT 0)
	accounts := fence.Row{Table: "accounts", Key: "id"}
	var token uint64 = 34
	err = accounts.Update(ctx, db, 7, token, map[string]any{"balance": 70})
	switch {
	case errors.Is(err, fence.ErrStale):
		log.Print("a newer holder has written the row: stopping")
	case errors.Is(err, sql.ErrNoRows):
		log.Print("no account 7")
	case err != nil:
		log.Print(err)
	}
}
