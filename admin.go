package dlock

import (
	"context"
	"sort"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/errs"
)

// Operations on primitives by name, whatever their kind: for operators and
// tools such as the dlock command, which know a name but not what it holds.

// ForceUnlock releases the lock called name, whatever kind of lock it is
// (Mutex, ReentrantMutex, RWMutex), and hands it to the first live waiter,
// as the kind's own ForceUnlock does. It reports whether anyone held it. A
// name with no primitive returns an error matching ErrNotFound; a Semaphore
// or a latch, which have no holder to force out, ErrInvalid.
func (c *Client) ForceUnlock(ctx context.Context, name string) (released bool, err error) {
	st, err := c.statusFor(ctx, "forceunlock", name)
	if err != nil {
		return false, err
	}
	switch st.Kind {
	case KindMutex:
		return c.Mutex(name).ForceUnlock(ctx)
	case KindReentrant:
		return c.ReentrantMutex(name).ForceUnlock(ctx)
	case KindRWMutex:
		return c.RWMutex(name).ForceUnlock(ctx)
	}
	return false, errs.Op("forceunlock", name, "a "+st.Kind+" has no holder to force out", ErrInvalid)
}

// listConcurrency is how many Status reads List keeps in flight.
const listConcurrency = 8

// List returns the Status of every primitive under the Client's key prefix
// whose name matches pattern, a glob as Redis's SCAN MATCH reads it ('*'
// for all), sorted by name. It scans every master of a cluster. It is
// meant for operators: a scan walks the whole keyspace, and the result is
// not one snapshot, as primitives may come and go while it runs.
func (c *Client) List(ctx context.Context, pattern string) ([]Status, error) {
	if c.core.Err != nil {
		return nil, c.core.Err
	}
	if c.core.Closed() {
		return nil, ErrClosed
	}
	if ctx == nil {
		return nil, errs.Op("list", pattern, "nil context", ErrInvalid)
	}
	if pattern == "" {
		pattern = "*"
	}
	if why := badGlob(pattern); why != "" {
		return nil, errs.Op("list", pattern, why, ErrInvalid)
	}
	names, err := c.scanNames(ctx, pattern)
	if err != nil {
		return nil, errs.Op("list", pattern, "", err)
	}
	out := make([]Status, len(names))
	fails := make([]error, len(names))
	sem := make(chan struct{}, listConcurrency)
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			h := c.core.NewHandle("list", n, 0, 0, nil)
			out[i], fails[i] = readStatus(ctx, h, "list", "")
		}()
	}
	wg.Wait()
	kept := out[:0]
	for i, st := range out {
		if fails[i] != nil {
			return nil, fails[i]
		}
		if st.Kind != "" { // gone since the scan
			kept = append(kept, st)
		}
	}
	return kept, nil
}

// scanNames returns the names of the main keys under the prefix that match
// pattern, sorted and without duplicates.
func (c *Client) scanNames(ctx context.Context, pattern string) ([]string, error) {
	match := escapeGlob(c.core.Cfg.Prefix) + "{" + pattern + "}"
	var mu sync.Mutex
	seen := map[string]bool{}
	scan := func(ctx context.Context, rdb redis.Cmdable) error {
		it := rdb.Scan(ctx, 0, match, 1000).Iterator()
		for it.Next(ctx) {
			k := it.Val()
			rest, ok := strings.CutPrefix(k, c.core.Cfg.Prefix+"{")
			if !ok || !strings.HasSuffix(rest, "}") || len(rest) < 2 {
				continue
			}
			mu.Lock()
			seen[rest[:len(rest)-1]] = true
			mu.Unlock()
		}
		return it.Err()
	}
	var err error
	switch rdb := c.core.RDB.(type) {
	case *redis.ClusterClient:
		err = rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return scan(ctx, node) })
	case *redis.Ring:
		err = rdb.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error { return scan(ctx, shard) })
	default:
		err = scan(ctx, c.core.RDB)
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// badGlob says what makes pattern no glob that SCAN MATCH reads as meant
// (Redis matches nothing to it, without an error), or "": a '[' that is
// never closed, or a '\' with nothing after it.
func badGlob(pattern string) string {
	for i := 0; i < len(pattern); i++ {
		switch pattern[i] {
		case '\\':
			if i++; i == len(pattern) {
				return "the pattern ends in an escape '\\' with nothing to escape"
			}
		case '[':
			closed := false
			for j := i + 1; j < len(pattern); j++ {
				if pattern[j] == '\\' {
					j++
					continue
				}
				if pattern[j] == ']' && j > i+1 {
					closed, i = true, j
					break
				}
			}
			if !closed {
				return "a '[' in the pattern is never closed with ']'"
			}
		}
	}
	return ""
}

// escapeGlob escapes the characters SCAN MATCH reads as a pattern.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
