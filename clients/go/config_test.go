package xcloak

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// NewLimiter refuses options out of range with an *Error naming the option
// and its range, before any call (the client points at a closed port: a
// check made at a call could not pass). Catches a constructor that accepts
// everything and leaves the error to the first request, or to the policy.
func TestNewLimiterRefusesBadOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	var nilClient *redis.Client
	for _, c := range []struct {
		name string
		rdb  redis.UniversalClient
		opt  Options
		want string
	}{
		{"nil client", nil, Options{}, "rdb must be a go-redis client, not nil"},
		{"typed nil client", nilClient, Options{}, "rdb must be a go-redis client, not nil"},
		{"unknown policy", rdb, Options{OnError: 7}, "Options.OnError must be PolicyRaise, PolicyAllow or PolicyDeny, not 7"},
		{"negative policy", rdb, Options{OnError: -1}, "Options.OnError must be PolicyRaise, PolicyAllow or PolicyDeny, not -1"},
		{"unknown fallback", rdb, Options{Fallback: 3}, "Options.Fallback must be FallbackAuto, FallbackAlways or FallbackNever, not 3"},
		{"negative timeout", rdb, Options{Timeout: -time.Second}, "Options.Timeout must be above 0 (0: the default 1s; -1: none), not -1s"},
		{"negative probe interval", rdb, Options{ProbeInterval: -time.Second}, "Options.ProbeInterval must be 0 (the default 60s) or above, not -1s"},
		{"jitter above 1", rdb, Options{JitterFraction: 1.5}, "Options.JitterFraction must be from 0 to 1 (0: the default 0.1; -1: none), not 1.5"},
		{"negative jitter", rdb, Options{JitterFraction: -0.5}, "Options.JitterFraction must be from 0 to 1"},
		{"no replicas", rdb, Options{Durable: &Durable{Replicas: 0, Timeout: time.Second}}, "Durable.Replicas must be 1 or more, not 0"},
		{"WAIT 0", rdb, Options{Durable: &Durable{Replicas: 1}}, "Durable.Timeout must be a whole number of milliseconds from 1ms (WAIT 0 blocks for ever), not 0s"},
		{"block cache -2", rdb, Options{BlockCache: -2}, "Options.BlockCache must be from 1 to 1000000 entries (0: the default 10000; -1: no block cache), not -2"},
		{"block cache too large", rdb, Options{BlockCache: 1_000_001}, "Options.BlockCache must be from 1 to 1000000 entries (0: the default 10000; -1: no block cache), not 1000001"},
		{"WAIT 1.5 ms", rdb, Options{Durable: &Durable{Replicas: 1, Timeout: 1500 * time.Microsecond}}, "Durable.Timeout must be a whole number of milliseconds from 1ms"},
	} {
		l, err := NewLimiter(c.rdb, c.opt)
		var e *Error
		if l != nil || !errors.As(err, &e) || !strings.HasPrefix(e.Message, "xcloak: NewLimiter: "+c.want) {
			t.Errorf("%s: NewLimiter gave %v, %v; want an *Error %q", c.name, l, err, c.want)
		}
	}
	// The documented special values are accepted.
	for _, opt := range []Options{
		{}, {Timeout: -1}, {JitterFraction: -1}, {JitterFraction: 1}, {OnError: PolicyDeny, Fallback: FallbackNever},
		{Durable: &Durable{Replicas: 2, Timeout: time.Millisecond}},
		{BlockCache: -1}, {BlockCache: 1}, {BlockCache: 1_000_000},
	} {
		if l, err := NewLimiter(rdb, opt); err != nil || l == nil {
			t.Errorf("%+v: %v", opt, err)
		}
	}
	// The block cache's size: 0 is the default, -1 none.
	for n, want := range map[int]int{0: 10_000, -1: 0, 1: 1, 1_000_000: 1_000_000} {
		l := mustLimiter(t, rdb, Options{BlockCache: n})
		got := 0
		if l.cache != nil {
			got = l.cache.capacity
		}
		if got != want {
			t.Errorf("BlockCache %d: %d entries, want %d", n, got, want)
		}
	}
}
