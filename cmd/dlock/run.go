package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"time"

	"github.com/dlock-go/dlock"
)

// semIdleExpiry is the idle expiry of the semaphores run creates for
// --permits: one nobody has used for that long vanishes, total and all.
const semIdleExpiry = 24 * time.Hour

// releaseTimeout bounds the release after the command exits.
const releaseTimeout = 10 * time.Second

var runCommand = &command{
	name:    "run",
	summary: "[--redis URL] [--ttl D] [--timeout D] [--no-wait] [--permits N | --redisson] [--grace D] NAME -- COMMAND [ARG...]",
	about: `Run COMMAND while holding the lock called NAME, and release it when COMMAND exits.
With --permits N, hold one of N permits of the semaphore called NAME instead. With
--redisson, hold the Redisson (Java) RLock called NAME, as redisson.getLock(NAME) does.

COMMAND runs in a process group of its own, with DLOCK_NAME and DLOCK_TOKEN (the hold's
fencing token) in its environment. SIGINT, SIGTERM and SIGHUP are passed on to the group,
except one that dlock was started with ignored (nohup), which stays ignored for COMMAND.
The watchdog renews the lock every third of --ttl; if the lock is lost while COMMAND runs,
the group gets SIGTERM, then SIGKILL after --grace.

While it waits, dlock shows on standard error who holds the lock and what its lease has
left: on a terminal as a line that updates, otherwise once.

The first run with --permits N sets the semaphore's total to N. A run whose N differs from
the total already set fails (exit 1) rather than change it under other holders; a
semaphore nobody uses for 24h expires, and a later run sets it anew.

Exit status: COMMAND's own (128+N when signal N killed it); 75 when the lock was busy
(--no-wait, or --timeout passed) and COMMAND did not run; 69 when Redis could not be
reached; 70 when the lock was lost while COMMAND ran; 126/127 when COMMAND could not be
started; 128+N when signal N stopped dlock before COMMAND started; 2 for a usage error;
1 for other errors.`,
	define: func(fs *flag.FlagSet) { defineRunFlags(fs) },
	run:    runMain,
}

type runFlags struct {
	ttl, timeout, grace time.Duration
	noWait              bool
	permits             int
	redisson            bool
}

func defineRunFlags(fs *flag.FlagSet) *runFlags {
	f := &runFlags{}
	fs.DurationVar(&f.ttl, "ttl", dlock.DefaultWatchdogTimeout, "lease `D` of the lock, renewed every third of it while COMMAND runs (the watchdog timeout)")
	fs.DurationVar(&f.timeout, "timeout", 0, "give up waiting after `D` and exit 75 (default: wait for ever)")
	fs.BoolVar(&f.noWait, "no-wait", false, "exit 75 at once if the lock is busy")
	fs.IntVar(&f.permits, "permits", 0, "hold one of `N` permits of a semaphore instead of a lock")
	fs.DurationVar(&f.grace, "grace", 10*time.Second, "time `D` that COMMAND gets between SIGTERM and SIGKILL when the lock is lost")
	fs.BoolVar(&f.redisson, "redisson", false, "take the Redisson (Java) RLock called NAME, as redisson.getLock(NAME) does, instead of a dlock lock")
	return f
}

func runMain(c *command, e *env, args []string) error {
	fs, redisURL := c.flags()
	f := defineRunFlags(fs)
	dash := slices.Index(args, "--")
	if dash < 0 {
		if _, err := c.parse(e, fs, args); err != nil {
			return err
		}
		return c.usageErr("missing -- before the command")
	}
	pos, err := c.parse(e, fs, args[:dash])
	if err != nil {
		return err
	}
	argv := args[dash+1:]
	switch {
	case len(pos) != 1:
		return c.usageErr("want one NAME before --, got %d arguments", len(pos))
	case len(argv) == 0:
		return c.usageErr("no command after --")
	case f.ttl < dlock.MinLease || f.ttl > dlock.MaxLease:
		return c.usageErr("--ttl %v is outside [%v, %v], the leases dlock accepts", f.ttl, dlock.MinLease, dlock.MaxLease)
	case len(pos) == 1 && len(pos[0]) > dlock.MaxNameLength:
		return c.usageErr("a NAME of %d bytes is longer than %d", len(pos[0]), dlock.MaxNameLength)
	case f.timeout < 0, f.grace < 0, f.permits < 0:
		return c.usageErr("--timeout, --grace and --permits must not be negative")
	case f.noWait && f.timeout > 0:
		return c.usageErr("--no-wait and --timeout exclude each other")
	case f.redisson && f.permits > 0:
		return c.usageErr("--redisson takes a lock; --permits is not supported with it")
	case !runSupported:
		return fail(exitError, "not supported on this system: it needs Unix process groups")
	}
	name := pos[0]
	if f.redisson {
		return redissonRun(e, *redisURL, name, argv, f)
	}

	// The Client keeps the library's default name, "host:pid", which
	// status and list show as the holder.
	client, closeClient, err := connect(e, *redisURL, dlock.WithWatchdogTimeout(f.ttl))
	if err != nil {
		return err
	}
	defer closeClient()

	// Signals are caught from here on, when there is a hold to release
	// or a queue to leave; before, one ends dlock at once, also while it
	// waits for a Redis that does not answer. A signal dlock was started
	// with ignored (nohup, a background job of a script) stays ignored,
	// and the command inherits that.
	sigs, stop := catchSignals()
	defer stop()

	h, err := acquire(e, client, name, f, sigs)
	if err != nil {
		return err
	}
	return superviseHeld(e, h, argv, f, sigs)
}

// catchSignals starts catching the signals passed on to the command, but
// those dlock was started with ignored, which stay ignored. Call the
// returned func to stop.
func catchSignals() (<-chan os.Signal, func()) {
	sigs := make(chan os.Signal, 4)
	var caught []os.Signal
	for _, s := range forwarded {
		if !signal.Ignored(s) {
			caught = append(caught, s)
		}
	}
	if len(caught) == 0 {
		return sigs, func() {}
	}
	signal.Notify(sigs, caught...)
	return sigs, func() { signal.Stop(sigs) }
}

// superviseHeld runs argv under h, unless a signal came before it could
// start.
func superviseHeld(e *env, h *held, argv []string, f *runFlags, sigs <-chan os.Signal) error {
	select {
	case s := <-sigs: // before the command could start
		h.releaseQuietly()
		return fail(signalStatus(s), "got %v before the command started; it did not run", s)
	default:
	}
	return supervise(e, h, argv, f.grace, sigs)
}

// held is a hold of a lock or of a permit.
type held struct {
	name    string
	token   uint64
	lease   time.Duration
	ctx     func(context.Context) (context.Context, context.CancelFunc) // HoldContext
	release func(context.Context) error
}

// releaseQuietly releases h, saying nothing if it fails: the hold then ends
// by its lease.
func (h *held) releaseQuietly() {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_ = h.release(ctx)
}

// supervise runs argv while h is held, and returns its exit status as an
// exitErr (nil for 0), or exitLost when h was lost meanwhile.
func supervise(e *env, h *held, argv []string, grace time.Duration, sigs <-chan os.Signal) error {
	hctx, stopWatching := h.ctx(context.Background())
	defer stopWatching()

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "DLOCK_NAME="+h.name, "DLOCK_TOKEN="+strconv.FormatUint(h.token, 10))
	foreground := setupChild(cmd)
	if err := cmd.Start(); err != nil {
		h.releaseQuietly()
		code := exitNoExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = exitNotFound
		}
		return fail(code, "%v", err)
	}
	if foreground {
		startedInForeground()
	}
	pgid := cmd.Process.Pid
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	var lost error            // why the hold was lost, once it was
	var kill <-chan time.Time // fires --grace after the SIGTERM of a loss
	var killAt time.Time
	lostc := hctx.Done() // nil once seen
	for exited := false; !exited; {
		select {
		case <-waited:
			exited = true
		case s := <-sigs:
			signalGroup(pgid, s)
		case <-lostc:
			lostc, lost = nil, context.Cause(hctx)
			fmt.Fprintf(e.stderr, "dlock run: lost the lock %q while the command ran (%s); sending SIGTERM to its process group\n", h.name, reason(lost))
			signalGroup(pgid, sigTERM)
			killAt = time.Now().Add(grace)
			kill = time.After(grace)
		case <-kill:
			kill = nil
			fmt.Fprintf(e.stderr, "dlock run: the command's process group is still running %v after SIGTERM; sending SIGKILL\n", grace)
			signalGroup(pgid, sigKILL)
		}
	}
	if foreground {
		restoreForeground()
	}
	status := exitStatus(cmd.ProcessState)
	if lost == nil && hctx.Err() != nil && errors.Is(context.Cause(hctx), dlock.ErrLost) {
		// Lost as the command finished: it cannot be told whether its
		// work ended in time, so this counts as a loss.
		lost = context.Cause(hctx)
		fmt.Fprintf(e.stderr, "dlock run: lost the lock %q by the time the command exited with status %d (%s)\n", h.name, status, reason(lost))
		signalGroup(pgid, sigTERM) // whatever it left running in its group
		killAt, kill = time.Now().Add(grace), make(chan time.Time)
	}
	if lost != nil {
		// The command's leader exited; what else runs in its group gets
		// the rest of --grace.
		if kill != nil && !waitGroupGone(pgid, time.Until(killAt)) {
			fmt.Fprintf(e.stderr, "dlock run: processes of the command's group still run; sending SIGKILL\n")
			signalGroup(pgid, sigKILL)
		}
		h.releaseQuietly()
		return fail(exitLost, "the lock %q was lost while the command ran (command status %d)", h.name, status)
	}
	stopWatching()
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := h.release(ctx); err != nil {
		fmt.Fprintf(e.stderr, "dlock run: releasing %q: %v (it ends by its %v lease)\n", h.name, err, h.lease)
	}
	if status != 0 {
		return &exitErr{code: status}
	}
	return nil
}
