package main

import (
	"fmt"
	"math"
	"os"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// The Redlock section: dlock's Redlock against redsync's, over the same 3
// and 5 local redis-servers, for W1 (uncontended pairs) and W2 (handoff).

// redlockLibs are the Redlock entries over masters.
func redlockLibs(masters []string) []lib {
	n := len(masters)
	return []lib{
		{
			name:     fmt.Sprintf("dlock Redlock/%d", n),
			settings: fmt.Sprintf("dlock.NewRedlock(%d go-redis clients) with defaults (watchdog lease 30s, pub/sub wake-up on every master, fencing tokens); r.Mutex(key).Lock/Unlock", n),
			open: func(_ string, cnt *rtCounter) (instance, error) {
				var rdbs []redis.UniversalClient
				for _, a := range masters {
					rdbs = append(rdbs, newCounted(a, cnt))
				}
				return &dlockRedlockInst{rdbs: rdbs, r: dlock.NewRedlock(rdbs)}, nil
			},
		},
		{
			name:     fmt.Sprintf("redsync Redlock/%d", n),
			settings: fmt.Sprintf("redsync/v4 v4.18.1 over %d goredis/v9 pools; NewMutex(key, WithTries(MaxInt32), WithRetryDelay(1ms)), default expiry 8s; LockContext/UnlockContext", n),
			open: func(_ string, cnt *rtCounter) (instance, error) {
				var rdbs []*redis.Client
				var pools []redsyncredis.Pool
				for _, a := range masters {
					rdb := newCounted(a, cnt)
					rdbs = append(rdbs, rdb)
					pools = append(pools, redsyncgoredis.NewPool(rdb))
				}
				return &redsyncRedlockInst{rdbs: rdbs, rs: redsync.New(pools...)}, nil
			},
		},
	}
}

type dlockRedlockInst struct {
	rdbs []redis.UniversalClient
	r    *dlock.Redlock
}

func (i *dlockRedlockInst) Handle(key string) handle { return i.r.Mutex(key) }
func (i *dlockRedlockInst) Close() {
	_ = i.r.Close()
	for _, rdb := range i.rdbs {
		_ = rdb.Close()
	}
}

type redsyncRedlockInst struct {
	rdbs []*redis.Client
	rs   *redsync.Redsync
}

func (i *redsyncRedlockInst) Handle(key string) handle {
	return &redsyncH{m: i.rs.NewMutex(key, redsync.WithTries(math.MaxInt32), redsync.WithRetryDelay(time.Millisecond))}
}
func (i *redsyncRedlockInst) Close() {
	for _, rdb := range i.rdbs {
		_ = rdb.Close()
	}
}

// redlockRow is one entry's figures.
type redlockRow struct {
	lib      lib
	w1       []float64
	w2       []time.Duration
	w1Err    errBox
	w2Err    errBox
	openFail error
}

// startMasters starts n redis-servers for the Redlock section.
func startMasters(n int) (addrs []string, stop func(), err error) {
	var srvs []*redistest.Server
	var dirs []string
	stop = func() {
		for _, s := range srvs {
			s.Stop()
		}
		for _, d := range dirs {
			_ = os.RemoveAll(d)
		}
	}
	for range n {
		dir, err := os.MkdirTemp("", "dlock-bench-redlock-")
		if err != nil {
			stop()
			return nil, nil, err
		}
		dirs = append(dirs, dir)
		s, err := redistest.StartProcess(dir)
		if err != nil {
			stop()
			return nil, nil, err
		}
		srvs = append(srvs, s)
		addrs = append(addrs, s.Addr)
	}
	return addrs, stop, nil
}

// runRedlock runs the Redlock section on 5 fresh masters (the first 3 for
// the entries over 3) and returns its table.
func runRedlock(cfg config) (string, error) {
	addrs, stop, err := startMasters(5)
	if err != nil {
		return "", err
	}
	defer stop()
	var rows []*redlockRow
	for _, l := range append(redlockLibs(addrs[:3]), redlockLibs(addrs)...) {
		rows = append(rows, &redlockRow{lib: l})
	}
	fmt.Printf("Redlock W1 uncontended: %d goroutines, %d rounds x %v per entry\n", cfg.w1Workers, cfg.rounds, cfg.dur)
	insts := map[*redlockRow]instance{}
	for _, row := range rows {
		inst, err := row.lib.open("", nil)
		if err != nil {
			row.openFail = err
			continue
		}
		insts[row] = inst
		w1Round(inst, "warm:"+row.lib.name, cfg.w1Workers, cfg.dur/4, &errBox{})
	}
	for r := range cfg.rounds {
		for _, row := range rotate(rows, r) {
			if inst := insts[row]; inst != nil {
				rate, _ := w1Round(inst, row.lib.name, cfg.w1Workers, cfg.dur, &row.w1Err)
				row.w1 = append(row.w1, rate)
				fmt.Printf("  round %d %-20s %9.0f pairs/s\n", r+1, row.lib.name, rate)
			}
		}
	}
	for _, inst := range insts {
		inst.Close()
	}
	fmt.Printf("Redlock W2 handoff: %d handoffs per entry over %d rounds\n", cfg.handoffs, cfg.rounds)
	type pair struct{ h, w instance }
	pairs := map[*redlockRow]pair{}
	for _, row := range rows {
		h, err1 := row.lib.open("", nil)
		w, err2 := row.lib.open("", nil)
		if err1 != nil || err2 != nil {
			row.openFail = fmt.Errorf("%v %v", err1, err2)
			continue
		}
		pairs[row] = pair{h, w}
		w2Round(h, w, "warm:w2:"+row.lib.name, 3, &errBox{})
	}
	for r := range cfg.rounds {
		per := cfg.handoffs / cfg.rounds
		if r < cfg.handoffs%cfg.rounds {
			per++
		}
		for _, row := range rotate(rows, r) {
			if p, ok := pairs[row]; ok && per > 0 {
				ret, _ := w2Round(p.h, p.w, "w2:"+row.lib.name, per, &row.w2Err)
				row.w2 = append(row.w2, ret...)
			}
		}
	}
	for _, p := range pairs {
		p.h.Close()
		p.w.Close()
	}
	return redlockTable(rows), nil
}

func redlockTable(rows []*redlockRow) string {
	var b []byte
	b = fmt.Appendf(b, "### Redlock over 3 and 5 local masters (same run, same masters)\n\n")
	b = fmt.Appendf(b, "W1: uncontended Lock+Unlock pairs/s, median over rounds. W2: handoff to a blocked waiter, from the holder's Unlock returning.\n\n")
	b = fmt.Appendf(b, "| entry | W1 pairs/s | W2 p50 | W2 p90 | W2 p99 | errors |\n|---|--:|--:|--:|--:|---|\n")
	for _, row := range rows {
		errs := row.w1Err.String() + row.w2Err.String()
		if row.openFail != nil {
			errs = row.openFail.Error()
		}
		b = fmt.Appendf(b, "| %s | %.0f | %v | %v | %v | %s |\n", row.lib.name, median(row.w1),
			pct(row.w2, 0.5).Round(10*time.Microsecond), pct(row.w2, 0.9).Round(10*time.Microsecond), pct(row.w2, 0.99).Round(10*time.Microsecond), errs)
	}
	b = fmt.Appendf(b, "\nSettings:\n\n")
	for _, row := range rows {
		b = fmt.Appendf(b, "- **%s**: %s\n", row.lib.name, row.lib.settings)
	}
	return string(b)
}
