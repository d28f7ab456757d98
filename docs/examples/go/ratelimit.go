// Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Go (redigo; redisc
// for Redis Cluster).
//
// Asks `XCLOAK.ALLOW key window limit DETAILS` and turns the five fields into
// the status and headers of an HTTP response. Where the server does not have
// the module (a managed service), it answers "ERR unknown command": the
// limiter then runs the portable Lua script instead (redis.Script: EVALSHA,
// then EVAL when the server answers NOSCRIPT). Both keep the same sorted set.
//
// The article's naive pipeline, in Go: two round trips, and every caller that
// counts before another one adds is admitted too (24 admitted for a limit of
// 10 under 100 concurrent clients, see docs/design.md):
//
//	conn.Send("MULTI")
//	conn.Send("ZREMRANGEBYSCORE", key, "-inf", now-window)
//	conn.Send("ZCARD", key)
//	replies, _ := redis.Values(conn.Do("EXEC"))
//	if count, _ := redis.Int(replies[1], nil); count < limit {
//		conn.Do("ZADD", key, now, now) // admitted, raced
//	}
//
// Its replacement, one atomic call (same keys, same scores):
//
//	details, err := redis.Int64s(conn.Do("XCLOAK.ALLOW", key, window, limit, "DETAILS"))
//	// details: allowed, limit, remaining, retry_after_ms, reset_after_ms
//
// In cluster mode, redisc binds a connection to the node of the slot of the
// first argument, which is the key of every XCLOAK command; the script's
// first argument is its SHA, so the limiter binds to the key explicitly
// (redisc.BindConn) before either. --peek asks XCLOAK.PEEK on a read-only
// connection (redisc.ReadOnlyConn): a replica answers it.
//
// Build (Debian 12: apt-get install golang-go golang-github-gomodule-redigo-dev
// golang-github-mna-redisc-dev; GOPATH mode, no module proxy needed):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o ratelimit docs/examples/go/ratelimit.go
//	./ratelimit redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...
//	200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//	...
//	429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
//
// With --keys K, request i uses the key KEY:<i mod K>. Each --tier
// WINDOW_MS:LIMIT adds `TIER window limit` to the call: the reply then has a
// sixth field, one [window, limit, remaining, retry_after_ms, reset_after_ms]
// per tier, printed as the IETF RateLimit-Policy and RateLimit fields with one
// policy per tier, named by its window (docs/commands.md, "Several tiers"):
//
//	200 RateLimit-Policy: "60000ms";q=3;w=60, "3600000ms";q=5;w=3600 | RateLimit: "60000ms";r=2;t=60, "3600000ms";r=4;t=3600 | via command
package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/mna/redisc"
)

// Details is the reply of XCLOAK.ALLOW ... DETAILS (times in milliseconds):
// the binding tier's fields, then every tier's.
type Details struct {
	Allowed      bool
	Limit        int64
	Remaining    int64
	RetryAfterMs int64 // 0 if allowed, -1 if the request can never fit (cost > limit)
	ResetAfterMs int64
	Tiers        []TierDetails // one per tier, in the order given; nil without TIER
}

// TierDetails is one tier of a reply to a call with TIER.
type TierDetails struct {
	WindowMs, Limit, Remaining, RetryAfterMs, ResetAfterMs int64
}

// Tier is `TIER window limit`: one more window on the same key, in the same call.
type Tier struct{ WindowMs, Limit int64 }

// args is key, window and limit, then `TIER window limit` for each tier.
func args(key string, windowMs, limit int64, tiers []Tier) []interface{} {
	a := []interface{}{key, windowMs, limit}
	for _, t := range tiers {
		a = append(a, "TIER", t.WindowMs, t.Limit)
	}
	return a
}

// Limiter asks the command, or the script once a server said it has no module.
type Limiter struct {
	script *redis.Script
	via    string
}

func NewLimiter(lua string) *Limiter {
	return &Limiter{script: redis.NewScript(1, lua), via: "command"}
}

// Check makes one request against key: at most limit per windowMs, and at
// most each tier's limit per its window. conn is either a plain redigo
// connection or a redisc one not yet bound to a node.
func (l *Limiter) Check(conn redis.Conn, key string, windowMs, limit int64, tiers []Tier) (Details, string, error) {
	if cluster, ok := conn.(*redisc.Conn); ok {
		// Bind to the key's node (the script's first argument is its SHA),
		// then follow MOVED/ASK during a reshard.
		if err := cluster.Bind(key); err != nil {
			return Details{}, "", err
		}
		retry, err := redisc.RetryConn(cluster, 3, 100*time.Millisecond)
		if err != nil {
			return Details{}, "", err
		}
		conn = retry
	}
	if l.via == "command" {
		reply, err := conn.Do("XCLOAK.ALLOW", append(args(key, windowMs, limit, tiers), "DETAILS")...)
		if !isUnknownCommand(err) {
			d, err := details(reply, err)
			return d, "command", err
		}
		l.via = "script" // no module on this server: use the script from now on
	}
	d, err := details(l.script.Do(conn, append(args(key, windowMs, limit, tiers), "DETAILS")...))
	return d, "script", err
}

// Peek asks XCLOAK.PEEK (writes nothing). On a redisc connection not yet
// bound, it asks a replica of the key's primary.
func (l *Limiter) Peek(conn redis.Conn, key string, windowMs, limit int64, tiers []Tier) (Details, error) {
	if cluster, ok := conn.(*redisc.Conn); ok {
		if err := cluster.ReadOnly(); err != nil {
			return Details{}, err
		}
		if err := cluster.Bind(key); err != nil {
			return Details{}, err
		}
	}
	return details(conn.Do("XCLOAK.PEEK", args(key, windowMs, limit, tiers)...))
}

// details reads five integers, or with TIER six fields: the sixth has one
// [window, limit, remaining, retry_after_ms, reset_after_ms] per tier.
func details(reply interface{}, err error) (Details, error) {
	values, err := redis.Values(reply, err)
	if err != nil {
		return Details{}, err
	}
	if len(values) != 5 && len(values) != 6 {
		return Details{}, fmt.Errorf("expected 5 or 6 fields, got %v", values)
	}
	fields, err := redis.Int64s(values[:5], nil)
	if err != nil {
		return Details{}, err
	}
	d := Details{fields[0] == 1, fields[1], fields[2], fields[3], fields[4], nil}
	if len(values) == 6 {
		tiers, err := redis.Values(values[5], nil)
		if err != nil {
			return Details{}, err
		}
		for _, tier := range tiers {
			t, err := redis.Int64s(tier, nil)
			if err != nil || len(t) != 5 {
				return Details{}, fmt.Errorf("bad tier %v: %v", tier, err)
			}
			d.Tiers = append(d.Tiers, TierDetails{t[0], t[1], t[2], t[3], t[4]})
		}
	}
	return d, nil
}

func isUnknownCommand(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(strings.ToLower(string(reply)), "err unknown command")
}

// HTTPDecision is the status and headers of the HTTP response (delta-seconds,
// rounded up so a client never comes back too early).
func HTTPDecision(d Details) (int, [][2]string) {
	if len(d.Tiers) > 0 {
		return policyDecision(d)
	}
	headers := [][2]string{
		{"RateLimit-Limit", strconv.FormatInt(d.Limit, 10)},
		{"RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10)},
		{"RateLimit-Reset", seconds(d.ResetAfterMs)},
	}
	if d.Allowed {
		return 200, headers
	}
	if d.RetryAfterMs >= 0 { // -1: larger than the limit, will never fit
		headers = append(headers, [2]string{"Retry-After", seconds(d.RetryAfterMs)})
	}
	return 429, headers
}

// seconds rounds up: a client is never sent back too early.
func seconds(ms int64) string { return strconv.FormatInt((ms+999)/1000, 10) }

// policyDecision: with tiers, draft-ietf-httpapi-ratelimit-headers-09. One
// policy per tier in RateLimit-Policy (quota, window) and in RateLimit
// (remaining, seconds until it is back), named by its window; Retry-After is
// the binding tier's.
func policyDecision(d Details) (int, [][2]string) {
	var policies, items []string
	for _, t := range d.Tiers {
		name := fmt.Sprintf(`"%dms"`, t.WindowMs)
		policies = append(policies, fmt.Sprintf("%s;q=%d;w=%s", name, t.Limit, seconds(t.WindowMs)))
		items = append(items, fmt.Sprintf("%s;r=%d;t=%s", name, t.Remaining, seconds(t.ResetAfterMs)))
	}
	headers := [][2]string{
		{"RateLimit-Policy", strings.Join(policies, ", ")},
		{"RateLimit", strings.Join(items, ", ")},
	}
	if d.Allowed {
		return 200, headers
	}
	if d.RetryAfterMs > 0 { // -1: larger than a limit, will never fit
		headers = append(headers, [2]string{"Retry-After", seconds(d.RetryAfterMs)})
	}
	return 429, headers
}

// fallbackLua reads src/lua/xcloak_allow.lua ($XCLOAK_LUA, or found from
// this source file's place in the repository).
func fallbackLua() (string, error) {
	path := os.Getenv("XCLOAK_LUA")
	if path == "" {
		_, source, _, _ := runtime.Caller(0)
		path = filepath.Join(filepath.Dir(source), "../../../src/lua/xcloak_allow.lua")
	}
	lua, err := os.ReadFile(path)
	return string(lua), err
}

// options is the command line: URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...
type options struct {
	url, key               string
	windowMs, limit, calls int64
	cluster, peek          bool
	keys                   int64
	tiers                  []Tier
}

func parseArgs(args []string) (options, error) {
	var o options
	var positional []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--cluster":
			o.cluster = true
		case "--peek":
			o.peek = true
		case "--keys":
			if i+1 == len(args) {
				return o, errors.New("--keys needs a number")
			}
			i++
			k, err := strconv.ParseInt(args[i], 10, 64)
			if err != nil || k < 1 {
				return o, fmt.Errorf("--keys must be a positive integer, not %q", args[i])
			}
			o.keys = k
		case "--tier":
			var t Tier
			if i+1 == len(args) {
				return o, errors.New("--tier needs WINDOW_MS:LIMIT")
			}
			i++
			window, limit, ok := strings.Cut(args[i], ":")
			var errW, errL error
			t.WindowMs, errW = strconv.ParseInt(window, 10, 64)
			t.Limit, errL = strconv.ParseInt(limit, 10, 64)
			if !ok || errW != nil || errL != nil {
				return o, fmt.Errorf("--tier needs WINDOW_MS:LIMIT, not %q", args[i])
			}
			o.tiers = append(o.tiers, t)
		default:
			if strings.HasPrefix(args[i], "--") {
				return o, fmt.Errorf("unknown option %s", args[i])
			}
			positional = append(positional, args[i])
		}
	}
	if len(positional) != 5 {
		return o, errors.New("usage: ratelimit REDIS_URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...")
	}
	o.url, o.key = positional[0], positional[1]
	for i, field := range []*int64{&o.windowMs, &o.limit, &o.calls} {
		n, err := strconv.ParseInt(positional[2+i], 10, 64)
		if err != nil || n < 0 {
			return o, fmt.Errorf("%s must be a non-negative integer, not %q", []string{"WINDOW_MS", "LIMIT", "CALLS"}[i], positional[2+i])
		}
		*field = n
	}
	return o, nil
}

// connector returns a function giving one connection per request: from a
// redisc.Cluster (a pool per node) or one plain connection.
func connector(o options) (get func() redis.Conn, closeAll func(), err error) {
	if !o.cluster {
		conn, err := redis.DialURL(o.url)
		if err != nil {
			return nil, nil, err
		}
		return func() redis.Conn { return nopClose{conn} }, func() { conn.Close() }, nil
	}
	u, err := url.Parse(o.url)
	if err != nil {
		return nil, nil, err
	}
	var dial []redis.DialOption
	if u.User != nil { // the URL's user and password apply to every node
		dial = append(dial, redis.DialUsername(u.User.Username()))
		if password, ok := u.User.Password(); ok {
			dial = append(dial, redis.DialPassword(password))
		}
	}
	cluster := &redisc.Cluster{
		StartupNodes: []string{u.Host},
		DialOptions:  append(dial, redis.DialConnectTimeout(5*time.Second)),
		CreatePool: func(address string, options ...redis.DialOption) (*redis.Pool, error) {
			return &redis.Pool{
				MaxIdle: 4,
				Dial:    func() (redis.Conn, error) { return redis.Dial("tcp", address, options...) },
			}, nil
		},
	}
	if err := cluster.Refresh(); err != nil {
		return nil, nil, fmt.Errorf("cluster refresh (CLUSTER SLOTS): %w", err)
	}
	return cluster.Get, func() { cluster.Close() }, nil
}

// nopClose keeps the one standalone connection open across requests.
type nopClose struct{ redis.Conn }

func (nopClose) Close() error { return nil }

func run(args []string) error {
	o, err := parseArgs(args)
	if err != nil {
		return err
	}
	lua, err := fallbackLua()
	if err != nil {
		return err
	}
	get, closeAll, err := connector(o)
	if err != nil {
		return err
	}
	defer closeAll()
	limiter := NewLimiter(lua)
	for i := int64(0); i < o.calls; i++ {
		key := o.key
		if o.keys > 0 {
			key = fmt.Sprintf("%s:%d", o.key, i%o.keys)
		}
		conn := get()
		var d Details
		via := "command"
		if o.peek {
			d, err = limiter.Peek(conn, key, o.windowMs, o.limit, o.tiers)
		} else {
			d, via, err = limiter.Check(conn, key, o.windowMs, o.limit, o.tiers)
		}
		conn.Close()
		if err != nil {
			return fmt.Errorf("request %d (%s): %w", i, key, err)
		}
		status, headers := HTTPDecision(d)
		fields := make([]string, len(headers))
		for n, h := range headers {
			fields[n] = h[0] + ": " + h[1]
		}
		fmt.Printf("%d %s | via %s\n", status, strings.Join(fields, " | "), via)
	}
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		os.Exit(1)
	}
}
