package redisson_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/dlock-go/dlock/redisson"
)

func TestTelemetry_SpansAndHoldMetrics(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEnv(t, 0, redisson.WithTracerProvider(tp), redisson.WithMeterProvider(mp))
	ctx := owner(ctxT(t, 10*time.Second), "job-1")
	l := e.go_.Lock("orders")
	require.NoError(t, l.Lock(ctx))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	assert.Equal(t, int64(1), sumOf(rm, "dlock.holds"), "holds while held")
	require.NoError(t, l.Unlock(ctx))
	require.NoError(t, reader.Collect(context.Background(), &rm))
	assert.Equal(t, int64(0), sumOf(rm, "dlock.holds"), "holds after Unlock")

	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	assert.Contains(t, names, "redisson.Lock.Lock")
	assert.Contains(t, names, "redisson.Lock.Unlock")
}

// sumOf adds up the int64 sum points of the metric called name.
func sumOf(rm metricdata.ResourceMetrics, name string) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, p := range s.DataPoints {
					n += p.Value
				}
			}
		}
	}
	return n
}
