package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/faultnet"
)

// ProxiedSentinel is a SentinelSetup whose replica replicates through a
// fault-injecting proxy (internal/faultnet): each server has a proxy in
// front of it, and whichever is the replica reaches the master only through
// the master's proxy. Clients and the sentinel reach both servers directly.
// A test can so slow down or cut the replication link alone, then kill the
// master, and see what the replica had when the sentinel promotes it.
type ProxiedSentinel struct {
	*SentinelSetup
	proxies map[*Server]*faultnet.Proxy
	log     string // the sentinel's log file
}

// SentinelDownAfter is ProxiedSentinel's down-after-milliseconds: how long
// a master must be unreachable before the sentinel fails it over. (At
// 500 ms, and once at 1 s during a full CI run, a sentinel on two busy
// cores judged a healthy master down and failed over on its own.)
const SentinelDownAfter = 2 * time.Second

// SentinelProxied starts two redis-server processes, a proxy in front of
// each, and a sentinel (quorum 1, down-after SentinelDownAfter) monitoring
// them as "mymaster"; Master is the first master, and Replica replicates
// from it through Link(Master). All stop at tb's cleanup. Without
// redis-server it skips tb, or fails it when DLOCK_REQUIRE_REDIS=1.
//
// The sentinel's failover-timeout is long (60 s) because a sentinel
// "fixes" a replica whose master address is not the master's own (here the
// proxy's) once failover-timeout has passed since it last saw the
// replica's configuration change, or since it found the replica (a
// failover finds them anew). Tests fail over or Rejoin well within it;
// AwaitReady checks that the replica still replicates through the proxy.
func SentinelProxied(tb testing.TB) *ProxiedSentinel {
	tb.Helper()
	if !Available() {
		if required() {
			tb.Fatalf("redis-server not on PATH and %s=1", RequireEnv)
		}
		tb.Skipf("needs a real redis-server (not on PATH); set %s=1 to fail instead", RequireEnv)
	}
	s := &ProxiedSentinel{SentinelSetup: &SentinelSetup{MasterName: "mymaster"}, proxies: map[*Server]*faultnet.Proxy{}}
	for _, p := range []**Server{&s.Master, &s.Replica} {
		// Disk-based full syncs: after a diskless one, Redis 7.0 marks the
		// replica online but streams it nothing until its next ACK, up to a
		// second later, and a write made meanwhile reaches it late.
		srv, err := StartProcess(tb.TempDir(), "--repl-diskless-sync", "no")
		if err != nil {
			tb.Fatalf("start redis-server: %v", err)
		}
		tb.Cleanup(srv.Stop)
		proxy, err := faultnet.Start(srv.Addr)
		if err != nil {
			tb.Fatalf("start proxy: %v", err)
		}
		tb.Cleanup(proxy.Close)
		*p, s.proxies[srv] = srv, proxy
	}
	s.replicate(tb, s.Replica, s.Master)

	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	s.log = filepath.Join(dir, "sentinel.log")
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor mymaster 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds mymaster %d\nsentinel failover-timeout mymaster 60000\n",
		port, dir, s.log, s.Master.port, SentinelDownAfter.Milliseconds())
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start sentinel: %v", err)
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	s.SentinelAddr = "127.0.0.1:" + strconv.Itoa(port)
	s.AwaitReady(tb)
	return s
}

// Link returns the proxy in front of master: the one its replica's
// replication link goes through.
func (s *ProxiedSentinel) Link(master *Server) *faultnet.Proxy { return s.proxies[master] }

// replicate makes replica a replica of master through master's proxy, and
// waits until it is in sync.
func (s *ProxiedSentinel) replicate(tb testing.TB, replica, master *Server) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	host, port, err := net.SplitHostPort(s.Link(master).Addr)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := replica.Do(ctx, "replicaof", host, port); err != nil {
		tb.Fatalf("replicaof on %s: %v", replica.Addr, err)
	}
	replica.AwaitSync(tb)
}

// Rejoin restarts old, a master that died, with an empty dataset on its own
// port, makes it a replica of master through master's proxy, and waits
// until it is in sync and the sentinel could promote it (AwaitReady).
func (s *ProxiedSentinel) Rejoin(tb testing.TB, old, master *Server) {
	tb.Helper()
	old.Restart(tb)
	s.replicate(tb, old, master)
	s.AwaitReady(tb)
}

// AwaitReady waits until the sentinel names a master, the other server
// replicates from it through its proxy with its link up, and the sentinel
// sees that replica as one it could promote (reachable, not down, link
// to its master up). It returns the master and the replica.
func (s *ProxiedSentinel) AwaitReady(tb testing.TB) (master, replica *Server) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddr})
	defer sc.Close()
	var last string
	for {
		master, replica, last = s.ready(ctx, sc)
		if last == "" {
			return master, replica
		}
		if ctx.Err() != nil {
			tb.Fatalf("sentinel setup not ready: %s\nsentinel log:\n%s", last, s.LogTail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ready returns the master and the replica, or why they are not ready.
func (s *ProxiedSentinel) ready(ctx context.Context, sc *redis.SentinelClient) (master, replica *Server, why string) {
	addr, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil || len(addr) != 2 {
		return nil, nil, fmt.Sprintf("sentinel master address: %v %v", addr, err)
	}
	switch net.JoinHostPort(addr[0], addr[1]) {
	case s.Master.Addr:
		master, replica = s.Master, s.Replica
	case s.Replica.Addr:
		master, replica = s.Replica, s.Master
	default:
		return nil, nil, "sentinel names an unknown master " + addr[1]
	}
	info, err := replica.Do(ctx, "info", "replication")
	if err != nil {
		return nil, nil, fmt.Sprintf("info on %s: %v", replica.Addr, err)
	}
	proxyHost, proxyPort, _ := net.SplitHostPort(s.Link(master).Addr)
	text := fmt.Sprint(info)
	if !strings.Contains(text, "master_port:"+proxyPort+"\r\n") {
		// A failover the test did not ask for (a master judged down on a
		// busy machine) leaves the sentinel pointing the old master at the
		// new one's own address: send it back through the proxy.
		if _, err := replica.Do(ctx, "replicaof", proxyHost, proxyPort); err != nil {
			return nil, nil, fmt.Sprintf("replicaof on %s: %v", replica.Addr, err)
		}
		return nil, nil, fmt.Sprintf("%s replicated around proxy port %s; sent back through it: %q", replica.Addr, proxyPort, text)
	}
	if !strings.Contains(text, "master_link_status:up") {
		return nil, nil, fmt.Sprintf("%s not in sync through proxy port %s: %q", replica.Addr, proxyPort, text)
	}
	reps, err := sc.Replicas(ctx, s.MasterName).Result()
	if err != nil {
		return nil, nil, fmt.Sprintf("sentinel replicas: %v", err)
	}
	for _, r := range reps {
		if net.JoinHostPort(r["ip"], r["port"]) != replica.Addr {
			continue
		}
		flags := r["flags"]
		if flags != "slave" || r["master-link-status"] != "ok" {
			return nil, nil, fmt.Sprintf("sentinel sees replica %s as %q, link %q", replica.Addr, flags, r["master-link-status"])
		}
		if why := streaming(ctx, master); why != "" {
			return nil, nil, why
		}
		return master, replica, ""
	}
	return nil, nil, fmt.Sprintf("sentinel does not list replica %s: %v", replica.Addr, reps)
}

// streaming reports why master's replica does not get its writes at once,
// or "" when it does: a write (a PUBLISH, which replicates without touching
// the data) and a WAIT on one connection must see the replica acknowledge
// within a second.
func streaming(ctx context.Context, master *Server) string {
	rdb := redis.NewClient(&redis.Options{Addr: master.Addr, PoolSize: 1})
	defer rdb.Close()
	var wait *redis.Cmd
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Publish(ctx, "redistest:sync", "probe")
		wait = p.Do(ctx, "wait", 1, 1000)
		return nil
	})
	if acked, _ := wait.Int(); err != nil || acked < 1 {
		return fmt.Sprintf("the replica of %s acknowledged no write within 1s (%v)", master.Addr, err)
	}
	return ""
}

// LogTail returns the last n lines of the sentinel's log, for failure
// messages.
func (s *ProxiedSentinel) LogTail(n int) string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
