package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock"
)

// inspectTimeout bounds the Redis calls of status, list and unlock.
const inspectTimeout = 30 * time.Second

var statusCommand = &command{
	name:    "status",
	summary: "[--redis URL] [--json] [--redisson] NAME",
	about: `Show what NAME holds: its kind (mutex, reentrant, rwmutex, semaphore, latch, election),
its holders (the name of the holding process's client and what its lease has left), the
fencing token of the current or last hold, and how many wait. A name that holds nothing
exits 1, and so does a lock nobody holds or waits for: a released lock keeps nothing.`,
	define: func(fs *flag.FlagSet) {
		defineJSON(fs)
		fs.Bool("redisson", false, "show the Redisson (Java) object called NAME: a lock's or read-write lock's holder fields, or a semaphore's or latch's count")
	},
	run: statusMain,
}

var listCommand = &command{
	name:    "list",
	summary: "[--redis URL] [--json] [PATTERN]",
	about: `List the locks, semaphores and latches under the key prefix whose names match PATTERN,
a glob as Redis's SCAN MATCH reads it (default *), sorted by name. It scans the whole
keyspace (every master of a cluster). When a PATTERN is given and nothing matches it, list
says so on standard error (--json still prints []) and exits 1; without one, an empty list
exits 0.`,
	define: defineJSON,
	run:    listMain,
}

var unlockCommand = &command{
	name:    "unlock",
	summary: "[--redis URL] --force NAME",
	about: `Release the lock called NAME (a mutex, reentrant or rwmutex), whoever holds it, and hand it
to the first waiter. The holder learns it at its next renewal; a dlock run holding it then
stops its command and exits 70. A name that holds nothing (a released lock keeps nothing),
or holds a semaphore or latch, exits 1; a lock that waiters wait for while nobody holds it
(its holder crashed, and the first waiter's turn has not come) exits 0.`,
	define: func(fs *flag.FlagSet) { fs.Bool("force", false, "release the lock whoever holds it (required)") },
	run:    unlockMain,
}

func defineJSON(fs *flag.FlagSet) {
	fs.Bool("json", false, "print JSON: an object per name with snake_case fields, durations in ms")
}

// statusJSON is the JSON shape of one name's status, which scripts rely
// on: fields are only ever added.
type statusJSON struct {
	Name    string       `json:"name"`
	Kind    string       `json:"kind"`
	Token   uint64       `json:"token"`           // of the current or last hold; 0 when none is known
	Waiting int          `json:"waiting"`         // callers queued for it
	Holders []holderJSON `json:"holders"`         // the first lease to end first; [] when free
	Total   *int         `json:"total,omitempty"` // semaphore: its total permits, -1 when never set
	Free    *int         `json:"free,omitempty"`  // semaphore: permits free now
	Count   *int64       `json:"count,omitempty"` // latch: its count
}

type holderJSON struct {
	ID      string `json:"id"`       // the hold's ID in Redis
	Client  string `json:"client"`   // the holding Client's name, by default host:pid
	LeaseMS int64  `json:"lease_ms"` // what its lease has left, in milliseconds
	Count   int    `json:"count"`    // hold count (reentrant, rwmutex), permits (semaphore), 1 (mutex)
	Read    bool   `json:"read"`     // an rwmutex read hold
}

func toJSON(st dlock.Status) statusJSON {
	j := statusJSON{Name: st.Name, Kind: st.Kind, Token: st.Token, Waiting: st.Waiting, Holders: []holderJSON{}}
	for _, h := range st.Holders {
		j.Holders = append(j.Holders, holderJSON{ID: h.ID, Client: h.Client, LeaseMS: h.Lease.Milliseconds(), Count: h.Count, Read: h.Read})
	}
	switch st.Kind {
	case dlock.KindSemaphore:
		j.Total, j.Free = &st.Total, &st.Free
	case dlock.KindLatch:
		j.Count = &st.Count
	}
	return j
}

// inspectArgs parses the arguments of status, list or unlock and connects.
func inspectArgs(c *command, e *env, args []string) (pos []string, fs *flag.FlagSet, client *dlock.Client, done func(), err error) {
	fs, redisURL := c.flags()
	c.define(fs)
	if pos, err = c.parse(e, fs, args); err != nil {
		return nil, nil, nil, nil, err
	}
	if c.name == "list" && len(pos) > 1 || c.name != "list" && len(pos) != 1 {
		return nil, nil, nil, nil, c.usageErr("wrong number of arguments: %q", pos)
	}
	if c.name == "unlock" && !flagTrue(fs, "force") {
		return nil, nil, nil, nil, c.usageErr("unlock needs --force: it releases the lock whoever holds it")
	}
	client, done, err = connect(e, *redisURL)
	return pos, fs, client, done, err
}

func flagTrue(fs *flag.FlagSet, name string) bool {
	return fs.Lookup(name).Value.String() == "true"
}

func statusMain(c *command, e *env, args []string) error {
	{
		fs, redisURL := c.flags()
		c.define(fs)
		pos, err := c.parse(e, fs, args)
		if err != nil {
			return err
		}
		if flagTrue(fs, "redisson") {
			if len(pos) != 1 {
				return c.usageErr("wrong number of arguments: %q", pos)
			}
			return redissonStatus(e, *redisURL, pos[0], flagTrue(fs, "json"))
		}
	}
	pos, fs, client, done, err := inspectArgs(c, e, args)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
	defer cancel()
	st, err := client.Status(ctx, pos[0])
	if errors.Is(err, dlock.ErrNotFound) {
		return fail(exitError, "no lock, semaphore or latch is called %q", pos[0])
	}
	if err != nil {
		return redisFailure(err)
	}
	if flagTrue(fs, "json") {
		return writeJSON(e.stdout, toJSON(st))
	}
	writeStatus(e.stdout, st)
	return nil
}

func listMain(c *command, e *env, args []string) error {
	pos, fs, client, done, err := inspectArgs(c, e, args)
	if err != nil {
		return err
	}
	defer done()
	pattern := "*"
	if len(pos) == 1 {
		pattern = pos[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
	defer cancel()
	all, err := client.List(ctx, pattern)
	if err != nil {
		return redisFailure(err)
	}
	// Like grep, a PATTERN that matches nothing (a name that does not
	// exist) is a failure; an empty keyspace listed in full is not.
	var none error
	if len(all) == 0 && len(pos) == 1 {
		none = fail(exitError, "nothing matches %q", pattern)
	}
	if flagTrue(fs, "json") {
		out := make([]statusJSON, 0, len(all))
		for _, st := range all {
			out = append(out, toJSON(st))
		}
		if err := writeJSON(e.stdout, out); err != nil {
			return err
		}
		return none
	}
	if len(all) == 0 {
		if none == nil {
			fmt.Fprintln(e.stderr, "dlock list: nothing to list")
		}
		return none
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tHOLDER\tLEASE LEFT\tWAITING\tTOKEN")
	for _, st := range all {
		holder, lease := "-", "-"
		if len(st.Holders) > 0 {
			holder, lease = holderName(st.Holders[0]), roundLease(st.Holders[0].Lease).String()
			if n := len(st.Holders) - 1; n > 0 {
				holder += fmt.Sprintf(" +%d", n)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\n", st.Name, st.Kind, holder, lease, st.Waiting, st.Token)
	}
	return tw.Flush()
}

func unlockMain(c *command, e *env, args []string) error {
	pos, _, client, done, err := inspectArgs(c, e, args)
	if err != nil {
		return err
	}
	defer done()
	name := pos[0]
	ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
	defer cancel()
	st, err := client.Status(ctx, name)
	if errors.Is(err, dlock.ErrNotFound) {
		return fail(exitError, "no lock is called %q", name)
	}
	if err != nil {
		return redisFailure(err)
	}
	released, err := client.ForceUnlock(ctx, name)
	switch {
	case errors.Is(err, dlock.ErrNotFound):
		return fail(exitError, "no lock is called %q", name)
	case errors.Is(err, dlock.ErrInvalid):
		return fail(exitError, "%q is a %s, which has no holder to force out", name, st.Kind)
	case err != nil:
		return redisFailure(err)
	case !released:
		fmt.Fprintf(e.stdout, "%q was not held; nothing to do\n", name)
		return nil
	}
	msg := fmt.Sprintf("released %q", name)
	if len(st.Holders) > 0 {
		msg += ", held by " + holders(st.Holders)
	}
	if st.Waiting > 0 {
		msg += fmt.Sprintf("; the first of %d waiting gets it", st.Waiting)
	}
	fmt.Fprintln(e.stdout, msg)
	return nil
}

// holders names the Clients of hs.
func holders(hs []dlock.Holder) string {
	names := make([]string, len(hs))
	for i, h := range hs {
		names[i] = holderName(h)
	}
	return strings.Join(names, ", ")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeStatus prints st for people, one field a line.
func writeStatus(w io.Writer, st dlock.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\n", st.Name)
	fmt.Fprintf(tw, "kind:\t%s\n", st.Kind)
	switch st.Kind {
	case dlock.KindSemaphore:
		total := strconv.Itoa(st.Total)
		if st.Total < 0 {
			total = "never set"
		}
		fmt.Fprintf(tw, "permits:\t%d free of %s\n", st.Free, total)
	case dlock.KindLatch:
		fmt.Fprintf(tw, "count:\t%d\n", st.Count)
	}
	if len(st.Holders) == 0 && st.Kind != dlock.KindLatch {
		fmt.Fprintf(tw, "holder:\tnone\n")
	}
	for _, h := range st.Holders {
		var extra string
		switch {
		case h.Read:
			extra = fmt.Sprintf(", read, count %d", h.Count)
		case st.Kind == dlock.KindSemaphore:
			extra = fmt.Sprintf(", %d permits", h.Count)
		case st.Kind != dlock.KindMutex:
			extra = fmt.Sprintf(", count %d", h.Count)
		}
		fmt.Fprintf(tw, "holder:\t%s (lease %v left%s)\n", holderName(h), roundLease(h.Lease), extra)
	}
	fmt.Fprintf(tw, "token:\t%d\n", st.Token)
	fmt.Fprintf(tw, "waiting:\t%d\n", st.Waiting)
	_ = tw.Flush()
}
