package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replicated starts a master and one replica of it, with no sentinel, on
// free loopback ports, stopped at tb's cleanup, and waits until the replica
// is in sync. Without redis-server it skips tb, or fails it when
// DLOCK_REQUIRE_REDIS=1.
func Replicated(tb testing.TB) (master, replica *Server) {
	tb.Helper()
	master = Real(tb)
	replica, err := StartProcess(tb.TempDir())
	if err != nil {
		tb.Fatalf("start replica: %v", err)
	}
	tb.Cleanup(replica.Stop)
	replica.ReplicaOf(tb, master)
	return master, replica
}

// ReplicaOf makes s a replica of master and waits until its link to master
// is up, which is after the initial sync. It also sets a full sync to start
// at once (repl-diskless-sync-delay 0 on master), not after the default
// 5 s wait for more replicas.
func (s *Server) ReplicaOf(tb testing.TB, master *Server) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := master.Do(ctx, "config", "set", "repl-diskless-sync-delay", "0"); err != nil {
		tb.Fatalf("config set on %s: %v", master.Addr, err)
	}
	if _, err := s.Do(ctx, "replicaof", host, port); err != nil {
		tb.Fatalf("replicaof on %s: %v", s.Addr, err)
	}
	s.AwaitSync(tb)
}

// AwaitSync waits until s, a replica, has its link to its master up.
func (s *Server) AwaitSync(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(tb, ctx, "replica "+s.Addr+" in sync", func() bool {
		info, err := s.Do(ctx, "info", "replication")
		return err == nil && strings.Contains(fmt.Sprint(info), "master_link_status:up")
	})
}

// Process returns the redis-server process, for signals (SIGSTOP,
// SIGCONT), or nil for miniredis or a stopped server.
func (s *Server) Process() *os.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	return s.cmd.Process
}

// Roles returns the server the sentinel names master now, and the other.
func (s *SentinelSetup) Roles(tb testing.TB) (master, replica *Server) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddr})
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil || len(addr) != 2 {
		tb.Fatalf("sentinel master address: %v %v", addr, err)
	}
	if net.JoinHostPort(addr[0], addr[1]) == s.Master.Addr {
		return s.Master, s.Replica
	}
	return s.Replica, s.Master
}

// StartFailover asks the sentinel to fail over now and returns without
// waiting for the failover to end. A sentinel that answers that it cannot yet
// (a failover still ending, a replica it has not yet judged good) is asked
// again, for up to 30 s.
func (s *SentinelSetup) StartFailover(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddr})
	defer sc.Close()
	for {
		err := sc.Failover(ctx, s.MasterName).Err()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			tb.Fatalf("sentinel failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AwaitMaster waits until the sentinel names srv master and srv says it
// is one.
func (s *SentinelSetup) AwaitMaster(tb testing.TB, srv *Server) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddr})
	defer sc.Close()
	waitFor(tb, ctx, "failover to "+srv.Addr, func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
		if err != nil || len(addr) != 2 || net.JoinHostPort(addr[0], addr[1]) != srv.Addr {
			return false
		}
		info, err := srv.Do(ctx, "info", "replication")
		return err == nil && strings.Contains(fmt.Sprint(info), "role:master")
	})
}
