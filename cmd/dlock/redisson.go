package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redisson"
)

// redissonRun is run --redisson: it takes the Redisson RLock called name
// (the raw key, no prefix), renewed by the Redisson watchdog every third of
// --ttl, and runs argv under it. DLOCK_TOKEN is 0: an RLock has no fencing
// token.
func redissonRun(e *env, redisURL, name string, argv []string, f *runFlags) error {
	rdb, err := connectRedis(e, redisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	c := redisson.New(rdb, redisson.WithWatchdogTimeout(f.ttl))
	defer c.Close()

	sigs, stop := catchSignals()
	defer stop()
	l := c.Lock(name)
	owner := dlock.WithNewOwner(context.Background())
	o, _ := dlock.OwnerFrom(owner)
	as := func(ctx context.Context) context.Context { return dlock.WithOwner(ctx, o) }
	h := &held{
		name:    name,
		lease:   f.ttl,
		ctx:     func(p context.Context) (context.Context, context.CancelFunc) { return l.HoldContext(as(p)) },
		release: func(ctx context.Context) error { return l.Unlock(as(ctx)) },
	}
	p := primitive{
		try: func(ctx context.Context) (*held, error) {
			ok, err := l.TryLock(as(ctx))
			if err != nil || !ok {
				return nil, err
			}
			return h, nil
		},
		wait: func(ctx context.Context) (*held, error) {
			if err := l.Lock(as(ctx)); err != nil {
				return nil, err
			}
			return h, nil
		},
	}
	describe := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), pollInterval)
		defer cancel()
		st, err := inspectRedisson(ctx, rdb, name)
		switch {
		case err != nil:
			return "holder unknown: " + err.Error()
		case len(st.Holders) == 0:
			return "not held"
		}
		hd := st.Holders[0]
		return fmt.Sprintf("held by %s (lease %v left)", hd.ID, roundLease(time.Duration(hd.LeaseMS)*time.Millisecond))
	}
	held, err := acquireWith(e, p, name, f, sigs, describe)
	if err != nil {
		return err
	}
	return superviseHeld(e, held, argv, f, sigs)
}

// inspectRedisson reads what the Redisson object called name holds: a lock
// or read-write lock (a hash: its holder fields and counts, the lease
// left), or a semaphore or latch (a string: its count).
func inspectRedisson(ctx context.Context, rdb redis.UniversalClient, name string) (statusJSON, error) {
	st := statusJSON{Name: name, Holders: []holderJSON{}}
	typ, err := rdb.Type(ctx, name).Result()
	if err != nil {
		return st, err
	}
	switch typ {
	case "none":
		return st, dlock.ErrNotFound
	case "string":
		n, err := rdb.Get(ctx, name).Int64()
		if err != nil {
			return st, fmt.Errorf("%q holds a string that is no count: %w", name, dlock.ErrInvalid)
		}
		st.Kind, st.Count = "redisson-counter", &n
		return st, nil
	case "hash":
	default:
		return st, fmt.Errorf("%q holds a %s, not a Redisson lock: %w", name, typ, dlock.ErrInvalid)
	}
	fields, err := rdb.HGetAll(ctx, name).Result()
	if err != nil {
		return st, err
	}
	ttl, err := rdb.PTTL(ctx, name).Result()
	if err != nil {
		return st, err
	}
	st.Kind = "redisson-lock"
	mode, rw := fields["mode"]
	if rw {
		st.Kind = "redisson-rwlock-" + mode
	}
	for f, v := range fields {
		if f == "mode" {
			continue
		}
		var n int
		if _, err := fmt.Sscan(v, &n); err != nil {
			return st, fmt.Errorf("%q is not a Redisson lock (field %q): %w", name, f, dlock.ErrInvalid)
		}
		read := rw && !strings.HasSuffix(f, ":write")
		st.Holders = append(st.Holders, holderJSON{ID: f, LeaseMS: max(ttl.Milliseconds(), 0), Count: n, Read: read})
	}
	sort.Slice(st.Holders, func(i, j int) bool { return st.Holders[i].ID < st.Holders[j].ID })
	return st, nil
}

// redissonStatus is status --redisson.
func redissonStatus(e *env, redisURL, name string, asJSON bool) error {
	rdb, err := connectRedis(e, redisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
	defer cancel()
	st, err := inspectRedisson(ctx, rdb, name)
	switch {
	case errors.Is(err, dlock.ErrNotFound):
		return fail(exitError, "no Redisson object is called %q", name)
	case errors.Is(err, dlock.ErrInvalid):
		return fail(exitError, "%v", err)
	case err != nil:
		return fail(exitUnavailable, "%v", err)
	}
	if asJSON {
		return writeJSON(e.stdout, st)
	}
	writeRedissonStatus(e.stdout, st)
	return nil
}

func writeRedissonStatus(w io.Writer, st statusJSON) {
	fmt.Fprintf(w, "name:  %s\nkind:  %s\n", st.Name, st.Kind)
	if st.Count != nil {
		fmt.Fprintf(w, "count: %d\n", *st.Count)
		return
	}
	if len(st.Holders) == 0 {
		fmt.Fprintln(w, "holders: none")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOLDER\tCOUNT\tREAD\tLEASE LEFT")
	for _, h := range st.Holders {
		fmt.Fprintf(tw, "%s\t%d\t%v\t%v\n", h.ID, h.Count, h.Read, roundLease(time.Duration(h.LeaseMS)*time.Millisecond))
	}
	_ = tw.Flush()
}
