package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// defaultRedisURL is where dlock connects when neither --redis nor
// $REDIS_URL says otherwise.
const defaultRedisURL = "redis://127.0.0.1:6379/0"

// urlForms documents the --redis forms; usage texts and docs/cli.md show it.
const urlForms = `Redis URL forms (--redis, default $REDIS_URL, then ` + defaultRedisURL + `):
  redis://[[user]:pass@]host[:port][/db][?opt=val...]     one server
  rediss://...                                           one server over TLS
  unix://[[user]:pass@]/path/to/redis.sock[?db=N]        one server on a Unix socket
  redis+sentinel://[[user]:pass@]host[:port][,host[:port]...]/master[/db][?opt=val...]
                                                         Sentinel: sentinels (port 26379 by default) and the master's name
  redis+cluster://[[user]:pass@]host[:port][,host[:port]...][?opt=val...]
                                                         Redis Cluster: any of its nodes
  rediss+sentinel://..., rediss+cluster://...            the same over TLS
The user and password are the Redis servers'; for sentinels that ask for a password of
their own add sentinel_username= and sentinel_password=. Options are go-redis's, in
snake case (dial_timeout=2s, pool_size=4, skip_verify=true, ...).`

// redisTarget is a parsed --redis URL: exactly one of its fields is set.
type redisTarget struct {
	single   *redis.Options
	failover *redis.FailoverOptions
	cluster  *redis.ClusterOptions
}

// client returns a go-redis client for t.
func (t redisTarget) client() redis.UniversalClient {
	switch {
	case t.failover != nil:
		return redis.NewFailoverClient(t.failover)
	case t.cluster != nil:
		return redis.NewClusterClient(t.cluster)
	}
	return redis.NewClient(t.single)
}

// parseRedisURL reads one of the forms urlForms lists.
func parseRedisURL(raw string) (redisTarget, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return redisTarget{}, fmt.Errorf("redis URL %q: no scheme (want redis://host:port, see --help)", raw)
	}
	base, mode, _ := strings.Cut(scheme, "+")
	if base != "redis" && base != "rediss" && !(base == "unix" && mode == "") {
		return redisTarget{}, fmt.Errorf("redis URL %q: unknown scheme %q", raw, scheme)
	}
	var t redisTarget
	var err error
	switch mode {
	case "":
		t.single, err = redis.ParseURL(raw)
	case "sentinel":
		t.failover, err = parseSentinel(base, rest)
	case "cluster":
		t.cluster, err = parseCluster(base, rest)
	default:
		return redisTarget{}, fmt.Errorf("redis URL %q: unknown scheme %q", raw, scheme)
	}
	if err != nil {
		return redisTarget{}, fmt.Errorf("redis URL %q: %w", raw, err)
	}
	return t, nil
}

// multiHost is a URL of the form [userinfo@]host[,host...][/path][?query],
// which net/url cannot read because of the host list.
type multiHost struct {
	user  *url.Userinfo
	hosts []string // host:port each, with the default port added
	path  string
	query url.Values
}

func splitMultiHost(rest, defaultPort string) (multiHost, error) {
	var m multiHost
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	hostList := authority
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		hostList = authority[at+1:]
		// Let net/url decode the user info, on a stand-in host.
		u, err := url.Parse("x://" + authority[:at+1] + "h")
		if err != nil {
			return m, err
		}
		m.user = u.User
	}
	for h := range strings.SplitSeq(hostList, ",") {
		if h == "" {
			return m, errors.New("empty host in the host list")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), defaultPort)
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			return m, fmt.Errorf("host %q: %w", h, err)
		}
		m.hosts = append(m.hosts, h)
	}
	u, err := url.Parse("x://h" + tail)
	if err != nil {
		return m, err
	}
	m.path = u.Path
	m.query = u.Query()
	return m, nil
}

// goRedisURL builds the single-host URL that go-redis's parsers read, with
// the other hosts as addr= parameters.
func (m multiHost) goRedisURL(scheme string, user *url.Userinfo, path string, q url.Values) string {
	for _, h := range m.hosts[1:] {
		q.Add("addr", h)
	}
	u := url.URL{Scheme: scheme, User: user, Host: m.hosts[0], Path: path, RawQuery: q.Encode()}
	return u.String()
}

// takeSkipVerify removes skip_verify from q (go-redis's cluster parser does
// not know it) and returns its value.
func takeSkipVerify(q url.Values) (bool, error) {
	v := q.Get("skip_verify")
	q.Del("skip_verify")
	switch v {
	case "", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	}
	return false, fmt.Errorf("skip_verify=%q is not a boolean", v)
}

// parseSentinel reads host[,host...]/master[/db] after the scheme. The
// user info holds the master's credentials, as in the single-server form.
func parseSentinel(base, rest string) (*redis.FailoverOptions, error) {
	m, err := splitMultiHost(rest, "26379")
	if err != nil {
		return nil, err
	}
	parts := strings.FieldsFunc(m.path, func(r rune) bool { return r == '/' })
	if len(parts) == 0 || len(parts) > 2 {
		return nil, errors.New("want /master or /master/db after the sentinels")
	}
	q := m.query
	for _, k := range []string{"master_name", "addr", "username", "password", "db"} {
		if q.Has(k) {
			return nil, fmt.Errorf("option %s: give it in the URL's own place", k)
		}
	}
	q.Set("master_name", parts[0])
	if m.user != nil {
		q.Set("username", m.user.Username())
		if p, ok := m.user.Password(); ok {
			q.Set("password", p)
		}
	}
	var sentinelUser *url.Userinfo
	if su, sp := q.Get("sentinel_username"), q.Get("sentinel_password"); su != "" || sp != "" {
		sentinelUser = url.UserPassword(su, sp)
	}
	q.Del("sentinel_username")
	q.Del("sentinel_password")
	skip, err := takeSkipVerify(q)
	if err != nil {
		return nil, err
	}
	path := ""
	if len(parts) == 2 {
		path = "/" + parts[1]
	}
	o, err := redis.ParseFailoverURL(m.goRedisURL(base, sentinelUser, path, q))
	if err != nil {
		return nil, err
	}
	multiTLS(o.TLSConfig, skip)
	return o, nil
}

// parseCluster reads host[,host...] after the scheme.
func parseCluster(base, rest string) (*redis.ClusterOptions, error) {
	m, err := splitMultiHost(rest, "6379")
	if err != nil {
		return nil, err
	}
	if strings.Trim(m.path, "/") != "" {
		return nil, errors.New("a cluster has no database number: no path after the hosts")
	}
	if m.query.Has("addr") {
		return nil, errors.New("option addr: list the nodes as host,host")
	}
	skip, err := takeSkipVerify(m.query)
	if err != nil {
		return nil, err
	}
	o, err := redis.ParseClusterURL(m.goRedisURL(base, m.user, "", m.query))
	if err != nil {
		return nil, err
	}
	multiTLS(o.TLSConfig, skip)
	return o, nil
}

// multiTLS adjusts the TLS settings of a client that dials many hosts:
// go-redis names the first host as the server name of every connection,
// while each should check the certificate of the host it dials, which
// crypto/tls does when the name is empty.
func multiTLS(cfg *tls.Config, skip bool) {
	if cfg == nil {
		return
	}
	cfg.ServerName = ""
	cfg.MinVersion = tls.VersionTLS12
	cfg.InsecureSkipVerify = skip
}
