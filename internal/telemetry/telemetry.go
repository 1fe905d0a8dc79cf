// Package telemetry is dlock's OpenTelemetry: the span of every public call
// (Start, and Span's End methods), attributes and events on the span in a
// context (Annotate, WokeUp, Blocked), and the metrics of holds, waiters
// and renewals. It uses the OpenTelemetry API only; with the globals unset,
// spans are not even started (see untracedGlobal). It imports errs and wire.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/wire"
)

// instrumentationName names dlock's tracer and meter.
const instrumentationName = "github.com/dlock-go/dlock"

// Primitive kinds, the dlock.kind attribute.
const (
	KindMutex     = "mutex"
	KindReentrant = "reentrant_mutex"
	KindRWRead    = "rwmutex_read"
	KindRWWrite   = "rwmutex_write"
	KindSemaphore = "semaphore"
	KindLatch     = "countdown_latch"
	KindElection  = "election"
)

// Outcomes, the dlock.result attribute.
const (
	ResultAcquired    = "acquired"
	ResultNotObtained = "not_obtained" // TryLock found it taken: an outcome, not an error
	ResultCancelled   = "cancelled"    // ctx ended while blocking
	ResultReleased    = "released"
	ResultNotHeld     = "not_held"
	ResultLost        = "lost"
	ResultClosed      = "closed"
	ResultInvalid     = "invalid"
	ResultError       = "error" // Redis or network failure
	ResultRenewed     = "renewed"
	ResultGone        = "gone"
	ResultFailed      = "failed"
)

// Attribute keys.
var (
	AttrKind      = attribute.Key("dlock.kind")
	AttrName      = attribute.Key("dlock.name")
	AttrResult    = attribute.Key("dlock.result")
	AttrLeaseMode = attribute.Key("dlock.lease_mode")
	AttrHoldCount = attribute.Key("dlock.hold_count")
	AttrPermits   = attribute.Key("dlock.permits")
	AttrAttempts  = attribute.Key("dlock.attempts")
	AttrReason    = attribute.Key("dlock.wake_reason")
	AttrCause     = attribute.Key("dlock.cause")
	AttrHolder    = attribute.Key("dlock.holder")
	AttrLeaseLeft = attribute.Key("dlock.lease_left_ms")
	AttrToken     = attribute.Key("dlock.token")
)

// untracedGlobal is the OpenTelemetry global TracerProvider as it stands
// before any otel.SetTracerProvider. Until one is set, the global's tracers
// start only non-recording spans, which carry their parent's span context
// and nothing else, yet cost an allocation or two per call (about 1 µs of a
// Lock+Unlock pair): start skips them and leaves ctx as it is, unless the
// span in ctx records (a caller tracing with a provider of its own), since
// annotate and its kin write on the span in ctx. Once a provider is set,
// every span is started, in Clients made before too.
var untracedGlobal = otel.GetTracerProvider()

// noSpan stands for a span not started.
var noSpan trace.Span = noop.Span{}

// Telemetry holds the Client's tracer and instruments. With the OpenTelemetry
// globals unset, both are no-ops, and spans are not even started (see
// untracedGlobal).
type Telemetry struct {
	tracer   trace.Tracer
	global   bool // tracer comes from the global TracerProvider
	nameAttr bool // put the lock name on metrics too (high cardinality)

	waitDuration metric.Float64Histogram
	holdDuration metric.Float64Histogram
	acquisitions metric.Int64Counter
	releases     metric.Int64Counter
	lost         metric.Int64Counter
	renewals     metric.Int64Counter
	batchSize    metric.Int64Histogram
	waiters      metric.Int64UpDownCounter
	holds        metric.Int64UpDownCounter
}

// New returns the telemetry of a Client: spans go to tp and metrics to mp,
// each the OpenTelemetry global when nil; nameAttr puts the primitive's
// name on every metric point too.
func New(tp trace.TracerProvider, mp metric.MeterProvider, nameAttr bool) *Telemetry {
	global := tp == nil
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &Telemetry{tracer: tp.Tracer(instrumentationName), global: global, nameAttr: nameAttr}
	m := mp.Meter(instrumentationName)
	// Instrument creation fails only for invalid names; ours are fixed, and a
	// failed instrument is a no-op, so the errors are dropped.
	t.waitDuration, _ = m.Float64Histogram("dlock.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time blocking calls (Lock, RLock, Acquire, Await) took, by kind and result."))
	t.holdDuration, _ = m.Float64Histogram("dlock.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from acquiring a hold to its release or loss, by kind and result."))
	t.acquisitions, _ = m.Int64Counter("dlock.acquisitions", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Acquisition calls, by kind and result."))
	t.releases, _ = m.Int64Counter("dlock.releases", metric.WithUnit("{release}"),
		metric.WithDescription("Release calls (Unlock, RUnlock, Release), by kind and result."))
	t.lost, _ = m.Int64Counter("dlock.lost", metric.WithUnit("{hold}"),
		metric.WithDescription("Holds lost before their holder released them, by kind."))
	t.renewals, _ = m.Int64Counter("dlock.watchdog.renewals", metric.WithUnit("{renewal}"),
		metric.WithDescription("Lease renewals by the watchdog, by result (renewed, gone, failed)."))
	t.batchSize, _ = m.Int64Histogram("dlock.watchdog.batch.size", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases per renewal script call."))
	t.waiters, _ = m.Int64UpDownCounter("dlock.waiters", metric.WithUnit("{waiter}"),
		metric.WithDescription("Callers blocked right now, by kind."))
	t.holds, _ = m.Int64UpDownCounter("dlock.holds", metric.WithUnit("{hold}"),
		metric.WithDescription("Holds this Client keeps right now, by kind."))
	return t
}

// MetricAttrs returns the attribute set for a metric point. Without the name
// opt-in the sets are few, so they are cached.
func (t *Telemetry) MetricAttrs(kind, result, name string) metric.MeasurementOption {
	if t.nameAttr && name != "" {
		return metric.WithAttributes(AttrKind.String(kind), AttrResult.String(result), AttrName.String(name))
	}
	return CachedAttrs(kind, result)
}

var attrCache = map[[2]string]metric.MeasurementOption{}

func init() {
	kinds := []string{KindMutex, KindReentrant, KindRWRead, KindRWWrite, KindSemaphore, KindLatch, ""}
	results := []string{ResultAcquired, ResultNotObtained, ResultCancelled, ResultReleased, ResultNotHeld,
		ResultLost, ResultClosed, ResultInvalid, ResultError, ResultRenewed, ResultGone, ResultFailed, ""}
	for _, k := range kinds {
		for _, r := range results {
			var kv []attribute.KeyValue
			if k != "" {
				kv = append(kv, AttrKind.String(k))
			}
			if r != "" {
				kv = append(kv, AttrResult.String(r))
			}
			attrCache[[2]string{k, r}] = metric.WithAttributeSet(attribute.NewSet(kv...))
		}
	}
}

func CachedAttrs(kind, result string) metric.MeasurementOption {
	if o, ok := attrCache[[2]string{kind, result}]; ok {
		return o
	}
	return metric.WithAttributes(AttrKind.String(kind), AttrResult.String(result))
}

// Span is one instrumented public call.
type Span struct {
	t     *Telemetry
	span  trace.Span
	kind  string
	name  string
	start time.Time
}

var clientSpan = trace.WithSpanKind(trace.SpanKindClient)

// Start opens the span of a public call, named spanName (a constant), as a
// child of the span in ctx. Attributes are built only for a span that
// records, so that unconfigured OpenTelemetry costs next to nothing.
func (t *Telemetry) Start(ctx context.Context, kind, spanName, name string, lease time.Duration) (context.Context, Span) {
	if t.global && otel.GetTracerProvider() == untracedGlobal && !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, Span{t: t, span: noSpan, kind: kind, name: name, start: time.Now()}
	}
	ctx, sp := t.tracer.Start(ctx, spanName, clientSpan)
	if sp.IsRecording() {
		name = errs.CapName(name, wire.MaxNameLength) // a refused name may be any length
		switch {
		case lease < 0: // no lease (CountDownLatch)
			sp.SetAttributes(AttrKind.String(kind), AttrName.String(name))
		case lease > 0:
			sp.SetAttributes(AttrKind.String(kind), AttrName.String(name), AttrLeaseMode.String("explicit"))
		default:
			sp.SetAttributes(AttrKind.String(kind), AttrName.String(name), AttrLeaseMode.String("watchdog"))
		}
	}
	return ctx, Span{t: t, span: sp, kind: kind, name: name, start: time.Now()}
}

// finish sets the result and status of a recording span and ends it.
func (s Span) finish(result string, err error) {
	if s.span.IsRecording() {
		if err != nil {
			// As RecordError does, but exception.type names what the error
			// is to a caller (the dlock sentinel it matches), not the
			// unexported type that carries it.
			s.span.AddEvent("exception", trace.WithAttributes(
				attribute.String("exception.type", ExceptionType(err)),
				attribute.String("exception.message", err.Error())))
			s.span.SetStatus(codes.Error, err.Error())
		}
		if result != "" {
			s.span.SetAttributes(AttrResult.String(result))
		}
	}
	s.span.End()
}

// EndAcquire closes the span of an acquisition. acquired is false for a
// TryLock that found the lock taken, which is an outcome, not an error.
// blocking calls also record the wait duration.
func (s Span) EndAcquire(err error, acquired, blocking bool) {
	result := ResultAcquired
	switch {
	case err != nil:
		result = ResultOf(err)
	case !acquired:
		result = ResultNotObtained
	}
	if result == ResultNotObtained {
		s.finish(result, nil) // TryLock's "taken" is an outcome, not a failure
	} else {
		s.finish(result, err)
	}
	ctx := context.Background()
	if s.t.acquisitions.Enabled(ctx) {
		s.t.acquisitions.Add(ctx, 1, s.t.MetricAttrs(s.kind, result, s.name))
	}
	if blocking && s.t.waitDuration.Enabled(ctx) {
		s.t.waitDuration.Record(ctx, time.Since(s.start).Seconds(), s.t.MetricAttrs(s.kind, result, s.name))
	}
}

// EndRelease closes the span of a release call; errs.ErrNotHeld and errs.ErrLost mark
// it failed.
func (s Span) EndRelease(err error) {
	result := ResultReleased
	if err != nil {
		result = ResultOf(err)
	}
	s.finish(result, err)
	if ctx := context.Background(); s.t.releases.Enabled(ctx) {
		s.t.releases.Add(ctx, 1, s.t.MetricAttrs(s.kind, result, s.name))
	}
}

// EndOther closes the span of a call that neither acquires nor releases.
func (s Span) EndOther(err error) {
	result := ""
	if err != nil {
		result = ResultOf(err)
	}
	s.finish(result, err)
}

// sentinels are dlock's errors as exception.type names them, the most
// telling first: an error matching several is named by the first.
var sentinels = []struct {
	err  error
	name string
}{
	{errs.ErrLost, "dlock.ErrLost"}, {errs.ErrNotReplicated, "dlock.ErrNotReplicated"}, {errs.ErrUnavailable, "dlock.ErrUnavailable"},
	{errs.ErrInvalid, "dlock.ErrInvalid"}, {errs.ErrUpgrade, "dlock.ErrUpgrade"}, {errs.ErrClosed, "dlock.ErrClosed"},
	{errs.ErrNotHeld, "dlock.ErrNotHeld"}, {errs.ErrNotFound, "dlock.ErrNotFound"}, {errs.ErrNoLeader, "dlock.ErrNoLeader"},
	{context.DeadlineExceeded, "context.DeadlineExceeded"}, {context.Canceled, "context.Canceled"},
	{errs.ErrNotObtained, "dlock.ErrNotObtained"},
}

// ExceptionType is what a span's exception event calls err: the first
// sentinel it matches, or the type of the error it wraps.
func ExceptionType(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	var ce *errs.Call
	if errors.As(err, &ce) {
		if wrapped := ce.Unwrap(); len(wrapped) > 0 {
			err = wrapped[len(wrapped)-1]
		}
	}
	return fmt.Sprintf("%T", err)
}

func ResultOf(err error) string {
	switch {
	case errors.Is(err, errs.ErrLost):
		return ResultLost
	case errors.Is(err, errs.ErrNotHeld):
		return ResultNotHeld
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ResultCancelled
	case errors.Is(err, errs.ErrNotObtained):
		return ResultNotObtained
	case errors.Is(err, errs.ErrClosed):
		return ResultClosed
	case errors.Is(err, errs.ErrInvalid), errors.Is(err, errs.ErrUpgrade):
		return ResultInvalid
	}
	return ResultError
}

// Annotate sets attributes on the span in ctx, if it records.
func Annotate(ctx context.Context, kv ...attribute.KeyValue) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.SetAttributes(kv...)
	}
}

// WokeUp records a wake-up of a blocked call on its span: why, and which
// attempt follows.
func WokeUp(ctx context.Context, why string, attempt int) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.AddEvent("dlock.wake", trace.WithAttributes(AttrReason.String(why), AttrAttempts.Int(attempt)))
	}
}

// Blocked records on the span in ctx that a try found the lock held: by
// whom (a Client ID, or a reentrant owner ID, which starts with one) and for
// how much longer at most.
func Blocked(ctx context.Context, holder string, left time.Duration) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.AddEvent("dlock.blocked", trace.WithAttributes(AttrHolder.String(holder), AttrLeaseLeft.Int64(left.Milliseconds())))
	}
}

// HoldStarted and HoldEnded keep the holds gauge and hold durations: a hold
// of a primitive of kind called name, acquired at acquired, ended with
// result.
func (t *Telemetry) HoldStarted(kind, name string) {
	if ctx := context.Background(); t.holds.Enabled(ctx) {
		t.holds.Add(ctx, 1, t.MetricAttrs(kind, "", name))
	}
}

func (t *Telemetry) HoldEnded(kind, name string, acquired time.Time, result string) {
	ctx := context.Background()
	if t.holds.Enabled(ctx) {
		t.holds.Add(ctx, -1, t.MetricAttrs(kind, "", name))
	}
	if t.holdDuration.Enabled(ctx) {
		t.holdDuration.Record(ctx, time.Since(acquired).Seconds(), t.MetricAttrs(kind, result, name))
	}
}

// HoldLost records a loss: the counter, and a short span linked to the
// span that acquired the hold (origin), so a trace shows where the lost
// hold came from.
func (t *Telemetry) HoldLost(kind, name string, origin trace.SpanContext, cause error) {
	ctx := context.Background()
	t.lost.Add(ctx, 1, t.MetricAttrs(kind, "", name))
	opts := []trace.SpanStartOption{trace.WithAttributes(AttrKind.String(kind), AttrName.String(name),
		AttrCause.String(cause.Error()))}
	if origin.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: origin}))
	}
	_, sp := t.tracer.Start(ctx, "dlock.Lost", opts...)
	sp.SetStatus(codes.Error, cause.Error())
	sp.End()
}

// Renewals counts n renewals by the watchdog with result (ResultRenewed,
// ResultGone, ResultFailed).
func (t *Telemetry) Renewals(n int64, result string) {
	t.renewals.Add(context.Background(), n, CachedAttrs("", result))
}

// Batch records how many leases one renewal script call carried.
func (t *Telemetry) Batch(leases int) {
	t.batchSize.Record(context.Background(), int64(leases))
}

// Waiters adds delta to the gauge of callers blocked on a primitive of kind
// called name.
func (t *Telemetry) Waiters(delta int64, kind, name string) {
	t.waiters.Add(context.Background(), delta, t.MetricAttrs(kind, "", name))
}
