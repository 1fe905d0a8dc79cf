// Dlock runs a command under a distributed lock on Redis, and shows and
// clears locks from a shell. It is built on package
// github.com/dlock-go/dlock.
//
// Usage:
//
//	dlock run    [--redis URL] [--ttl D] [--timeout D] [--no-wait] [--permits N | --redisson] [--grace D] NAME -- COMMAND [ARG...]
//	dlock status [--redis URL] [--json] [--redisson] NAME
//	dlock list   [--redis URL] [--json] [PATTERN]
//	dlock unlock [--redis URL] --force NAME
//
// Run takes the lock called NAME (or, with --permits N, one of N permits of
// the semaphore called NAME), keeps it with the watchdog while COMMAND runs,
// and releases it when COMMAND exits. COMMAND gets DLOCK_NAME and
// DLOCK_TOKEN, the hold's fencing token, in its environment, and runs in a
// process group of its own. SIGINT, SIGTERM and SIGHUP sent to dlock are
// passed on to that group (one dlock was started with ignored, as under
// nohup, stays ignored, for COMMAND too). If the lock is lost while COMMAND
// runs, the group gets SIGTERM, and SIGKILL after --grace.
//
// Status shows what a name holds: its kind, holders (the holding process's
// client name and what its lease has left), fencing token and queue. List
// shows every primitive under the key prefix whose name matches PATTERN, a
// glob. Unlock --force releases whoever holds a lock and hands it to the
// first waiter.
//
// Exit status of run: the command's own, or 128+N when a signal N killed it;
// 75 when the lock was busy (--no-wait, or --timeout passed) and the command
// did not run; 69 when Redis could not be reached; 70 when the lock was lost
// while the command ran; 126 or 127 when the command could not be started;
// 2 for a usage error; 1 for other errors. Status and unlock exit 1 for a
// name that holds nothing, list for a PATTERN that matches nothing (with
// no PATTERN, an empty list exits 0). Whenever the status is dlock's own
// rather than the command's, dlock says why on standard error.
//
// With --redisson, run takes the Redisson (Java) RLock called NAME, the one
// redisson.getLock(NAME) takes, so that a shell job and Java services
// exclude each other (DLOCK_TOKEN is then 0: an RLock has no token), and
// status shows the Redisson object called NAME. See docs/redisson.md.
//
// The --redis URL defaults to $REDIS_URL, then redis://127.0.0.1:6379/0; run
// "dlock help" for its forms (one server, TLS, Sentinel, Cluster). Keys use
// the library's default prefix "dlock:", or $DLOCK_PREFIX when set.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// Exit statuses dlock chooses itself (see the package comment).
const (
	exitError       = 1
	exitUsage       = 2
	exitUnavailable = 69  // EX_UNAVAILABLE: Redis could not be reached
	exitLost        = 70  // EX_SOFTWARE: the lock was lost while the command ran
	exitBusy        = 75  // EX_TEMPFAIL: the lock was busy; try again later
	exitNoExec      = 126 // the command could not be executed
	exitNotFound    = 127 // the command was not found
)

// pingTimeout bounds the first round trip, which tells whether Redis can be
// reached at all.
const pingTimeout = 5 * time.Second

const usageText = `dlock runs a command under a distributed lock on Redis, and shows and clears locks.

Usage:
  dlock run    [--redis URL] [--ttl D] [--timeout D] [--no-wait] [--permits N | --redisson] [--grace D] NAME -- COMMAND [ARG...]
  dlock status [--redis URL] [--json] [--redisson] NAME
  dlock list   [--redis URL] [--json] [PATTERN]
  dlock unlock [--redis URL] --force NAME

Run "dlock help COMMAND" (or "dlock COMMAND --help") for a command's flags.

`

// exitErr is an error that ends dlock with a given status. Its message,
// when there is one, goes to standard error.
type exitErr struct {
	code int
	msg  string
}

func (e *exitErr) Error() string { return e.msg }

// fail returns an exitErr with a formatted message.
func fail(code int, format string, args ...any) error {
	return &exitErr{code: code, msg: fmt.Sprintf(format, args...)}
}

// command is one subcommand.
type command struct {
	name    string
	summary string // the usage line's arguments
	about   string // what it does, for its --help
	// define adds the command's own flags to a flag set that has --redis.
	define func(fs *flag.FlagSet)
	// run runs the command with its arguments, which it parses itself.
	run func(c *command, e *env, args []string) error
}

var commands = []*command{runCommand, statusCommand, listCommand, unlockCommand}

// env is what a command runs with: its output streams and environment.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

func main() {
	e := &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	os.Exit(e.main(os.Args[1:]))
}

// main runs the command line args and returns the exit status.
func (e *env) main(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usageText+urlForms+"\n")
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && name == "help" {
			if c := lookup(args[1]); c != nil {
				c.usage(e.stdout)
				return 0
			}
			fmt.Fprintf(e.stderr, "dlock help: unknown command %q\n", args[1])
			return exitUsage
		}
		fmt.Fprint(e.stdout, usageText+urlForms+"\n")
		return 0
	}
	c := lookup(name)
	if c == nil {
		fmt.Fprintf(e.stderr, "dlock: unknown command %q\nRun \"dlock help\" for usage.\n", name)
		return exitUsage
	}
	err := c.run(c, e, args[1:])
	if err == nil {
		return 0
	}
	var xe *exitErr
	if !errors.As(err, &xe) {
		xe = &exitErr{code: exitError, msg: err.Error()}
	}
	if xe.msg != "" {
		fmt.Fprintf(e.stderr, "dlock %s: %s\n", c.name, xe.msg)
	}
	return xe.code
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// flags returns the command's flag set, with --redis, which every command
// has; the set prints nothing itself (see parse).
func (c *command) flags() (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("dlock "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	redisURL := fs.String("redis", "", "Redis `URL` (default $REDIS_URL, then "+defaultRedisURL+")")
	return fs, redisURL
}

// usage prints the command's help.
func (c *command) usage(w io.Writer) {
	fs, _ := c.flags()
	c.define(fs)
	fmt.Fprintf(w, "Usage: dlock %s %s\n\n%s\n\nFlags:\n", c.name, c.summary, c.about)
	fs.VisitAll(func(f *flag.Flag) {
		arg, help := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  --%s", f.Name)
		if arg != "" {
			fmt.Fprintf(w, " %s", arg)
		}
		fmt.Fprintf(w, "\n    \t%s", help)
		switch f.DefValue {
		case "", "0", "0s", "false":
		default:
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
	fmt.Fprintf(w, "\n%s\n", urlForms)
}

// parse parses args with fs, allowing flags before and after the
// positional arguments, and returns those. --help prints the command's
// usage on standard output and ends dlock with status 0.
func (c *command) parse(e *env, fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.usage(e.stdout)
				return nil, &exitErr{code: 0}
			}
			return nil, c.usageErr("%v", err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// usageErr returns a usage error of c.
func (c *command) usageErr(format string, args ...any) error {
	return fail(exitUsage, "%s\nusage: dlock %s %s\nRun \"dlock %s --help\" for more.",
		fmt.Sprintf(format, args...), c.name, c.summary, c.name)
}

// connect returns a dlock Client on the Redis that --redis (or its default)
// names, after a first round trip shows that it answers. A Redis that does
// not is exitUnavailable.
func connect(e *env, redisURL string, opts ...dlock.Option) (*dlock.Client, func(), error) {
	rdb, err := connectRedis(e, redisURL)
	if err != nil {
		return nil, nil, err
	}
	if p := e.getenv("DLOCK_PREFIX"); p != "" {
		opts = append([]dlock.Option{dlock.WithKeyPrefix(p)}, opts...)
	}
	opts = append(opts, dlock.WithLogger(newLogger(e.stderr)))
	c := dlock.New(rdb, opts...)
	return c, func() { _ = c.Close(); _ = rdb.Close() }, nil
}

// connectRedis returns a go-redis client on the Redis that --redis (or its
// default) names, after a first round trip shows that it answers. A Redis
// that does not is exitUnavailable.
func connectRedis(e *env, redisURL string) (redis.UniversalClient, error) {
	if redisURL == "" {
		redisURL = e.getenv("REDIS_URL")
	}
	if redisURL == "" {
		redisURL = defaultRedisURL
	}
	t, err := parseRedisURL(redisURL)
	if err != nil {
		return nil, fail(exitUsage, "%v", err)
	}
	rdb := t.client()
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fail(exitUnavailable, "redis at %s: %v", redact(redisURL), err)
	}
	return rdb, nil
}

// redact hides the password in a Redis URL for messages.
func redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return raw
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return raw
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}

// redisFailure maps an error from the library to dlock's exit status: a
// failure to reach Redis (dlock.ErrUnavailable, or no answer within the
// command's own timeout) is exitUnavailable, anything else (a reply from
// Redis, bad input, a name of another kind, a grant too late to use)
// exitError.
func redisFailure(err error) error {
	if errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, dlock.ErrNotObtained) {
		return fail(exitUnavailable, "%s", reason(err))
	}
	return fail(exitError, "%s", reason(err))
}
