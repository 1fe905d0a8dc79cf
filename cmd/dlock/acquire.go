package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
)

// pollInterval is how often the waiting line on a terminal is refreshed.
const pollInterval = 500 * time.Millisecond

// primitive is what run holds: a Mutex, or permits of a Semaphore.
type primitive struct {
	try  func(context.Context) (*held, error) // nil, nil when busy
	wait func(context.Context) (*held, error)
}

func mutexPrimitive(c *dlock.Client, name string, ttl time.Duration) primitive {
	m := c.Mutex(name)
	hold := func() *held {
		return &held{name: name, token: m.Token(), lease: ttl, ctx: m.HoldContext, release: m.Unlock}
	}
	return primitive{
		try: func(ctx context.Context) (*held, error) {
			ok, err := m.TryLock(ctx)
			if err != nil || !ok {
				return nil, err
			}
			return hold(), nil
		},
		wait: func(ctx context.Context) (*held, error) {
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return hold(), nil
		},
	}
}

// semaphorePrimitive sets up the semaphore called name with a total of n
// (see setPermits) and takes one permit of it.
func semaphorePrimitive(ctx context.Context, c *dlock.Client, name string, n int, ttl time.Duration) (primitive, error) {
	s := c.Semaphore(name, dlock.WithIdleExpiry(semIdleExpiry))
	if err := setPermits(ctx, s, n); err != nil {
		return primitive{}, err
	}
	hold := func(p *dlock.Permit) *held {
		return &held{name: name, token: p.Token(), lease: ttl, ctx: p.HoldContext, release: p.Release}
	}
	return primitive{
		try: func(ctx context.Context) (*held, error) {
			p, err := s.TryAcquire(ctx, 1)
			if errors.Is(err, dlock.ErrNotObtained) {
				return nil, nil
			}
			if err != nil {
				return nil, err
			}
			return hold(p), nil
		},
		wait: func(ctx context.Context) (*held, error) {
			p, err := s.Acquire(ctx, 1)
			if err != nil {
				return nil, err
			}
			return hold(p), nil
		},
	}, nil
}

// setPermits makes n the semaphore's total if none is set. A total already
// set to another number is an error: changing it would change what the
// runs holding permits now were promised.
func setPermits(ctx context.Context, s *dlock.Semaphore, n int) error {
	for range 3 {
		ok, err := s.TrySetPermits(ctx, n)
		if err != nil || ok {
			return mapErr(err)
		}
		total, err := s.Total(ctx)
		if err != nil {
			return mapErr(err)
		}
		if total == n {
			return nil
		}
		if total > 0 {
			return fail(exitError, "semaphore %q has %d permits, not %d: every run on a name must give the same --permits "+
				"(the total changes once nobody has used the semaphore for %v)", s.Name(), total, n, semIdleExpiry)
		}
		// Expired between the two calls: set it again.
	}
	return fail(exitError, "semaphore %q: could not set its total", s.Name())
}

// mapErr is redisFailure for a possibly nil error.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	return redisFailure(err)
}

// acquire takes the lock (or a permit) for run: at once, or after waiting,
// which it shows on standard error. Busy with --no-wait, or after
// --timeout, is exitBusy; a signal while waiting ends dlock with 128+N.
func acquire(e *env, c *dlock.Client, name string, f *runFlags, sigs <-chan os.Signal) (*held, error) {
	ctx := context.Background()
	p := mutexPrimitive(c, name, f.ttl)
	if f.permits > 0 {
		var err error
		if p, err = semaphorePrimitive(ctx, c, name, f.permits, f.ttl); err != nil {
			return nil, err
		}
	}
	return acquireWith(e, p, name, f, sigs, func() string { return describe(c, name) })
}

// acquireWith is acquire of p, whose state describe tells.
func acquireWith(e *env, p primitive, name string, f *runFlags, sigs <-chan os.Signal, describe func() string) (*held, error) {
	ctx := context.Background()
	h, err := p.try(ctx)
	if err != nil || h != nil {
		return h, mapErr(err)
	}
	if f.noWait {
		return nil, fail(exitBusy, "%q is busy: %s; not waiting (--no-wait)", name, describe())
	}

	waitCtx, cancel := context.WithCancel(ctx)
	if f.timeout > 0 {
		waitCtx, cancel = context.WithTimeout(ctx, f.timeout)
	}
	defer cancel()
	type result struct {
		h   *held
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := p.wait(waitCtx)
		done <- result{h, err}
	}()

	start := time.Now()
	line := &statusLine{w: e.stderr, tty: isTerminal(2)}
	line.show(fmt.Sprintf("dlock run: waiting for %q: %s", name, describe()))
	var tick <-chan time.Time
	if line.tty {
		t := time.NewTicker(pollInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case r := <-done:
			line.clear()
			switch {
			case r.err == nil:
				return r.h, nil
			case errors.Is(r.err, context.DeadlineExceeded) && errors.Is(r.err, dlock.ErrNotObtained):
				return nil, fail(exitBusy, "%q is still busy after %v (--timeout): %s", name, f.timeout, describe())
			}
			return nil, redisFailure(r.err)
		case s := <-sigs:
			cancel()
			r := <-done
			line.clear()
			if r.err == nil {
				r.h.releaseQuietly()
			}
			return nil, fail(signalStatus(s), "got %v while waiting for %q; the command did not run", s, name)
		case <-tick:
			waited := time.Since(start).Truncate(time.Second)
			line.show(fmt.Sprintf("dlock run: waiting for %q (%v): %s", name, waited, describe()))
		}
	}
}

// describe says who holds the primitive called name, and how many wait, as
// one read finds it.
func describe(c *dlock.Client, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), pollInterval)
	defer cancel()
	st, err := c.Status(ctx, name)
	switch {
	case errors.Is(err, dlock.ErrNotFound):
		return "released meanwhile"
	case err != nil:
		return "holder unknown: " + err.Error()
	}
	var b strings.Builder
	switch {
	case len(st.Holders) == 0:
		b.WriteString("not held")
	default:
		hd := st.Holders[0]
		fmt.Fprintf(&b, "held by %s (lease %v left)", holderName(hd), roundLease(hd.Lease))
		if n := len(st.Holders) - 1; n > 0 {
			fmt.Fprintf(&b, " and %d more", n)
		}
	}
	if st.Kind == dlock.KindSemaphore {
		fmt.Fprintf(&b, ", %d of %d permits free", st.Free, st.Total)
	}
	if st.Waiting > 0 {
		fmt.Fprintf(&b, ", %d waiting", st.Waiting)
	}
	return b.String()
}

// holderName is the name of the Client that holds hd, or its ID when the
// Client has no name.
func holderName(hd dlock.Holder) string {
	if hd.Client != "" {
		return hd.Client
	}
	return hd.ID
}

// roundLease rounds a lease left for display.
func roundLease(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// statusLine shows the state of a wait on standard error: on a terminal as
// one line that each show rewrites, otherwise only the first show, as a
// line of its own.
type statusLine struct {
	w     io.Writer
	tty   bool
	shown bool
	width int // of the text on the terminal now
}

func (l *statusLine) show(text string) {
	if !l.tty {
		if !l.shown {
			fmt.Fprintln(l.w, text)
		}
		l.shown = true
		return
	}
	if w := terminalWidth(2); w > 1 {
		text = truncate(text, w-1) // a wrapped line could not be rewritten
	}
	n := utf8.RuneCountInString(text)
	fmt.Fprintf(l.w, "\r%s%s", text, strings.Repeat(" ", max(0, l.width-n)))
	l.shown, l.width = true, n
}

// clear removes the line from a terminal.
func (l *statusLine) clear() {
	if l.tty && l.shown {
		fmt.Fprintf(l.w, "\r%s\r", strings.Repeat(" ", l.width))
		l.width = 0
	}
}

// truncate shortens text to at most n runes.
func truncate(text string, n int) string {
	for i := range text {
		if n == 0 {
			return text[:i]
		}
		n--
	}
	return text
}
