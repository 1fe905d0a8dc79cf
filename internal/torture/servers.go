package torture

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/faultnet"
	"github.com/dlock-go/dlock/internal/redistest"
)

// servers are the redis-server processes of a run, and the proxies between
// each worker and the servers it reaches through one.
type servers struct {
	dir     string
	main    *redistest.Server   // every primitive but Redlock and Sentinel's
	fence   *redistest.Server   // the fence guard's records: never faulted
	masters []*redistest.Server // Redlock's
	sent    *sentinelGroup      // nil without the Sentinel workload

	// proxies[w] are worker w's: to main first, then to each master.
	proxies [][]*faultnet.Proxy
}

func startServers(cfg Config, dir string) (*servers, error) {
	s := &servers{dir: dir}
	var err error
	start := func(name string, args ...string) *redistest.Server {
		if err != nil {
			return nil
		}
		d := filepath.Join(dir, name)
		if err = os.MkdirAll(d, 0o755); err != nil {
			return nil
		}
		var srv *redistest.Server
		srv, err = redistest.StartProcess(d, args...)
		return srv
	}
	s.main = start("main")
	s.fence = start("fence")
	if cfg.has("redlock") {
		for i := range 3 {
			s.masters = append(s.masters, start(fmt.Sprintf("master%d", i)))
		}
	}
	if err == nil && cfg.has("sentinel") {
		s.sent, err = startSentinel(dir)
	}
	if err != nil {
		s.stop()
		return nil, err
	}
	for range cfg.Workers {
		var ps []*faultnet.Proxy
		for _, target := range append([]*redistest.Server{s.main}, s.masters...) {
			p, err := faultnet.Start(target.Addr)
			if err != nil {
				s.stop()
				return nil, err
			}
			ps = append(ps, p)
		}
		s.proxies = append(s.proxies, ps)
	}
	return s, nil
}

func (s *servers) stop() {
	for _, ps := range s.proxies {
		for _, p := range ps {
			p.Close()
		}
	}
	for _, srv := range append([]*redistest.Server{s.main, s.fence}, s.masters...) {
		if srv != nil {
			srv.Stop()
		}
	}
	if s.sent != nil {
		s.sent.stop()
	}
}

// sentinelGroup is a master, one replica of it and a sentinel that
// watches them.
type sentinelGroup struct {
	nodes [2]*redistest.Server
	addr  string // the sentinel's
	cmd   *exec.Cmd
	done  chan struct{}
}

const masterName = "torture"

func startSentinel(dir string) (*sentinelGroup, error) {
	g := &sentinelGroup{done: make(chan struct{})}
	var err error
	if g.nodes[0], err = redistest.StartProcess(mkdir(dir, "sentinel-a")); err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(g.nodes[0].Addr)
	if g.nodes[1], err = redistest.StartProcess(mkdir(dir, "sentinel-b"), "--replicaof", host, port); err != nil {
		g.nodes[0].Stop()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := waitUntil(ctx, "the replica in sync", func() bool {
		info, err := g.nodes[1].Do(ctx, "info", "replication")
		return err == nil && strings.Contains(fmt.Sprint(info), "master_link_status:up")
	}); err != nil {
		g.stop()
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.stop()
		return nil, err
	}
	sport := l.Addr().(*net.TCPAddr).Port
	l.Close()
	sdir := mkdir(dir, "sentinel")
	conf := filepath.Join(sdir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n", sport, sdir, masterName, host, port, masterName, masterName)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		g.stop()
		return nil, err
	}
	g.cmd = exec.Command("redis-server", conf, "--sentinel")
	if err := g.cmd.Start(); err != nil {
		g.stop()
		return nil, err
	}
	go func() { _ = g.cmd.Wait(); close(g.done) }()
	g.addr = "127.0.0.1:" + strconv.Itoa(sport)
	sc := redis.NewSentinelClient(&redis.Options{Addr: g.addr})
	defer sc.Close()
	if err := waitUntil(ctx, "the sentinel to see the replica", func() bool {
		reps, err := sc.Replicas(ctx, masterName).Result()
		return err == nil && len(reps) == 1
	}); err != nil {
		g.stop()
		return nil, err
	}
	return g, nil
}

func mkdir(dir, name string) string {
	d := filepath.Join(dir, name)
	_ = os.MkdirAll(d, 0o755)
	return d
}

// master returns the node the sentinel names master now.
func (g *sentinelGroup) master(ctx context.Context) (*redistest.Server, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: g.addr})
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(ctx, masterName).Result()
	if err != nil || len(addr) != 2 {
		return nil, fmt.Errorf("sentinel master: %v %v", addr, err)
	}
	for _, n := range g.nodes {
		if n.Addr == net.JoinHostPort(addr[0], addr[1]) {
			return n, nil
		}
	}
	return nil, fmt.Errorf("sentinel names an unknown master %v", addr)
}

// failover asks the sentinel to fail over and waits until the other node
// is master, says so, and has a replica in sync.
func (g *sentinelGroup) failover(ctx context.Context) error {
	old, err := g.master(ctx)
	if err != nil {
		return err
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: g.addr})
	defer sc.Close()
	if err := waitUntil(ctx, "the sentinel to accept a failover", func() bool {
		return sc.Failover(ctx, masterName).Err() == nil
	}); err != nil {
		return err
	}
	return waitUntil(ctx, "the failover to end", func() bool {
		m, err := g.master(ctx)
		if err != nil || m == old {
			return false
		}
		info, err := m.Do(ctx, "info", "replication")
		return err == nil && strings.Contains(fmt.Sprint(info), "role:master") &&
			strings.Contains(fmt.Sprint(info), "connected_slaves:1") && strings.Contains(fmt.Sprint(info), "state=online")
	})
}

func (g *sentinelGroup) stop() {
	if g.cmd != nil && g.cmd.Process != nil {
		_ = g.cmd.Process.Kill()
		<-g.done
	}
	for _, n := range g.nodes {
		if n != nil {
			n.Stop()
		}
	}
}

func waitUntil(ctx context.Context, what string, ok func() bool) error {
	for !ok() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
