// Package pubsub multiplexes many waiters onto one Redis pub/sub connection.
//
// A Hub owns a single go-redis PubSub and one goroutine that reads it.
// Channels are reference counted: the first Acquire subscribes, and the
// channel stays subscribed until the last Release plus a short linger, so a
// hot lock does not pay a SUBSCRIBE round trip on every wait.
//
// The server's confirmation of a subscription is reported to the Handler every
// time it arrives, including after a reconnect, when go-redis re-subscribes
// every channel. A confirmation is the moment from which no message on that
// channel can be missed, so the Handler uses it to make its waiters re-check
// whatever they wait for. That is what makes a killed connection or a lost
// message harmless: nothing waits on a message that was published while the
// connection was down.
package pubsub

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Handler receives what the hub reads. Both methods are called on the hub's
// goroutine and must not block.
type Handler interface {
	// Message delivers one published message.
	Message(channel, payload string)
	// Subscribed reports that the server confirmed a subscription to channel,
	// either the first one or a re-subscription after a reconnect. Messages
	// published before it may have been missed.
	Subscribed(channel string)
}

// Options tune a Hub. Zero values select the defaults.
type Options struct {
	// Linger keeps a channel subscribed this long after its last Release.
	// Default 5s.
	Linger time.Duration
	// PingInterval is how long the connection may be silent before the hub
	// sends a PING. A PING unanswered for another PingInterval makes the hub
	// replace the connection. Default 3s.
	PingInterval time.Duration
	// Logger receives reconnects and errors. Default: discard.
	Logger *slog.Logger
}

// Hub is one pub/sub connection shared by every waiter of a dlock Client.
type Hub struct {
	rdb  redis.UniversalClient
	h    Handler
	opts Options

	mu        sync.Mutex
	ps        *redis.PubSub // nil until the first Acquire
	refs      map[string]int
	confirmed map[string]bool
	// since is when each channel's latest confirmation arrived, and broken
	// when the connection last failed: a channel confirmed before that has
	// not been subscribed throughout since.
	since     map[string]time.Time
	broken    time.Time
	noted     map[string]time.Time // the latest Note per subscribed channel
	idleSince map[string]time.Time // channels with no refs, still subscribed
	closed    bool

	stop chan struct{}
	done chan struct{}
}

// ErrClosed is returned by Acquire after Close.
var ErrClosed = errors.New("pubsub: hub closed")

// New returns a hub on rdb. It opens no connection until the first Acquire.
func New(rdb redis.UniversalClient, h Handler, opts Options) *Hub {
	if opts.Linger <= 0 {
		opts.Linger = 5 * time.Second
	}
	if opts.PingInterval <= 0 {
		opts.PingInterval = 3 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Hub{
		rdb:       rdb,
		h:         h,
		opts:      opts,
		refs:      make(map[string]int),
		confirmed: make(map[string]bool),
		since:     make(map[string]time.Time),
		noted:     make(map[string]time.Time),
		idleSince: make(map[string]time.Time),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
}

// Acquire adds a reference to channel, subscribing when it is not subscribed
// yet. It reports whether the server has already confirmed the subscription;
// when it has not, the Handler's Subscribed call for channel follows once it
// does. Register whatever Subscribed must reach before calling Acquire, or a
// fast confirmation can pass unseen.
func (b *Hub) Acquire(ctx context.Context, channel string) (confirmed bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false, ErrClosed
	}
	if b.refs[channel] > 0 {
		b.refs[channel]++
		return b.confirmed[channel], nil
	}
	if _, ok := b.idleSince[channel]; ok {
		delete(b.idleSince, channel)
		b.refs[channel] = 1
		return b.confirmed[channel], nil
	}
	if err := b.subscribe(ctx, channel); err != nil {
		return false, err
	}
	b.refs[channel] = 1
	return false, nil
}

// subscribe sends SUBSCRIBE, starting the connection and its reader on first
// use. Called with b.mu held.
func (b *Hub) subscribe(ctx context.Context, channel string) error {
	if b.ps == nil {
		b.ps = b.rdb.Subscribe(ctx)
		go b.run(b.ps)
	}
	err := b.ps.Subscribe(ctx, channel)
	if err != nil {
		// go-redis records the channel even when the write failed, and its
		// reconnect ran before the channel was recorded; a second write goes
		// out on the fresh connection.
		err = b.ps.Subscribe(ctx, channel)
	}
	if err != nil {
		_ = b.ps.Unsubscribe(ctx, channel)
	}
	return err
}

// Release drops a reference taken by Acquire. The channel is unsubscribed
// once it has had no references for the linger time.
func (b *Hub) Release(channel string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch n := b.refs[channel]; {
	case n > 1:
		b.refs[channel] = n - 1
	case n == 1:
		delete(b.refs, channel)
		if !b.closed {
			b.idleSince[channel] = time.Now()
		}
	}
}

// Note records that a message the Handler takes as news arrived on channel
// now (see Quiet). The Handler calls it; it is forgotten when the channel
// is unsubscribed.
func (b *Hub) Note(channel string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.since[channel]; ok {
		b.noted[channel] = time.Now()
	}
}

// Quiet reports whether no message published on channel after t can have
// gone unheard, and none of note (Note) arrived since t: the channel's
// subscription was confirmed before t, its connection has not failed since,
// and nothing was noted on it since t. A message published after t but
// still on its way is not counted. Nor is a break the reader has not seen
// as an error: go-redis reconnects inside the read that failed, so while a
// reconnect hangs (into a partition, until its dial or handshake times
// out) the connection still counts as unbroken; a connection that died
// silently counts as unbroken until the hub replaces it (up to two
// PingIntervals); and go-redis may reconnect inside a PING or after a read
// without reporting an error. Each ends with the next confirmation, which
// is later than any t before it.
func (b *Hub) Quiet(channel string, t time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	// confirmed[channel] need not be asked: only replace clears it
	// without since, and replace sets broken.
	at, ok := b.since[channel]
	return ok && at.Before(t) && b.broken.Before(at) && !b.noted[channel].After(t)
}

// Channels reports how many channels are subscribed, lingering ones included.
func (b *Hub) Channels() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.refs) + len(b.idleSince)
}

// Close closes the connection and waits for the reader goroutine to exit.
func (b *Hub) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	ps := b.ps
	b.mu.Unlock()
	close(b.stop)
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-b.done
	// The reader may have replaced the connection before it saw the stop;
	// replace refuses once closed is set, so b.ps is final now.
	b.mu.Lock()
	last := b.ps
	b.mu.Unlock()
	if last != ps {
		_ = last.Close()
	}
	return err
}

// run reads the connection until Close. Reading with a timeout gives the loop
// a tick for health pings and for unsubscribing idle channels.
func (b *Hub) run(ps *redis.PubSub) {
	defer close(b.done)
	ctx := context.Background()
	tick := b.opts.PingInterval / 3
	if tick > time.Second {
		tick = time.Second
	}
	lastHeard := time.Now()
	var pingSent time.Time // zero when no PING is outstanding
	backoff := time.Duration(0)
	lastSweep := time.Now()
	for {
		select {
		case <-b.stop:
			return
		default:
		}
		msg, err := ps.ReceiveTimeout(ctx, tick)
		now := time.Now()
		switch m := msg.(type) {
		case *redis.Message:
			b.h.Message(m.Channel, m.Payload)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				b.onSubscribed(m.Channel)
			}
		}
		switch {
		case err == nil:
			lastHeard, pingSent, backoff = now, time.Time{}, 0
		case isTimeout(err):
			// Silence. Probe it; replace a connection that stays silent.
			if pingSent.IsZero() && now.Sub(lastHeard) >= b.opts.PingInterval {
				pingSent = now
				if perr := ps.Ping(ctx); perr != nil {
					b.mu.Lock()
					b.broken = time.Now() // go-redis may have reconnected inside it
					b.mu.Unlock()
					b.opts.Logger.Warn("dlock: pubsub ping failed", "error", perr)
				}
			} else if !pingSent.IsZero() && now.Sub(pingSent) >= b.opts.PingInterval {
				b.opts.Logger.Warn("dlock: pubsub connection silent; replacing it")
				ps = b.replace(ps)
				lastHeard, pingSent = now, time.Time{}
			}
		default:
			select {
			case <-b.stop:
				return
			default:
			}
			// go-redis drops the broken connection; the next receive dials a
			// new one and re-subscribes every channel, and each confirmation
			// reaches the Handler.
			b.mu.Lock()
			b.broken = now
			b.mu.Unlock()
			b.opts.Logger.Warn("dlock: pubsub connection lost; reconnecting", "error", err)
			if b.sleep(backoff) {
				return
			}
			backoff = min(max(2*backoff, 50*time.Millisecond), time.Second)
		}
		if now.Sub(lastSweep) >= tick {
			lastSweep = now
			b.sweep(ctx, ps, now)
		}
	}
}

func (b *Hub) onSubscribed(channel string) {
	b.mu.Lock()
	_, idle := b.idleSince[channel]
	wanted := b.refs[channel] > 0 || idle
	if wanted {
		b.confirmed[channel] = true
		b.since[channel] = time.Now()
	}
	b.mu.Unlock()
	if wanted {
		b.h.Subscribed(channel)
	}
}

// replace swaps a dead-looking connection for a new one subscribed to every
// wanted channel. Only the reader goroutine calls it. After Close it keeps
// the old one, which Close has closed, so the loop ends.
func (b *Hub) replace(old *redis.PubSub) *redis.PubSub {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return old
	}
	channels := make([]string, 0, len(b.refs)+len(b.idleSince))
	for ch := range b.refs {
		channels = append(channels, ch)
	}
	for ch := range b.idleSince {
		channels = append(channels, ch)
	}
	clear(b.confirmed)
	b.broken = time.Now()
	ps := b.rdb.Subscribe(context.Background(), channels...)
	b.ps = ps
	_ = old.Close()
	return ps
}

// sweep unsubscribes channels that have lingered unused long enough.
func (b *Hub) sweep(ctx context.Context, ps *redis.PubSub, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var gone []string
	for ch, since := range b.idleSince {
		if now.Sub(since) >= b.opts.Linger {
			gone = append(gone, ch)
			delete(b.idleSince, ch)
			delete(b.confirmed, ch)
			delete(b.since, ch)
			delete(b.noted, ch)
		}
	}
	if len(gone) > 0 {
		if err := ps.Unsubscribe(ctx, gone...); err != nil {
			b.opts.Logger.Warn("dlock: pubsub unsubscribe failed", "error", err)
		}
	}
}

func (b *Hub) sleep(d time.Duration) (stopped bool) {
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return false
	case <-b.stop:
		return true
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
