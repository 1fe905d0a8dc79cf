package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// Scale tests: hundreds of thousands of holds on one Client, kept by the
// watchdog against a dedicated redis-server. They are slow and heavy, so they
// run only when asked for:
//
//	DLOCK_SCALE=1     100k holds (30 s timeout)
//	DLOCK_SCALE=full  also 300k holds (3 s timeout) and 1M holds (30 s timeout)
//
// For example:
//
//	DLOCK_SCALE=full DLOCK_REQUIRE_REDIS=1 go test -run TestScale -v -count=1 -timeout 30m .
//
// Do not run them with -race: the race detector makes them many times slower
// and the figures they log meaningless.
const scaleEnv = "DLOCK_SCALE"

// scaleCase is one scale test: how many holds, under which watchdog timeout,
// watched for how many renewal periods.
type scaleCase struct {
	holds   int
	timeout time.Duration // 0: the default watchdog timeout
	periods int           // renewal periods watched, after one period of warm-up
	full    bool          // runs only with DLOCK_SCALE=full
}

const (
	scaleWorkers     = 64   // goroutines acquiring and releasing
	scaleSampleEvery = 10   // one hold in this many is watched live through its hold context
	scaleVerifyBatch = 5000 // keys per verification pipeline (two commands each)
)

func TestScale_100kHolds_30sTimeout_NoneExpiresWhileHeld(t *testing.T) {
	runScale(t, scaleCase{holds: 100_000, periods: 3})
}

// 300,000 holds at a 3 s lease need about 100,000 renewals a second, most
// of one redis-server: on the AMD machine of 2026-11-26's later runs the
// server could not keep up (renewals 0.72-0.77 per hold-period, 140,000 and
// 227,000 holds lost, at the commit before that day's last changes and at
// them alike), where the Intel machine's earlier runs passed. It runs with
// DLOCK_SCALE=full, not in CI's scale step.
func TestScale_300kHolds_3sTimeout_NoneExpiresWhileHeld(t *testing.T) {
	runScale(t, scaleCase{holds: 300_000, timeout: 3 * time.Second, periods: 5, full: true})
}

func TestScale_1MHolds_30sTimeout_NoneExpiresWhileHeld(t *testing.T) {
	runScale(t, scaleCase{holds: 1_000_000, periods: 3, full: true})
}

func skipUnlessScale(t *testing.T, full bool) {
	t.Helper()
	switch v := os.Getenv(scaleEnv); {
	case v == "full":
	case v == "1" && !full:
	case v == "1":
		t.Skipf("1M-hold scale test: set %s=full to run it (%s=1 runs the smaller scale tests only)", scaleEnv, scaleEnv)
	default:
		t.Skipf("scale test: set %s=1 (or %s=full for the 1M-hold test too) to run it; it takes minutes and a dedicated redis-server", scaleEnv, scaleEnv)
	}
	if testing.Short() {
		t.Skip("scale test skipped in -short mode")
	}
}

func runScale(t *testing.T, sc scaleCase) {
	skipUnlessScale(t, sc.full)
	testStart := time.Now()
	timeout := sc.timeout
	logs := &logTally{}
	opts := []dlock.Option{dlock.WithLogger(slog.New(logs))}
	if timeout > 0 {
		opts = append(opts, dlock.WithWatchdogTimeout(timeout))
	} else {
		timeout = dlock.DefaultWatchdogTimeout
	}
	period := timeout / 3

	e := realEnv(t)
	cnt := newCounter()
	rdb := e.rdb(cnt)
	probe := e.rdb() // not counted: server-side checks and INFO
	c := e.client(rdb, opts...)
	ctx := context.Background()
	// Acquiring and releasing run at 20k-150k holds/s when all is well;
	// each gets a budget several times that, so that an overloaded server
	// fails the test in bounded time rather than hanging it. (At 300k holds
	// and a 3 s lease the renewals of the holds taken so far use most of
	// the server while the rest are acquired: 50-64 s for all of them on
	// 2026-11-26, with renewals at 1.08-1.11 per hold-period taking about
	// 30 s of the server's 42-49 s on an Intel machine; on the AMD one of
	// 2026-11-26's later runs, 233,000 holds in 90 s, the commit before
	// that day's last changes no faster, so the budget is twice what it
	// was.)
	budget := 30*time.Second + time.Duration(sc.holds)*400*time.Microsecond

	redisMemBefore := redisInfoInt(t, probe, "memory", "used_memory")
	heapBefore := heapAlloc()

	// Acquire, concurrently: concurrent calls share the Client's pipelines.
	locks := make([]*dlock.Mutex, sc.holds)
	for i := range locks {
		locks[i] = c.Mutex("scale-" + strconv.Itoa(i))
	}
	heapHandles := heapAlloc()
	acq := startPhase(t, probe)
	acqCtx, acqCancel := context.WithTimeout(ctx, budget)
	var sinceStart atomic.Int64 // the sum, over holds, of when each was acquired (ns after acq.start)
	acqFailed, acqErr := forEachConcurrently(locks, time.Time{}, func(m *dlock.Mutex) error {
		err := m.Lock(acqCtx)
		if err == nil {
			sinceStart.Add(int64(time.Since(acq.start)))
		}
		return err
	})
	acqCancel()
	acquisition, acqCPU, acqSrvCPU := acq.end(t, probe)
	// Renewals while acquiring, against the hold-periods held meanwhile: a
	// hold's first renewal is due a period after it was taken, so at one
	// renewal per period the count stays below the hold-periods.
	acqRenewed := renewedKeys(cnt)
	holdPeriods := (float64(sc.holds)*float64(acquisition) - float64(sinceStart.Load())) / float64(period)
	require.Zerof(t, acqFailed, "%d of %d Locks failed in %v (budget %v); first error: %v",
		acqFailed, sc.holds, acquisition.Round(time.Millisecond), budget, acqErr)
	acquired := time.Now()

	heapAfter := heapAlloc()
	heapPerHold := float64(int64(heapAfter)-int64(heapBefore)) / float64(sc.holds)
	heapPerHandle := float64(int64(heapHandles)-int64(heapBefore)) / float64(sc.holds)
	redisPerHold := float64(redisInfoInt(t, probe, "memory", "used_memory")-redisMemBefore) / float64(sc.holds)
	t.Logf("acquired %d holds in %v (%.0f/s; client CPU %v, redis-server CPU %v); client heap %.0f B/hold (of which the Mutex handle and its slot %.0f B), redis used_memory %.0f B/hold",
		sc.holds, acquisition.Round(time.Millisecond), float64(sc.holds)/acquisition.Seconds(), acqCPU.Round(time.Millisecond),
		acqSrvCPU.Round(time.Millisecond), heapPerHold, heapPerHandle, redisPerHold)
	t.Logf("renewals while acquiring: %d keys for %.0f hold-periods (%.2f per hold-period; once a period stays below 1)",
		acqRenewed, holdPeriods, float64(acqRenewed)/max(holdPeriods, 1))

	// Watch a sample live: a hold context ends with ErrLost the moment the
	// watchdog gives its hold up.
	var lostLive atomic.Int64
	var firstLost atomic.Pointer[string]
	var stops []context.CancelFunc
	for i := 0; i < sc.holds; i += scaleSampleEvery {
		hctx, cancel := locks[i].HoldContext(context.Background())
		stopAfter := context.AfterFunc(hctx, func() {
			if cause := context.Cause(hctx); errors.Is(cause, dlock.ErrLost) {
				lostLive.Add(1)
				msg := fmt.Sprintf("hold %d lost %v after acquisition ended: %v", i, time.Since(acquired).Round(time.Millisecond), cause)
				firstLost.CompareAndSwap(nil, &msg)
			}
		})
		stops = append(stops, func() { stopAfter(); cancel() })
	}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()

	// One period of warm-up: the first renewal round (which loads the
	// script) and the tail of the acquisitions are not counted.
	time.Sleep(time.Until(acquired.Add(period)))
	cnt.reset()
	cpuStart, srvCPUStart := clientCPU(), redisCPU(t, probe)
	scriptStart := redisCommandUsec(t, probe, "evalsha")
	watchStart := time.Now()
	for p := 1; p <= sc.periods; p++ {
		time.Sleep(time.Until(watchStart.Add(time.Duration(p) * period)))
		trips, _ := cnt.snapshot()
		t.Logf("  after %d/%d periods: %d keys renewed in %d script calls, %d round trips; %d of %d sampled holds lost",
			p, sc.periods, renewedKeys(cnt), renewCalls(cnt), trips, lostLive.Load(), len(stops))
	}
	watched := time.Since(watchStart)
	cpu, srvCPU := clientCPU()-cpuStart, redisCPU(t, probe)-srvCPUStart
	scriptTime := redisCommandUsec(t, probe, "evalsha") - scriptStart
	trips, cmds := cnt.snapshot()
	calls, keys := renewCalls(cnt), renewedKeys(cnt)
	periods := float64(watched) / float64(period)
	keysPer, callsPer, tripsPer := float64(keys)/periods, float64(calls)/periods, float64(trips)/periods
	t.Logf("per %v period over %.2f periods: %.0f keys renewed (%.2f per hold), %.1f script calls (%.1f keys/call), %.1f round trips; client CPU %v/period (%.1f%% of a core), redis-server CPU %v/period",
		period, periods, keysPer, keysPer/float64(sc.holds), callsPer, float64(keys)/max(float64(calls), 1), tripsPer,
		(cpu / time.Duration(sc.periods)).Round(time.Millisecond), 100*cpu.Seconds()/watched.Seconds(),
		(srvCPU / time.Duration(sc.periods)).Round(time.Millisecond))
	t.Logf("commands in the watch window: %s; redis-server time in EVALSHA %v/period (%.2f µs per renewed key)",
		commandSummary(cmds), (scriptTime / time.Duration(sc.periods)).Round(time.Millisecond),
		float64(scriptTime.Microseconds())/max(float64(keys), 1))

	// On the server: every key is there, holds this Client's token, and
	// has a lease left.
	verifyStart := time.Now()
	v := verifyKeys(t, probe, sc.holds, c.ID())
	t.Logf("server check in %v: %d keys missing, %d with another value, %d without a lease left; PTTL in [%v, %v]",
		time.Since(verifyStart).Round(time.Millisecond), v.missing, v.foreign, v.noTTL, v.minTTL, v.maxTTL)

	// Every handle: Lost() not closed.
	lost := 0
	for _, m := range locks {
		select {
		case <-m.Lost():
			lost++
		default:
		}
	}
	t.Logf("holds reported lost: %d of %d (sampled live: %d of %d)", lost, sc.holds, lostLive.Load(), len(stops))
	t.Logf("the Client's log until now: %s", logs)
	if msg := firstLost.Load(); msg != nil {
		t.Logf("first loss seen live: %s", *msg)
	}

	assert.Zero(t, v.missing, "lock keys missing on the server")
	assert.Zero(t, v.foreign, "lock keys holding another value than this Client's token")
	assert.Zero(t, v.noTTL, "lock keys without a lease left")
	assert.Zero(t, lost, "holds reported lost")
	assert.Zero(t, lostLive.Load(), "sampled holds lost while watched")
	assert.LessOrEqual(t, tripsPer, float64(sc.holds)/100, "round trips per period")
	// About one renewal per hold per period, never a storm. A server that
	// cannot keep up (here redis-server's CPU is the bound: 5 µs per renewed
	// key in a slow run) makes renewals slow down rather than pile up; the
	// least that keeps every hold is one renewal per lease, three periods.
	assert.LessOrEqual(t, keysPer, 1.35*float64(sc.holds), "keys renewed per period: more than one renewal per hold per period")
	assert.GreaterOrEqual(t, keysPer, float64(sc.holds)/3, "keys renewed per period: fewer than one renewal per hold per lease")

	for _, stop := range stops {
		stop()
	}
	stops = nil
	rel := startPhase(t, probe)
	// Unlock sends its request even when its ctx has ended: the budget
	// stops the workers instead, and what they did not reach counts as a
	// failure (the Client's Close at cleanup ends those holds).
	relFailed, relErr := forEachConcurrently(locks, time.Now().Add(budget), func(m *dlock.Mutex) error { return m.Unlock(ctx) })
	release, relCPU, relSrvCPU := rel.end(t, probe)
	t.Logf("released %d holds in %v (%.0f/s; client CPU %v, redis-server CPU %v)", sc.holds, release.Round(time.Millisecond),
		float64(sc.holds)/release.Seconds(), relCPU.Round(time.Millisecond), relSrvCPU.Round(time.Millisecond))
	assert.Zerof(t, relFailed, "%d of %d Unlocks failed; first error: %v", relFailed, sc.holds, relErr)
	t.Logf("the Client's log, all told: %s", logs)
	// Released locks keep only their kind, last fencing token and token
	// reservation, for a minute at most: no holder, no queue.
	after := verifyReleased(t, probe, sc.holds)
	assert.Zero(t, after.held, "locks still held after every Unlock")
	assert.Zero(t, after.lingering, "released keys without an expiry of a minute or less")

	t.Logf("SUMMARY holds=%d timeout=%v acquisition=%v release=%v keys/period=%.0f calls/period=%.1f trips/period=%.1f clientCPU/period=%v redisCPU/period=%v heap/hold=%.0fB redis/hold=%.0fB missing=%d lost=%d total=%v",
		sc.holds, timeout, acquisition.Round(time.Millisecond), release.Round(time.Millisecond), keysPer, callsPer, tripsPer,
		(cpu / time.Duration(sc.periods)).Round(time.Millisecond), (srvCPU / time.Duration(sc.periods)).Round(time.Millisecond),
		heapPerHold, redisPerHold, v.missing+v.foreign+v.noTTL, lost, time.Since(testStart).Round(time.Second))
}

// forEachConcurrently runs f on every lock from scaleWorkers goroutines and
// returns how many calls failed, and the first error. Past deadline (unless
// zero), the locks not reached yet count as failed, with errScaleBudget.
func forEachConcurrently(locks []*dlock.Mutex, deadline time.Time, f func(*dlock.Mutex) error) (failed int64, first error) {
	var next, nfailed atomic.Int64
	var once sync.Once
	var wg sync.WaitGroup
	const chunk = 64
	for range scaleWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				start := int(next.Add(chunk)) - chunk
				if start >= len(locks) {
					return
				}
				for _, m := range locks[start:min(start+chunk, len(locks))] {
					err := errScaleBudget
					if deadline.IsZero() || time.Now().Before(deadline) {
						err = f(m)
					}
					if err != nil {
						nfailed.Add(1)
						once.Do(func() { first = fmt.Errorf("%s: %w", m.Name(), err) })
					}
				}
			}
		}()
	}
	wg.Wait()
	return nfailed.Load(), first
}

var errScaleBudget = errors.New("not attempted: the phase ran out of its time budget")

type keyCheck struct {
	missing, foreign, noTTL int
	minTTL, maxTTL          time.Duration
}

// released counts, over every lock key, those still held and those that
// linger without an expiry within a minute.
type released struct{ held, lingering int }

func verifyReleased(t *testing.T, probe *redis.Client, holds int) released {
	t.Helper()
	ctx := context.Background()
	var r released
	for start := 0; start < holds; start += scaleVerifyBatch {
		var held []*redis.BoolCmd
		var fields []*redis.IntCmd
		var ttls []*redis.DurationCmd
		_, err := probe.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := start; i < min(start+scaleVerifyBatch, holds); i++ {
				k := key("scale-" + strconv.Itoa(i))
				held = append(held, p.HExists(ctx, k, "o"))
				fields = append(fields, p.HLen(ctx, k))
				ttls = append(ttls, p.PTTL(ctx, k))
			}
			return nil
		})
		require.NoError(t, err)
		for j := range held {
			o, _ := held[j].Result()
			n, _ := fields[j].Result()
			d, _ := ttls[j].Result()
			if o { // a holder ID
				r.held++
			}
			if n > 0 && (d <= 0 || d > time.Minute) {
				r.lingering++
			}
		}
	}
	return r
}

// verifyKeys reads every lock key (its holder field and PTTL, pipelined)
// and counts the keys that are gone, are held by anyone but a hold of the
// Client clientID, or have no lease left.
func verifyKeys(t *testing.T, probe *redis.Client, holds int, clientID string) keyCheck {
	t.Helper()
	ctx := context.Background()
	prefix := clientID + "."
	v := keyCheck{minTTL: time.Duration(1<<63 - 1)}
	gets := make([]*redis.StringCmd, 0, scaleVerifyBatch)
	ttls := make([]*redis.DurationCmd, 0, scaleVerifyBatch)
	for start := 0; start < holds; start += scaleVerifyBatch {
		gets, ttls = gets[:0], ttls[:0]
		_, err := probe.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := start; i < min(start+scaleVerifyBatch, holds); i++ {
				k := key("scale-" + strconv.Itoa(i))
				gets = append(gets, p.HGet(ctx, k, "o"))
				ttls = append(ttls, p.PTTL(ctx, k))
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			require.NoError(t, err, "verification pipeline")
		}
		for j, g := range gets {
			val, err := g.Result()
			switch {
			case errors.Is(err, redis.Nil):
				v.missing++
				continue
			case err != nil:
				require.NoError(t, err, "HGET")
			case !strings.HasPrefix(val, prefix) || len(val) == len(prefix):
				v.foreign++
			}
			d, err := ttls[j].Result()
			require.NoError(t, err, "PTTL")
			if d <= 0 {
				v.noTTL++
				continue
			}
			v.minTTL, v.maxTTL = min(v.minTTL, d), max(v.maxTTL, d)
		}
	}
	if v.maxTTL == 0 {
		v.minTTL = 0
	}
	return v
}

// logTally is a slog.Handler that counts the Client's log records by
// message, keeping the first and the last record of each (with their
// attributes and time), so that a scale run can say what went wrong
// without printing a line per hold.
type logTally struct {
	mu    sync.Mutex
	order []string
	byMsg map[string]*tallied
}

type tallied struct {
	n           int
	first, last string
}

func (h *logTally) Enabled(context.Context, slog.Level) bool { return true }
func (h *logTally) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logTally) WithGroup(string) slog.Handler            { return h }

func (h *logTally) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Time.Format("15:04:05.000"))
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%q", a.Key, a.Value.String())
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byMsg == nil {
		h.byMsg = map[string]*tallied{}
	}
	e := h.byMsg[r.Message]
	if e == nil {
		e = &tallied{first: b.String()}
		h.byMsg[r.Message] = e
		h.order = append(h.order, r.Message)
	}
	e.n++
	e.last = b.String()
	return nil
}

func (h *logTally) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.order) == 0 {
		return "nothing"
	}
	var b strings.Builder
	for _, m := range h.order {
		e := h.byMsg[m]
		fmt.Fprintf(&b, "\n\t%dx %q; first: %s", e.n, m, e.first)
		if e.n > 1 {
			fmt.Fprintf(&b, "; last: %s", e.last)
		}
	}
	return b.String()
}

// phase measures the wall time and the CPU time of this process and of the
// redis-server over a phase of a test.
type phase struct {
	start    time.Time
	cpu, srv time.Duration
}

func startPhase(t *testing.T, probe *redis.Client) phase {
	return phase{start: time.Now(), cpu: clientCPU(), srv: redisCPU(t, probe)}
}

func (p phase) end(t *testing.T, probe *redis.Client) (wall, cpu, srv time.Duration) {
	wall = time.Since(p.start)
	return wall, clientCPU() - p.cpu, redisCPU(t, probe) - p.srv
}

// redisCommandUsec is the time the redis-server has spent running cmd
// (INFO commandstats).
func redisCommandUsec(t *testing.T, probe *redis.Client, cmd string) time.Duration {
	t.Helper()
	info, err := probe.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	s, ok := infoField(info, "cmdstat_"+cmd)
	if !ok {
		return 0
	}
	for _, kv := range strings.Split(s, ",") {
		if v, ok := strings.CutPrefix(kv, "usec="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return time.Duration(n) * time.Microsecond
		}
	}
	return 0
}

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// clientCPU is the user and system CPU time this process has used.
func clientCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is the user and system CPU time the redis-server has used.
func redisCPU(t *testing.T, probe *redis.Client) time.Duration {
	t.Helper()
	info, err := probe.Info(context.Background(), "cpu").Result()
	require.NoError(t, err)
	var total float64
	for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
		s, ok := infoField(info, f)
		require.Truef(t, ok, "INFO cpu has no %s", f)
		x, err := strconv.ParseFloat(s, 64)
		require.NoError(t, err)
		total += x
	}
	return time.Duration(total * float64(time.Second))
}

// redisInfoInt reads an integer field of a section of INFO.
func redisInfoInt(t *testing.T, probe *redis.Client, section, field string) int64 {
	t.Helper()
	info, err := probe.Info(context.Background(), section).Result()
	require.NoError(t, err)
	s, ok := infoField(info, field)
	require.Truef(t, ok, "INFO %s has no %s", section, field)
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

func infoField(info, field string) (string, bool) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(field) + `:([^\r\n]*)`).FindStringSubmatch(info)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// commandSummary lists command counts by name, most frequent first, scripts
// by their SHA's first 8 characters.
func commandSummary(cmds map[string]int) string {
	names := make([]string, 0, len(cmds))
	for k := range cmds {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int {
		if cmds[a] != cmds[b] {
			return cmds[b] - cmds[a]
		}
		return strings.Compare(a, b)
	})
	var b strings.Builder
	for i, k := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		short := k
		if name, sha, ok := strings.Cut(k, ":"); ok && len(sha) > 8 {
			short = name + ":" + sha[:8]
		}
		fmt.Fprintf(&b, "%s=%d", short, cmds[k])
	}
	return b.String()
}
