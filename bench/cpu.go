package main

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// cpuMeter measures the CPU a stretch of the bench costs, on both sides:
// this process (getrusage: the bench and the library under test, which
// run alone during a library's turn) and redis-server (INFO cpu: its own
// used_cpu_user + used_cpu_sys, network and event loop included). On this
// machine they share the cores, so their sum per operation is what
// throughput pays.
type cpuMeter struct{ adm *redis.Client }

type cpuMark struct{ client, server time.Duration }

func (m cpuMeter) mark() cpuMark {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return cpuMark{client: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), server: m.serverCPU()}
}

func (m cpuMeter) serverCPU() time.Duration {
	if m.adm == nil {
		return 0
	}
	info, err := m.adm.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// since returns the CPU each side spent since from, per op operations.
func (m cpuMeter) since(from cpuMark, ops int) (client, server time.Duration) {
	now := m.mark()
	if ops <= 0 {
		return 0, 0
	}
	return (now.client - from.client) / time.Duration(ops), (now.server - from.server) / time.Duration(ops)
}
