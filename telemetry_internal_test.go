package dlock

import (
	"context"
	"io"
	"testing"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkTelemetry_LockUnlockPair measures only what instrumentation adds
// to one Lock+Unlock pair (two spans, the acquisition, release, wait and
// hold metrics), without Redis, so that network noise cannot hide it. Compare
// it with BenchmarkMutex_LockUnlock.
func BenchmarkTelemetry_LockUnlockPair(b *testing.B) {
	exp, _ := stdouttrace.New(stdouttrace.WithWriter(io.Discard))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer tp.Shutdown(context.Background())
	defer mp.Shutdown(context.Background())
	for _, mode := range []struct {
		name string
		cfg  config
	}{
		{"default", config{}},
		{"sdk", config{tracerProvider: tp, meterProvider: mp}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			t := newTelemetry(&mode.cfg)
			ctx := context.Background()
			l := &hold{kind: kindMutexName, name: "bench"}
			b.ReportAllocs()
			for b.Loop() {
				lctx, sp := t.start(ctx, kindMutexName, "dlock.Mutex.Lock", "bench", 0)
				_ = lctx
				t.holdStarted(l)
				sp.endAcquire(nil, true, true)
				_, sp = t.start(ctx, kindMutexName, "dlock.Mutex.Unlock", "bench", 0)
				t.holdEnded(l, resultReleased)
				sp.endRelease(nil)
			}
		})
	}
}
