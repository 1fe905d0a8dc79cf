package dlock

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Defaults. Every default lives here.
const (
	// DefaultKeyPrefix starts every key dlock writes.
	DefaultKeyPrefix = "dlock:"
	// DefaultWatchdogTimeout is the lease of a hold taken without WithLease.
	// The watchdog renews it every third of that while the hold lasts.
	DefaultWatchdogTimeout = 30 * time.Second

	// renewBatch is the most keys one renewal script call carries.
	renewBatch = 100
	// subscriptionLinger keeps a lock's channel subscribed after its last
	// waiter leaves, so a hot lock does not re-subscribe for every wait.
	subscriptionLinger = 5 * time.Second
	// pipelinesInFlight is how many pipelines of coalesced calls a Client
	// keeps in flight before further calls wait to share the next one.
	// Measured on 2 cores with 32 goroutines: 4 did best (2 and 8 close).
	pipelinesInFlight = 4
	// subscribeTimeout bounds a waiter's SUBSCRIBE on the shared connection.
	subscribeTimeout = 5 * time.Second
)

// Option configures a Client. See New.
type Option func(*config)

type config struct {
	prefix         string
	watchdog       time.Duration
	logger         *slog.Logger
	tracerProvider trace.TracerProvider // nil: the OpenTelemetry global
	meterProvider  metric.MeterProvider // nil: the OpenTelemetry global
	nameAttr       bool
	err            error
}

func defaultConfig() config {
	return config{
		prefix:   DefaultKeyPrefix,
		watchdog: DefaultWatchdogTimeout,
		logger:   slog.New(slog.DiscardHandler),
	}
}

// WithKeyPrefix sets the string every key starts with. Default "dlock:". It
// must not contain '{' or '}', which dlock uses for the cluster hash tag.
func WithKeyPrefix(prefix string) Option {
	return func(c *config) {
		for _, r := range prefix {
			if r == '{' || r == '}' {
				c.err = invalidf("key prefix %q contains a brace", prefix)
				return
			}
		}
		c.prefix = prefix
	}
}

// WithWatchdogTimeout sets the lease of holds taken without WithLease.
// Default 30s. The watchdog renews such holds every d/3, and a hold whose
// renewals have failed for d is reported lost. d must be positive; there is
// no floor, but leases are kept in whole milliseconds, rounded up.
func WithWatchdogTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.err = invalidf("watchdog timeout %v is not positive", d)
			return
		}
		c.watchdog = d
	}
}

// WithLogger sets where dlock logs lost holds, renewal failures and pub/sub
// reconnects. Default: nothing is logged.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithTracerProvider sets where dlock's spans go. Default: the OpenTelemetry
// global TracerProvider, so a service that configured OpenTelemetry gets
// them with no dlock-specific setup.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider = tp }
}

// WithMeterProvider sets where dlock's metrics go. Default: the
// OpenTelemetry global MeterProvider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider = mp }
}

// WithMetricLockNames adds the lock's name (attribute dlock.name) to every
// metric point. Off by default: one time series per lock name can be many.
// Spans always carry the name.
func WithMetricLockNames() Option {
	return func(c *config) { c.nameAttr = true }
}

// LockOption configures one lock handle.
type LockOption func(*lockConfig)

type lockConfig struct {
	lease time.Duration // 0: watchdog
	err   error
}

// WithLease gives every hold taken through the handle a fixed lease of d: it
// is never renewed, and expires d after it was taken unless released first.
// Its Lost channel closes when d has passed. d must be positive; it is kept in
// whole milliseconds, rounded up. Without WithLease the watchdog renews the
// hold until it is released.
func WithLease(d time.Duration) LockOption {
	return func(c *lockConfig) {
		if d <= 0 {
			c.err = invalidf("lease %v is not positive", d)
			return
		}
		c.lease = d
	}
}

func buildLockConfig(opts []LockOption) lockConfig {
	var lc lockConfig
	for _, o := range opts {
		if o != nil {
			o(&lc)
		}
	}
	return lc
}

// millis converts d to whole milliseconds for PX and PEXPIRE, rounding up so
// that no positive lease becomes zero.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
