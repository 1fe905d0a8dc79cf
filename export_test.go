package dlock

import (
	"context"

	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/redlock"
	"github.com/dlock-go/dlock/internal/wire"
)

// WarmConns is how many connections a Client warms for renewals after its
// first round trip, each with a one-PING pipeline (see renewals.go).
const WarmConns = lease.WarmConns

// Cluster renewals (see renew_cluster.go).

// SetPerSlotRenewals forces a cluster Client's renewals per hash slot (on),
// as on servers without script flags, or lets them go per node again.
func SetPerSlotRenewals(c *Client, on bool) { c.core.Renewals().SetPerSlot(on) }

// PerSlotRenewals reports whether a cluster Client renews per hash slot.
func PerSlotRenewals(c *Client) bool { return c.core.Renewals().PerSlot() }

// SetRenewNodeScript makes a cluster Client renew per node with the script
// src instead of internal/scripts/renew_node.lua. Call it before the first hold.
func SetRenewNodeScript(c *Client, src string) { c.core.Renewals().SetNodeScript(src) }

// RejectsScriptFlags is the test of a per-node renewal's error that turns
// renewals per node off.
func RejectsScriptFlags(err error) bool { return lease.RejectsScriptFlags(err) }

// KeySlot is the Redis Cluster hash slot of key.
func KeySlot(key string) int { return int(wire.Slot(key)) }

// MultiLockMembers returns a MultiLock's member Mutexes, in name order.
func MultiLockMembers(ml *MultiLock) []*Mutex { return ml.members }

// Redlock gates (see internal/redlock/try.go).

// RedlockGate returns the index of the gate master of a Redlock Mutex, in
// the order its Redlock was given the masters, and that master's name.
func RedlockGate(m *Mutex) (int, string) { return m.lk.(*redlock.Mutex).Gate() }

// RedlockContended reports whether a Redlock Mutex's tries go to its gate
// first (see internal/redlock).
func RedlockContended(m *Mutex) bool { return m.lk.(*redlock.Mutex).Contended() }

// RedlockContend marks a Redlock Mutex as having met other callers just now,
// as a refusal by a second holder would.
func RedlockContend(m *Mutex) { m.lk.(*redlock.Mutex).Contend() }

// RedlockChannel is the release channel of a Redlock Mutex.
func RedlockChannel(m *Mutex) string { return m.lk.(*redlock.Mutex).Channel() }

// LocalWaiters is how many callers wait in c's registry of local waiters.
func LocalWaiters(c *Client) int { return c.core.Waits.Len() }

// RedlockWaiters is how many callers wait in r's registry of local waiters.
func RedlockWaiters(r *Redlock) int { return r.r.Core.Waits.Len() }

// ChannelConfirmed reports whether c's pub/sub connection has a confirmed
// subscription to m's channel (it subscribes when it has none, for later
// calls to find confirmed).
func ChannelConfirmed(c *Client, m *Mutex) bool { return channelConfirmed(c, m.h.Channel) }

// RWChannelConfirmed is ChannelConfirmed for an RWMutex.
func RWChannelConfirmed(c *Client, rw *RWMutex) bool { return channelConfirmed(c, rw.h.Channel) }

// ReentrantChannelConfirmed is ChannelConfirmed for a ReentrantMutex.
func ReentrantChannelConfirmed(c *Client, r *ReentrantMutex) bool {
	return channelConfirmed(c, r.h.Channel)
}

func channelConfirmed(c *Client, channel string) bool {
	hub := c.core.Hub()
	confirmed, err := hub.Acquire(context.Background(), channel)
	if err == nil {
		hub.Release(channel)
	}
	return err == nil && confirmed
}

// CohortRecorded reports whether c's wait registry records a cohort for m's
// lock (Registry.SetCohort), as a Lock on a fresh handle finds it.
func CohortRecorded(c *Client, m *Mutex) bool {
	return c.core.Waits.CohortAt(m.h.Channel, m.h.Key) != nil
}

// PermitGrant is the ID of the Redis grant p holds on: its own, or, for a
// Permit handed on within its Client (WithPermitCohort), the cohort's.
func PermitGrant(p *Permit) string { return p.id }
