package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseRedisURLSingle(t *testing.T) {
	for _, tc := range []struct {
		url, network, addr, user, pass string
		db                             int
		tls                            bool
	}{
		{url: defaultRedisURL, network: "tcp", addr: "127.0.0.1:6379"},
		{url: "redis://h", network: "tcp", addr: "h:6379"},
		{url: "redis://:secret@h:7000/3", network: "tcp", addr: "h:7000", pass: "secret", db: 3},
		{url: "redis://u:p%40ss@[::1]:7000/2", network: "tcp", addr: "[::1]:7000", user: "u", pass: "p@ss", db: 2},
		{url: "rediss://h.example:6380/1", network: "tcp", addr: "h.example:6380", db: 1, tls: true},
		{url: "unix:///run/redis.sock?db=5", network: "unix", addr: "/run/redis.sock", db: 5},
	} {
		tg, err := parseRedisURL(tc.url)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		o := tg.single
		if o == nil || tg.failover != nil || tg.cluster != nil {
			t.Errorf("%s: not read as one server: %+v", tc.url, tg)
			continue
		}
		if o.Network != tc.network || o.Addr != tc.addr || o.Username != tc.user || o.Password != tc.pass || o.DB != tc.db {
			t.Errorf("%s: network %q addr %q user %q password %q db %d", tc.url, o.Network, o.Addr, o.Username, o.Password, o.DB)
		}
		if (o.TLSConfig != nil) != tc.tls {
			t.Errorf("%s: TLS %v, want %v", tc.url, o.TLSConfig != nil, tc.tls)
		}
		if tc.tls && o.TLSConfig.ServerName != "h.example" {
			t.Errorf("%s: TLS server name %q", tc.url, o.TLSConfig.ServerName)
		}
	}
}

func TestParseRedisURLSentinel(t *testing.T) {
	tg, err := parseRedisURL("redis+sentinel://u:p@s1,s2:26380,[::1]/mymaster/4?sentinel_username=su&sentinel_password=sp&dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	o := tg.failover
	if o == nil || tg.single != nil || tg.cluster != nil {
		t.Fatalf("not read as Sentinel: %+v", tg)
	}
	if want := []string{"s1:26379", "s2:26380", "[::1]:26379"}; !slices.Equal(o.SentinelAddrs, want) {
		t.Errorf("sentinels %q, want %q", o.SentinelAddrs, want)
	}
	if o.MasterName != "mymaster" || o.DB != 4 || o.DialTimeout != 2*time.Second {
		t.Errorf("master %q db %d dial timeout %v", o.MasterName, o.DB, o.DialTimeout)
	}
	if o.Username != "u" || o.Password != "p" || o.SentinelUsername != "su" || o.SentinelPassword != "sp" {
		t.Errorf("master's credentials %q:%q, sentinels' %q:%q", o.Username, o.Password, o.SentinelUsername, o.SentinelPassword)
	}
	if o.TLSConfig != nil {
		t.Error("TLS without rediss+")
	}

	tg, err = parseRedisURL("rediss+sentinel://s1/m?skip_verify=true")
	if err != nil {
		t.Fatal(err)
	}
	o = tg.failover
	if o.MasterName != "m" || o.DB != 0 || o.TLSConfig == nil || !o.TLSConfig.InsecureSkipVerify || o.TLSConfig.ServerName != "" {
		t.Errorf("rediss+sentinel: master %q db %d TLS %+v", o.MasterName, o.DB, o.TLSConfig)
	}
}

func TestParseRedisURLCluster(t *testing.T) {
	tg, err := parseRedisURL("redis+cluster://:pw@n1:7000,n2,[::1]:7002?pool_size=4")
	if err != nil {
		t.Fatal(err)
	}
	o := tg.cluster
	if o == nil || tg.single != nil || tg.failover != nil {
		t.Fatalf("not read as a cluster: %+v", tg)
	}
	if want := []string{"n1:7000", "n2:6379", "[::1]:7002"}; !slices.Equal(o.Addrs, want) {
		t.Errorf("nodes %q, want %q", o.Addrs, want)
	}
	if o.Password != "pw" || o.PoolSize != 4 || o.TLSConfig != nil {
		t.Errorf("password %q pool size %d TLS %v", o.Password, o.PoolSize, o.TLSConfig != nil)
	}

	tg, err = parseRedisURL("rediss+cluster://a,b")
	if err != nil {
		t.Fatal(err)
	}
	o = tg.cluster
	if !slices.Equal(o.Addrs, []string{"a:6379", "b:6379"}) || o.TLSConfig == nil || o.TLSConfig.ServerName != "" || o.TLSConfig.InsecureSkipVerify {
		t.Errorf("rediss+cluster: nodes %q TLS %+v", o.Addrs, o.TLSConfig)
	}
}

func TestParseRedisURLErrors(t *testing.T) {
	for _, raw := range []string{
		"",
		"localhost:6379",
		"http://h",
		"redis+foo://h",
		"unix+sentinel:///x",
		"redis://h/notanumber",
		"redis+sentinel://s1",
		"redis+sentinel://s1/",
		"redis+sentinel://s1/m/1/2",
		"redis+sentinel://s1/m/x",
		"redis+sentinel://s1/m?master_name=other",
		"redis+sentinel://s1/m?skip_verify=maybe",
		"redis+cluster://a/0",
		"redis+cluster://a,,b",
		"redis+cluster://a?addr=b",
		"redis+cluster://a?no_such_option=1",
		"redis+cluster://h:notaport",
	} {
		if tg, err := parseRedisURL(raw); err == nil {
			t.Errorf("%q: no error, got %+v", raw, tg)
		} else if !strings.Contains(err.Error(), "redis URL") {
			t.Errorf("%q: the error %q does not say it is about the URL", raw, err)
		}
	}
}

func TestRedact(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://h:6379/0":                  "redis://h:6379/0",
		"redis://user@h/0":                  "redis://user@h/0",
		"redis://:secret@h/0":               "redis://:xxxxx@h/0",
		"rediss://u:secret@h:1/0?x=@":       "rediss://u:xxxxx@h:1/0?x=@",
		"redis+sentinel://u:s@a,b/m":        "redis+sentinel://u:xxxxx@a,b/m",
		"redis+cluster://u:p@ss@a,b?pool=1": "redis+cluster://u:xxxxx@a,b?pool=1",
		"not a url":                         "not a url",
	} {
		if got := redact(raw); got != want {
			t.Errorf("redact(%q) = %q, want %q", raw, got, want)
		}
	}
}

// Usage errors exit 2 before anything connects; help exits 0.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
		out  string // in stdout or stderr
	}{
		{nil, 2, "Usage:"},
		{[]string{"help"}, 0, "redis+sentinel://"},
		{[]string{"--help"}, 0, "dlock run"},
		{[]string{"help", "run"}, 0, "--permits N"},
		{[]string{"help", "nope"}, 2, "unknown command"},
		{[]string{"nope"}, 2, "unknown command"},
		{[]string{"run", "--help"}, 0, "--grace D"},
		{[]string{"status", "-h"}, 0, "--json"},
		{[]string{"run", "name", "cmd"}, 2, "missing --"},
		{[]string{"run", "--", "cmd"}, 2, "want one NAME"},
		{[]string{"run", "a", "b", "--", "cmd"}, 2, "want one NAME"},
		{[]string{"run", "name", "--"}, 2, "no command"},
		{[]string{"run", "--ttl", "0s", "name", "--", "cmd"}, 2, "--ttl"},
		{[]string{"run", "--ttl", "1ms", "name", "--", "cmd"}, 2, "--ttl 1ms is outside [10ms, 8760h0m0s]"},
		{[]string{"run", "--ttl", "9000h", "name", "--", "cmd"}, 2, "--ttl"},
		{[]string{"run", strings.Repeat("n", 1025), "--", "cmd"}, 2, "1025 bytes"},
		{[]string{"run", "--grace", "-1s", "name", "--", "cmd"}, 2, "negative"},
		{[]string{"run", "--no-wait", "--timeout", "1s", "name", "--", "cmd"}, 2, "exclude"},
		{[]string{"run", "--bogus", "name", "--", "cmd"}, 2, "bogus"},
		{[]string{"run", "--redis", "localhost:6379", "name", "--", "cmd"}, 2, "no scheme"},
		{[]string{"status"}, 2, "wrong number"},
		{[]string{"status", "a", "b"}, 2, "wrong number"},
		{[]string{"list", "a", "b"}, 2, "wrong number"},
		{[]string{"unlock", "name"}, 2, "--force"},
	} {
		var stdout, stderr bytes.Buffer
		e := &env{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
		code := e.main(tc.args)
		if code != tc.want || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("dlock %q: exit %d, want %d with %q; stdout:\n%s\nstderr:\n%s", tc.args, code, tc.want, tc.out, &stdout, &stderr)
		}
		if tc.want == 0 && stderr.Len() > 0 {
			t.Errorf("dlock %q: help on stderr: %s", tc.args, &stderr)
		}
	}
}
