package telemetry

import (
	"context"
	"io"
	"testing"
	"time"

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
		tp   *sdktrace.TracerProvider
		mp   *sdkmetric.MeterProvider
	}{
		{"default", nil, nil},
		{"sdk", tp, mp},
	} {
		b.Run(mode.name, func(b *testing.B) {
			var t *Telemetry
			if mode.tp == nil {
				t = New(nil, nil, false)
			} else {
				t = New(mode.tp, mode.mp, false)
			}
			ctx := context.Background()
			acquired := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				lctx, sp := t.Start(ctx, KindMutex, "dlock.Mutex.Lock", "bench", 0)
				_ = lctx
				t.HoldStarted(KindMutex, "bench")
				sp.EndAcquire(nil, true, true)
				_, sp = t.Start(ctx, KindMutex, "dlock.Mutex.Unlock", "bench", 0)
				t.HoldEnded(KindMutex, "bench", acquired, ResultReleased)
				sp.EndRelease(nil)
			}
		})
	}
}
