package dlock

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
)

// instrumentationName names dlock's tracer and meter.
const instrumentationName = "github.com/dlock-go/dlock"

// Primitive kinds, the dlock.kind attribute.
const (
	kindMutexName     = "mutex"
	kindReentrantName = "reentrant_mutex"
	kindRWReadName    = "rwmutex_read"
	kindRWWriteName   = "rwmutex_write"
	kindSemaphoreName = "semaphore"
	kindLatchName     = "countdown_latch"
	kindElectionName  = "election"
)

// Outcomes, the dlock.result attribute.
const (
	resultAcquired    = "acquired"
	resultNotObtained = "not_obtained" // TryLock found it taken: an outcome, not an error
	resultCancelled   = "cancelled"    // ctx ended while blocking
	resultReleased    = "released"
	resultNotHeld     = "not_held"
	resultLost        = "lost"
	resultClosed      = "closed"
	resultInvalid     = "invalid"
	resultError       = "error" // Redis or network failure
	resultRenewed     = "renewed"
	resultGone        = "gone"
	resultFailed      = "failed"
)

// Attribute keys.
var (
	attrKind      = attribute.Key("dlock.kind")
	attrName      = attribute.Key("dlock.name")
	attrResult    = attribute.Key("dlock.result")
	attrLeaseMode = attribute.Key("dlock.lease_mode")
	attrHoldCount = attribute.Key("dlock.hold_count")
	attrPermits   = attribute.Key("dlock.permits")
	attrAttempts  = attribute.Key("dlock.attempts")
	attrReason    = attribute.Key("dlock.wake_reason")
	attrCause     = attribute.Key("dlock.cause")
	attrHolder    = attribute.Key("dlock.holder")
	attrLeaseLeft = attribute.Key("dlock.lease_left_ms")
	attrToken     = attribute.Key("dlock.token")
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

// telemetry holds the Client's tracer and instruments. With the OpenTelemetry
// globals unset, both are no-ops, and spans are not even started (see
// untracedGlobal).
type telemetry struct {
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

func newTelemetry(cfg *config) *telemetry {
	tp, mp := cfg.tracerProvider, cfg.meterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &telemetry{tracer: tp.Tracer(instrumentationName), global: cfg.tracerProvider == nil, nameAttr: cfg.nameAttr}
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

// metricAttrs returns the attribute set for a metric point. Without the name
// opt-in the sets are few, so they are cached.
func (t *telemetry) metricAttrs(kind, result, name string) metric.MeasurementOption {
	if t.nameAttr && name != "" {
		return metric.WithAttributes(attrKind.String(kind), attrResult.String(result), attrName.String(name))
	}
	return cachedAttrs(kind, result)
}

var attrCache = map[[2]string]metric.MeasurementOption{}

func init() {
	kinds := []string{kindMutexName, kindReentrantName, kindRWReadName, kindRWWriteName, kindSemaphoreName, kindLatchName, ""}
	results := []string{resultAcquired, resultNotObtained, resultCancelled, resultReleased, resultNotHeld,
		resultLost, resultClosed, resultInvalid, resultError, resultRenewed, resultGone, resultFailed, ""}
	for _, k := range kinds {
		for _, r := range results {
			var kv []attribute.KeyValue
			if k != "" {
				kv = append(kv, attrKind.String(k))
			}
			if r != "" {
				kv = append(kv, attrResult.String(r))
			}
			attrCache[[2]string{k, r}] = metric.WithAttributeSet(attribute.NewSet(kv...))
		}
	}
}

func cachedAttrs(kind, result string) metric.MeasurementOption {
	if o, ok := attrCache[[2]string{kind, result}]; ok {
		return o
	}
	return metric.WithAttributes(attrKind.String(kind), attrResult.String(result))
}

// span is one instrumented public call.
type span struct {
	t     *telemetry
	span  trace.Span
	kind  string
	name  string
	start time.Time
}

var clientSpan = trace.WithSpanKind(trace.SpanKindClient)

// start opens the span of a public call, named spanName (a constant), as a
// child of the span in ctx. Attributes are built only for a span that
// records, so that unconfigured OpenTelemetry costs next to nothing.
func (t *telemetry) start(ctx context.Context, kind, spanName, name string, lease time.Duration) (context.Context, span) {
	if t.global && otel.GetTracerProvider() == untracedGlobal && !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, span{t: t, span: noSpan, kind: kind, name: name, start: time.Now()}
	}
	ctx, sp := t.tracer.Start(ctx, spanName, clientSpan)
	if sp.IsRecording() {
		name = capName(name, MaxNameLength) // a refused name may be any length
		switch {
		case lease < 0: // no lease (CountDownLatch)
			sp.SetAttributes(attrKind.String(kind), attrName.String(name))
		case lease > 0:
			sp.SetAttributes(attrKind.String(kind), attrName.String(name), attrLeaseMode.String("explicit"))
		default:
			sp.SetAttributes(attrKind.String(kind), attrName.String(name), attrLeaseMode.String("watchdog"))
		}
	}
	return ctx, span{t: t, span: sp, kind: kind, name: name, start: time.Now()}
}

// finish sets the result and status of a recording span and ends it.
func (s span) finish(result string, err error) {
	if s.span.IsRecording() {
		if err != nil {
			// As RecordError does, but exception.type names what the error
			// is to a caller (the dlock sentinel it matches), not the
			// unexported type that carries it.
			s.span.AddEvent("exception", trace.WithAttributes(
				attribute.String("exception.type", exceptionType(err)),
				attribute.String("exception.message", err.Error())))
			s.span.SetStatus(codes.Error, err.Error())
		}
		if result != "" {
			s.span.SetAttributes(attrResult.String(result))
		}
	}
	s.span.End()
}

// endAcquire closes the span of an acquisition. acquired is false for a
// TryLock that found the lock taken, which is an outcome, not an error.
// blocking calls also record the wait duration.
func (s span) endAcquire(err error, acquired, blocking bool) {
	result := resultAcquired
	switch {
	case err != nil:
		result = resultOf(err)
	case !acquired:
		result = resultNotObtained
	}
	if result == resultNotObtained {
		s.finish(result, nil) // TryLock's "taken" is an outcome, not a failure
	} else {
		s.finish(result, err)
	}
	ctx := context.Background()
	if s.t.acquisitions.Enabled(ctx) {
		s.t.acquisitions.Add(ctx, 1, s.t.metricAttrs(s.kind, result, s.name))
	}
	if blocking && s.t.waitDuration.Enabled(ctx) {
		s.t.waitDuration.Record(ctx, time.Since(s.start).Seconds(), s.t.metricAttrs(s.kind, result, s.name))
	}
}

// endRelease closes the span of a release call; ErrNotHeld and ErrLost mark
// it failed.
func (s span) endRelease(err error) {
	result := resultReleased
	if err != nil {
		result = resultOf(err)
	}
	s.finish(result, err)
	if ctx := context.Background(); s.t.releases.Enabled(ctx) {
		s.t.releases.Add(ctx, 1, s.t.metricAttrs(s.kind, result, s.name))
	}
}

// endOther closes the span of a call that neither acquires nor releases.
func (s span) endOther(err error) {
	result := ""
	if err != nil {
		result = resultOf(err)
	}
	s.finish(result, err)
}

// sentinels are dlock's errors as exception.type names them, the most
// telling first: an error matching several is named by the first.
var sentinels = []struct {
	err  error
	name string
}{
	{ErrLost, "dlock.ErrLost"}, {ErrNotReplicated, "dlock.ErrNotReplicated"}, {ErrUnavailable, "dlock.ErrUnavailable"},
	{ErrInvalid, "dlock.ErrInvalid"}, {ErrUpgrade, "dlock.ErrUpgrade"}, {ErrClosed, "dlock.ErrClosed"},
	{ErrNotHeld, "dlock.ErrNotHeld"}, {ErrNotFound, "dlock.ErrNotFound"}, {ErrNoLeader, "dlock.ErrNoLeader"},
	{context.DeadlineExceeded, "context.DeadlineExceeded"}, {context.Canceled, "context.Canceled"},
	{ErrNotObtained, "dlock.ErrNotObtained"},
}

// exceptionType is what a span's exception event calls err: the first
// sentinel it matches, or the type of the error it wraps.
func exceptionType(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	var ce *callError
	if errors.As(err, &ce) {
		if wrapped := ce.Unwrap(); len(wrapped) > 0 {
			err = wrapped[len(wrapped)-1]
		}
	}
	return fmt.Sprintf("%T", err)
}

func resultOf(err error) string {
	switch {
	case errors.Is(err, ErrLost):
		return resultLost
	case errors.Is(err, ErrNotHeld):
		return resultNotHeld
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return resultCancelled
	case errors.Is(err, ErrNotObtained):
		return resultNotObtained
	case errors.Is(err, ErrClosed):
		return resultClosed
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrUpgrade):
		return resultInvalid
	}
	return resultError
}

// annotate sets attributes on the span in ctx, if it records.
func annotate(ctx context.Context, kv ...attribute.KeyValue) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.SetAttributes(kv...)
	}
}

var wakeReasonNames = [...]string{wakeRelease: "notification", wakeLocal: "local_release",
	wakeSubscribed: "subscribed", wakeClosed: "closed", wakeHanded: "handed", wakeRetime: "retime", wakeCohort: "cohort", wakeQueued: "queued"}

// wokeUp records a wake-up of a blocked call on its span: why, and which
// attempt follows.
func wokeUp(ctx context.Context, why string, attempt int) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.AddEvent("dlock.wake", trace.WithAttributes(attrReason.String(why), attrAttempts.Int(attempt)))
	}
}

// blocked records on the span in ctx that a try found the lock held: by
// whom (a Client ID, or a reentrant owner ID, which starts with one) and for
// how much longer at most.
func blocked(ctx context.Context, holder string, left time.Duration) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.AddEvent("dlock.blocked", trace.WithAttributes(attrHolder.String(holder), attrLeaseLeft.Int64(left.Milliseconds())))
	}
}

// holdStarted and holdEnded keep the holds gauge and hold durations.
func (t *telemetry) holdStarted(l *hold) {
	if ctx := context.Background(); t.holds.Enabled(ctx) {
		t.holds.Add(ctx, 1, t.metricAttrs(l.kind, "", l.name))
	}
}

func (t *telemetry) holdEnded(l *hold, result string) {
	ctx := context.Background()
	if t.holds.Enabled(ctx) {
		t.holds.Add(ctx, -1, t.metricAttrs(l.kind, "", l.name))
	}
	if t.holdDuration.Enabled(ctx) {
		t.holdDuration.Record(ctx, time.Since(l.acquired).Seconds(), t.metricAttrs(l.kind, result, l.name))
	}
}

// holdLost records a loss: the counter, and a short span linked to the span
// that acquired the hold, so a trace shows where the lost hold came from.
func (t *telemetry) holdLost(l *hold, cause error) {
	ctx := context.Background()
	t.lost.Add(ctx, 1, t.metricAttrs(l.kind, "", l.name))
	opts := []trace.SpanStartOption{trace.WithAttributes(attrKind.String(l.kind), attrName.String(l.name),
		attrCause.String(cause.Error()))}
	if l.origin.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: l.origin}))
	}
	_, sp := t.tracer.Start(ctx, "dlock.Lost", opts...)
	sp.SetStatus(codes.Error, cause.Error())
	sp.End()
}
