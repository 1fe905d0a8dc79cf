package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster starts a Redis Cluster of masters redis-server processes (no
// replicas) on free loopback ports, with the 16384 slots split evenly, and
// returns their addresses once every node reports cluster_state:ok. The
// processes stop at tb's cleanup. Without redis-server it skips tb, or fails
// it when DLOCK_REQUIRE_REDIS=1.
func Cluster(tb testing.TB, masters int) []string {
	tb.Helper()
	if !Available() {
		if required() {
			tb.Fatalf("redis-server not on PATH and %s=1", RequireEnv)
		}
		tb.Skipf("needs a real redis-server (not on PATH); set %s=1 to fail instead", RequireEnv)
	}
	nodes := make([]*Server, masters)
	addrs := make([]string, masters)
	for i := range nodes {
		s, err := startClusterNode(tb.TempDir())
		if err != nil {
			tb.Fatalf("start cluster node: %v", err)
		}
		tb.Cleanup(s.Stop)
		nodes[i], addrs[i] = s, s.Addr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	per := 16384 / masters
	for i, s := range nodes {
		lo, hi := i*per, (i+1)*per-1
		if i == masters-1 {
			hi = 16383
		}
		if _, err := s.Do(ctx, "cluster", "addslotsrange", lo, hi); err != nil {
			tb.Fatalf("addslotsrange on %s: %v", s.Addr, err)
		}
		if i > 0 {
			if _, err := s.Do(ctx, "cluster", "meet", "127.0.0.1", nodes[0].port); err != nil {
				tb.Fatalf("cluster meet: %v", err)
			}
		}
	}
	for _, s := range nodes {
		for {
			info, err := s.Do(ctx, "cluster", "info")
			if err == nil && strings.Contains(fmt.Sprint(info), "cluster_state:ok") &&
				strings.Contains(fmt.Sprint(info), "cluster_known_nodes:"+strconv.Itoa(masters)) {
				break
			}
			if ctx.Err() != nil {
				tb.Fatalf("cluster did not become ready: %v %v", info, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Every node must agree on the slot map before clients route by it.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer rdb.Close()
	for {
		err := rdb.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
		shards, serr := rdb.ClusterShards(ctx).Result()
		if err == nil && serr == nil && len(shards) == masters {
			return addrs
		}
		if ctx.Err() != nil {
			tb.Fatalf("cluster slots not settled: %v %v", err, serr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startClusterNode starts a cluster-enabled node whose cluster bus port (its
// port + 10000) is also free.
func startClusterNode(dir string) (*Server, error) {
	for range 20 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		if port+10000 > 65535 || !portFree(port+10000) {
			continue
		}
		s := &Server{dir: dir, port: port, Addr: "127.0.0.1:" + strconv.Itoa(port),
			args: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + strconv.Itoa(port) + ".conf"}}
		if err := s.start(); err == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no free port pair for a cluster node")
}
