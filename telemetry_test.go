package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scripts"
)

type otelEnv struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newOtel(t *testing.T) *otelEnv {
	o := &otelEnv{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	o.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(o.spans))
	o.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(o.reader))
	t.Cleanup(func() {
		_ = o.tp.Shutdown(context.Background())
		_ = o.mp.Shutdown(context.Background())
	})
	return o
}

func (o *otelEnv) opts(extra ...dlock.Option) []dlock.Option {
	return append([]dlock.Option{dlock.WithTracerProvider(o.tp), dlock.WithMeterProvider(o.mp)}, extra...)
}

func (o *otelEnv) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range o.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attrOf(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// sum returns the value of an Int64 sum metric for the points whose
// attributes include all of want.
func (o *otelEnv) sum(t *testing.T, metric string, want ...attribute.KeyValue) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, o.reader.Collect(context.Background(), &rm))
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != metric {
				continue
			}
			if s, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range s.DataPoints {
					if hasAll(dp.Attributes, want) {
						total += dp.Value
					}
				}
			}
		}
	}
	return total
}

// histCount returns how many values a float histogram recorded for the
// points whose attributes include all of want.
func (o *otelEnv) histCount(t *testing.T, metric string, want ...attribute.KeyValue) uint64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, o.reader.Collect(context.Background(), &rm))
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == metric {
				for _, dp := range h.DataPoints {
					if hasAll(dp.Attributes, want) {
						n += dp.Count
					}
				}
			}
		}
	}
	return n
}

func hasAll(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

func TestTelemetry_BlockedLock_SpanUnderCallerWithWakeEvents(t *testing.T) {
	e := sharedEnv(t)
	o := newOtel(t)
	n := name(t)
	holderClient := e.client(e.rdb()) // no providers: globals, unset
	holder := holderClient.Mutex(n)
	waiter := e.client(e.rdb(), o.opts()...).Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, holder.Lock(ctx))

	reqCtx, req := o.tp.Tracer("test").Start(ctx, "request")
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, waiter.Lock(reqCtx))
	}()
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, holder.Unlock(ctx))
	<-done
	req.End()

	spans := o.ended("dlock.Mutex.Lock")
	require.Len(t, spans, 1)
	s := spans[0]
	assert.Equal(t, req.SpanContext().SpanID(), s.Parent().SpanID(), "child of the caller's span")
	assert.Equal(t, req.SpanContext().TraceID(), s.SpanContext().TraceID())
	for key, want := range map[string]string{
		"dlock.kind": "mutex", "dlock.name": n, "dlock.lease_mode": "watchdog", "dlock.result": "acquired",
	} {
		v, ok := attrOf(s, key)
		assert.True(t, ok, key)
		assert.Equal(t, want, v.AsString(), key)
	}
	attempts, ok := attrOf(s, "dlock.attempts")
	require.True(t, ok)
	assert.GreaterOrEqual(t, attempts.AsInt64(), int64(2))
	var reasons, holders []string
	for _, ev := range s.Events() {
		if ev.Name == "dlock.blocked" {
			for _, kv := range ev.Attributes {
				if kv.Key == "dlock.holder" {
					holders = append(holders, kv.Value.AsString())
				}
			}
		}
		if ev.Name == "dlock.wake" {
			for _, kv := range ev.Attributes {
				if kv.Key == "dlock.wake_reason" {
					reasons = append(reasons, kv.Value.AsString())
				}
			}
		}
	}
	require.NotEmpty(t, reasons)
	assert.Equal(t, "handed", reasons[len(reasons)-1], "the holder's release handed the lock over")
	require.NotEmpty(t, holders, "a dlock.blocked event")
	assert.Equal(t, holderClient.ID(), holders[0], "the span names who held the lock")
	assert.Equal(t, codes.Unset, s.Status().Code)
	t.Logf("blocked Lock: %d attempts, wake-ups %v", attempts.AsInt64(), reasons)
	require.NoError(t, waiter.Unlock(ctx))
}

func TestTelemetry_TryLockTaken_IsAnOutcomeNotAnError(t *testing.T) {
	e := sharedEnv(t)
	o := newOtel(t)
	n := name(t)
	ctx := context.Background()
	require.NoError(t, e.client(e.rdb()).Mutex(n).Lock(ctx))
	ok, err := e.client(e.rdb(), o.opts()...).Mutex(n).TryLock(ctx)
	require.NoError(t, err)
	require.False(t, ok)
	spans := o.ended("dlock.Mutex.TryLock")
	require.Len(t, spans, 1)
	assert.Equal(t, codes.Unset, spans[0].Status().Code)
	v, _ := attrOf(spans[0], "dlock.result")
	assert.Equal(t, "not_obtained", v.AsString())

	err = e.client(e.rdb(), o.opts()...).Mutex(n).Unlock(ctx)
	require.ErrorIs(t, err, dlock.ErrNotHeld)
	spans = o.ended("dlock.Mutex.Unlock")
	require.Len(t, spans, 1)
	assert.Equal(t, codes.Error, spans[0].Status().Code, "ErrNotHeld on unlock is a failure")
}

func TestTelemetry_LostHold_SpanLinkedToAcquisitionAndCounted(t *testing.T) {
	e := sharedEnv(t)
	o := newOtel(t)
	rdb := e.rdb()
	n := name(t)
	m := e.client(rdb, o.opts(dlock.WithWatchdogTimeout(600*time.Millisecond))...).Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, m.Lock(ctx))
	require.NoError(t, rdb.Del(ctx, key(n)).Err())
	within(t, m.Lost(), 2*time.Second, "lost signal")
	require.Eventually(t, func() bool { return len(o.ended("dlock.Lost")) == 1 }, time.Second, 5*time.Millisecond)
	lost := o.ended("dlock.Lost")[0]
	lock := o.ended("dlock.Mutex.Lock")[0]
	require.Len(t, lost.Links(), 1)
	assert.Equal(t, lock.SpanContext().SpanID(), lost.Links()[0].SpanContext.SpanID(), "linked to the Lock that acquired it")
	assert.Equal(t, codes.Error, lost.Status().Code)
	assert.EqualValues(t, 1, o.sum(t, "dlock.lost", attribute.String("dlock.kind", "mutex")))
}

// A scripted run whose every metric value is known: an uncontended Lock, a
// TryLock that finds the lock taken, a Lock that waits for the Unlock, and a
// hold lost to a deleted key.
func TestTelemetry_ScriptedRun_MetricsExact(t *testing.T) {
	e := sharedEnv(t)
	o := newOtel(t)
	rdb := e.rdb()
	n := name(t)
	opts := o.opts(dlock.WithWatchdogTimeout(600 * time.Millisecond))
	a := e.client(e.rdb(), opts...).Mutex(n)
	b := e.client(e.rdb(), opts...).Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)
	mutex := attribute.String("dlock.kind", "mutex")

	require.NoError(t, a.Lock(ctx))
	ok, err := b.TryLock(ctx)
	require.NoError(t, err)
	require.False(t, ok)
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, b.Lock(ctx))
	}()
	require.Eventually(t, func() bool { return o.sum(t, "dlock.waiters", mutex) == 1 }, 2*time.Second, 5*time.Millisecond,
		"one caller blocked")
	require.NoError(t, a.Unlock(ctx))
	<-done
	assert.EqualValues(t, 1, o.sum(t, "dlock.holds", mutex))
	require.NoError(t, rdb.Del(ctx, key(n)).Err())
	within(t, b.Lost(), 2*time.Second, "lost signal")
	// The holder learns of the loss first; the watchdog records it right
	// after, once it has let go of its lock.
	require.Eventually(t, func() bool { return o.sum(t, "dlock.lost", mutex) == 1 }, time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		return o.sum(t, "dlock.watchdog.renewals", attribute.String("dlock.result", "gone")) == 1
	}, time.Second, time.Millisecond)

	assert.EqualValues(t, 2, o.sum(t, "dlock.acquisitions", mutex, attribute.String("dlock.result", "acquired")))
	assert.EqualValues(t, 1, o.sum(t, "dlock.acquisitions", mutex, attribute.String("dlock.result", "not_obtained")))
	assert.EqualValues(t, 1, o.sum(t, "dlock.releases", mutex, attribute.String("dlock.result", "released")))
	assert.EqualValues(t, 1, o.sum(t, "dlock.lost", mutex))
	assert.EqualValues(t, 0, o.sum(t, "dlock.waiters", mutex))
	assert.EqualValues(t, 0, o.sum(t, "dlock.holds", mutex))
	assert.EqualValues(t, 2, o.histCount(t, "dlock.wait.duration", mutex), "two blocking Lock calls")
	assert.EqualValues(t, 1, o.histCount(t, "dlock.hold.duration", mutex, attribute.String("dlock.result", "released")))
	assert.EqualValues(t, 1, o.histCount(t, "dlock.hold.duration", mutex, attribute.String("dlock.result", "lost")))
	assert.EqualValues(t, 1, o.sum(t, "dlock.watchdog.renewals", attribute.String("dlock.result", "gone")))
}

func TestTelemetry_NameOnMetricsOnlyWhenOptedIn(t *testing.T) {
	e := sharedEnv(t)
	ctx := context.Background()
	for _, optIn := range []bool{false, true} {
		o := newOtel(t)
		opts := o.opts()
		if optIn {
			opts = o.opts(dlock.WithMetricLockNames())
		}
		n := name(t)
		m := e.client(e.rdb(), opts...).Mutex(n)
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))
		got := o.sum(t, "dlock.acquisitions", attribute.String("dlock.name", n))
		if optIn {
			assert.EqualValues(t, 1, got)
		} else {
			assert.Zero(t, got, "no lock name on metrics by default")
		}
	}
}

func TestTelemetry_SemaphoreAndReentrant_CountsOnSpans(t *testing.T) {
	e := sharedEnv(t)
	o := newOtel(t)
	c := e.client(e.rdb(), o.opts()...)
	ctx := context.Background()
	r := c.ReentrantMutex(name(t), dlock.WithHandleOwner())
	require.NoError(t, r.Lock(ctx))
	require.NoError(t, r.Lock(ctx))
	spans := o.ended("dlock.ReentrantMutex.Lock")
	require.Len(t, spans, 2)
	v, _ := attrOf(spans[1], "dlock.hold_count")
	assert.EqualValues(t, 2, v.AsInt64())
	require.NoError(t, r.Unlock(ctx))
	require.NoError(t, r.Unlock(ctx))

	s := c.Semaphore(name(t))
	_, err := s.TrySetPermits(ctx, 3)
	require.NoError(t, err)
	p, err := s.Acquire(ctx, 2)
	require.NoError(t, err)
	require.NoError(t, p.Release(ctx))
	acq := o.ended("dlock.Semaphore.Acquire")
	require.Len(t, acq, 1)
	v, _ = attrOf(acq[0], "dlock.permits")
	assert.EqualValues(t, 2, v.AsInt64())
	assert.Len(t, o.ended("dlock.Permit.Release"), 1)
}

// stallUnlock holds the Mutex unlock script back until released, then fails
// it in transit.
type stallUnlock struct{ entered, release chan struct{} }

func (f *stallUnlock) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *stallUnlock) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *stallUnlock) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd, scripts.ExclUnlock) {
			close(f.entered)
			<-f.release
			err := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset (injected)")}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func TestTelemetry_CloseDuringFailingUnlock_HoldEndsAndGaugeReturnsToZero(t *testing.T) {
	e := sharedEnv(t)
	o := newOtel(t)
	stall := &stallUnlock{entered: make(chan struct{}), release: make(chan struct{})}
	c := e.client(e.rdb(stall), o.opts()...)
	m := c.Mutex(name(t))
	ctx := context.Background()
	require.NoError(t, m.Lock(ctx))
	require.EqualValues(t, 1, o.sum(t, "dlock.holds"))
	done := make(chan error, 1)
	go func() { done <- m.Unlock(ctx) }()
	<-stall.entered
	require.NoError(t, c.Close()) // while the Unlock is in flight
	close(stall.release)
	require.Error(t, <-done)
	within(t, m.Lost(), time.Second, "the hold ends once nothing can renew it")
	assert.EqualValues(t, 0, o.sum(t, "dlock.holds"), "holds gauge back to zero")
	assert.EqualValues(t, 0, o.sum(t, "dlock.lost"), "a shutdown is not counted as a loss")
	assert.EqualValues(t, 1, o.histCount(t, "dlock.hold.duration", attribute.String("dlock.result", "closed")))
}

// With no provider configured, dlock follows the OpenTelemetry global. While
// the global is unset it starts no spans at all, and it must still record
// once the application installs one, even after New.
func TestTelemetry_GlobalProviderInstalledAfterNew_Records(t *testing.T) {
	prev := otel.GetTracerProvider()
	if fmt.Sprintf("%T", prev) != "*global.tracerProvider" {
		t.Skip("the global tracer provider was already set")
	}
	e := sharedEnv(t)
	c := e.client(e.rdb()) // follows the globals
	m := c.Mutex(name(t))
	o := newOtel(t)
	ctx := ctxTimeout(t, 10*time.Second)

	// The caller's span comes from a provider that is not the global one:
	// dlock, following the unset global, must leave it alone.
	callerCtx, caller := o.tp.Tracer("app").Start(ctx, "request")
	require.NoError(t, m.Lock(callerCtx))
	require.NoError(t, m.Unlock(callerCtx))
	caller.End()
	assert.Empty(t, o.ended("dlock.Mutex.Lock"), "nothing records while the global is unset")
	for _, s := range o.ended("request") {
		assert.Empty(t, s.Attributes(), "dlock wrote nothing on the caller's span")
		assert.Empty(t, s.Events())
	}

	otel.SetTracerProvider(o.tp)
	t.Cleanup(func() { otel.SetTracerProvider(tracenoop.NewTracerProvider()) })
	require.NoError(t, m.Lock(ctx))
	require.NoError(t, m.Unlock(ctx))
	assert.Len(t, o.ended("dlock.Mutex.Lock"), 1, "recorded once the application installed a provider")
	assert.Len(t, o.ended("dlock.Mutex.Unlock"), 1)
}
