package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelSetup is a master, a replica and one sentinel watching them.
type SentinelSetup struct {
	Master, Replica *Server
	SentinelAddr    string
	MasterName      string
}

// Sentinel starts a master, a replica of it, and a sentinel (quorum 1,
// down-after 1s) monitoring them as "mymaster", all on free loopback ports,
// stopped at tb's cleanup. Without redis-server it skips tb, or fails it when
// DLOCK_REQUIRE_REDIS=1.
func Sentinel(tb testing.TB) *SentinelSetup {
	tb.Helper()
	if !Available() {
		if required() {
			tb.Fatalf("redis-server not on PATH and %s=1", RequireEnv)
		}
		tb.Skipf("needs a real redis-server (not on PATH); set %s=1 to fail instead", RequireEnv)
	}
	master, err := StartProcess(tb.TempDir())
	if err != nil {
		tb.Fatalf("start master: %v", err)
	}
	tb.Cleanup(master.Stop)
	replica, err := StartProcess(tb.TempDir(), "--replicaof", "127.0.0.1", strconv.Itoa(master.port))
	if err != nil {
		tb.Fatalf("start replica: %v", err)
	}
	tb.Cleanup(replica.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(tb, ctx, "replica in sync", func() bool {
		info, err := replica.Do(ctx, "info", "replication")
		return err == nil && strings.Contains(fmt.Sprint(info), "master_link_status:up")
	})

	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 5000\n", port, dir, master.port)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start sentinel: %v", err)
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer sc.Close()
	waitFor(tb, ctx, "sentinel sees the replica", func() bool {
		reps, err := sc.Replicas(ctx, "mymaster").Result()
		return err == nil && len(reps) == 1
	})
	return &SentinelSetup{Master: master, Replica: replica, SentinelAddr: addr, MasterName: "mymaster"}
}

// Failover forces a failover and waits until the sentinel names the
// replica as master.
func (s *SentinelSetup) Failover(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddr})
	defer sc.Close()
	if err := sc.Failover(ctx, s.MasterName).Err(); err != nil {
		tb.Fatalf("sentinel failover: %v", err)
	}
	waitFor(tb, ctx, "failover to the replica", func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
		return err == nil && len(addr) == 2 && addr[1] == strconv.Itoa(s.Replica.port)
	})
}

func waitFor(tb testing.TB, ctx context.Context, what string, ok func() bool) {
	tb.Helper()
	for !ok() {
		if ctx.Err() != nil {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
