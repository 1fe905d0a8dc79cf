package dlock_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func sharedServer(b *testing.B) *redistest.Server { return redistest.Shared(b) }

func newBenchRDB(b *testing.B, srv *redistest.Server) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// BenchmarkMutex_LockUnlock is an uncontended Lock+Unlock pair: two round
// trips. BenchmarkPing_Pair is two PINGs on the same connection pool, the
// floor it is measured against.
func BenchmarkMutex_LockUnlock(b *testing.B) {
	rdb := newBenchRDB(b, sharedServer(b))
	c := dlock.New(rdb)
	defer c.Close()
	m := c.Mutex("bench-lockunlock")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := m.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPing_Pair(b *testing.B) {
	rdb := newBenchRDB(b, sharedServer(b))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		rdb.Ping(ctx)
		rdb.Ping(ctx)
	}
}

// BenchmarkMutex_Handoff measures, per op, one handoff from a holder on one
// Client to a waiter blocked on another: Unlock returning to Lock returning.
// It reports p50 and p99 of that interval.
func BenchmarkMutex_Handoff(b *testing.B) {
	srv := sharedServer(b)
	holder := dlock.New(newBenchRDB(b, srv))
	waiterC := dlock.New(newBenchRDB(b, srv))
	defer holder.Close()
	defer waiterC.Close()
	h, w := holder.Mutex("bench-handoff"), waiterC.Mutex("bench-handoff")
	ctx := context.Background()
	var lat []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		if err := h.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			if err := w.Lock(ctx); err != nil {
				b.Error(err)
			}
			got <- time.Now()
		}()
		time.Sleep(2 * time.Millisecond) // let it block
		released := time.Now()
		if err := h.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, (<-got).Sub(released))
		if err := w.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkMutex_LockUnlock_Telemetry runs the uncontended pair with
// instrumentation effectively off (no-op providers), with the default (the
// OpenTelemetry globals, unset), and with the SDK exporting every span (to
// io.Discard through stdouttrace) and a metric reader attached.
func BenchmarkMutex_LockUnlock_Telemetry(b *testing.B) {
	srv := sharedServer(b)
	exp, err := stdouttrace.New(stdouttrace.WithWriter(io.Discard))
	if err != nil {
		b.Fatal(err)
	}
	sdkTP := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	sdkMP := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer sdkTP.Shutdown(context.Background())
	defer sdkMP.Shutdown(context.Background())
	modes := []struct {
		name string
		opts []dlock.Option
	}{
		{"off", []dlock.Option{dlock.WithTracerProvider(tracenoop.NewTracerProvider()), dlock.WithMeterProvider(metricnoop.NewMeterProvider())}},
		{"default", nil},
		{"sdk", []dlock.Option{dlock.WithTracerProvider(sdkTP), dlock.WithMeterProvider(sdkMP)}},
	}
	for _, mode := range modes {
		b.Run(mode.name, func(b *testing.B) {
			c := dlock.New(newBenchRDB(b, srv), mode.opts...)
			defer c.Close()
			m := c.Mutex("bench-telemetry-" + mode.name)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := m.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := m.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMutex_LockUnlock_Parallel is the bench module's W1 in miniature:
// 32 goroutines (16 per CPU on 2 CPUs), each on its own lock.
func BenchmarkMutex_LockUnlock_Parallel(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: sharedServer(b).Addr, PoolSize: 64})
	b.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(rdb)
	defer c.Close()
	var next atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		m := c.Mutex(fmt.Sprintf("bench-parallel-%d", next.Add(1)))
		ctx := context.Background()
		for pb.Next() {
			if err := m.Lock(ctx); err != nil {
				b.Error(err)
				return
			}
			if err := m.Unlock(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// floorUnlock is the minimal safe release: compare, delete, publish.
var floorUnlock = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1]) redis.call('PUBLISH', KEYS[2], ARGV[2]) return 1 end return 0`)

// BenchmarkFloor_MinimalSafeLock_Parallel is the floor that
// BenchmarkMutex_LockUnlock_Parallel is measured against: SET NX PX and one
// compare-delete-publish script on plain go-redis, with no client logic.
func BenchmarkFloor_MinimalSafeLock_Parallel(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: sharedServer(b).Addr, PoolSize: 64})
	b.Cleanup(func() { _ = rdb.Close() })
	var next atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		k := fmt.Sprintf("bench-floor-%d", next.Add(1))
		ctx := context.Background()
		for pb.Next() {
			tok := rand.Text()
			if ok, err := rdb.SetNX(ctx, k, tok, 30*time.Second).Result(); err != nil || !ok {
				b.Error("floor lock", ok, err)
				return
			}
			if err := floorUnlock.Run(ctx, rdb, []string{k, k + ":ch"}, tok, "x").Err(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
