package nethttp

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	xcloak "github.com/xcloak/xcloak/clients/go"
)

// New refuses a bad configuration with an *xcloak.Error naming the argument
// and its range, at construction (the Limiter's client points at a closed
// port, so nothing is sent): never at the first request, never through the
// error policy (the Limiter fails open here, and a check made through it
// would serve every request). Catches a middleware that builds on anything.
func TestConfigurationRefusedAtNew(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	l := mustLimiter(t, rdb, xcloak.Options{OnError: xcloak.PolicyAllow})
	ok := Limit{Window: time.Minute, Limit: 10}
	for _, c := range []struct {
		name string
		l    *xcloak.Limiter
		opt  Options
		want string
	}{
		{"nil limiter", nil, Options{Limits: []Limit{ok}}, "xcloak/nethttp: New needs an *xcloak.Limiter, not nil"},
		{"no limits", l, Options{}, "xcloak/nethttp: Options.Limits must hold at least one Limit"},
		{"limit 0", l, Options{Limits: []Limit{{Window: time.Minute, Limit: 0}}}, "xcloak/nethttp: Limits[0].Limit must be an integer from 1 to 1000000, not 0"},
		{"limit -1", l, Options{Limits: []Limit{ok, {Name: "b", Window: time.Minute, Limit: -1}}}, "xcloak/nethttp: Limits[1].Limit must be an integer from 1 to 1000000, not -1"},
		{"limit 1e11", l, Options{Limits: []Limit{{Window: time.Minute, Limit: 100_000_000_000}}}, "Limits[0].Limit must be an integer from 1 to 1000000, not 100000000000"},
		{"no window", l, Options{Limits: []Limit{{Limit: 10}}}, "xcloak/nethttp: Limits[0].Window must be a whole number of milliseconds from 1ms (a time.Duration), not 0s"},
		{"negative window", l, Options{Limits: []Limit{{Window: -time.Second, Limit: 10}}}, "Limits[0].Window must be a whole number of milliseconds from 1ms (a time.Duration), not -1s"},
		{"window 1.5 ms", l, Options{Limits: []Limit{{Window: 1500 * time.Microsecond, Limit: 10}}}, "Limits[0].Window must be a whole number of milliseconds from 1ms (a time.Duration), not 1.5ms"},
		{"tier window", l, Options{Limits: []Limit{{Window: time.Second, Limit: 10, Tiers: []xcloak.Tier{{Window: 0, Limit: 100}}}}}, "Limits[0].Tiers[0].Window must be a whole number of milliseconds from 1ms"},
		{"tier limit", l, Options{Limits: []Limit{{Window: time.Second, Limit: 10, Tiers: []xcloak.Tier{{Window: time.Hour, Limit: 100}, {Window: 2 * time.Hour, Limit: 0}}}}}, "Limits[0].Tiers[1].Limit must be an integer from 1 to 1000000, not 0"},
		{"16 tiers", l, Options{Limits: []Limit{{Window: time.Second, Limit: 10, Tiers: make([]xcloak.Tier, 16)}}}, "Limits[0].Tiers must hold at most 15 tiers (16 in all with the positional one), not 16"},
		{"negative cost", l, Options{Limits: []Limit{{Window: time.Minute, Limit: 10, Cost: -1}}}, "Limits[0].Cost must be an integer from 1 to 1000000 (0: 1), not -1"},
		{"cost above a tier's limit", l, Options{Limits: []Limit{{Window: time.Minute, Limit: 10, Cost: 6, Tiers: []xcloak.Tier{{Window: time.Second, Limit: 5}}}}}, "Limits[0].Cost must be at most the smallest limit of its tiers (5), not 6: no request could ever be admitted"},
		{"names", l, Options{Limits: []Limit{{Window: time.Minute, Limit: 10, Names: []string{"a", "b"}}}}, "xcloak/nethttp: Limits[0].Names must hold at most one name per tier (1), not 2"},
		{"same name", l, Options{Limits: []Limit{ok, {Window: time.Hour, Limit: 100, Name: "http"}}}, `xcloak/nethttp: Limits[1].Name "http" is Limits[0]'s too`},
		{"style", l, Options{Limits: []Limit{ok}, Style: "ietf-09"}, `xcloak/nethttp: Options.Style must be StyleIETF, StyleLegacy or StyleBoth, not "ietf-09"`},
		{"skip both", l, Options{Limits: []Limit{ok}, SkipSuccessful: true, SkipFailed: true}, "xcloak/nethttp: Options.SkipSuccessful and Options.SkipFailed can't both be set"},
	} {
		m, err := New(c.l, c.opt)
		var e *xcloak.Error
		if m != nil || !errors.As(err, &e) || !strings.Contains(e.Message, c.want) {
			t.Errorf("%s: New gave %v, %v; want an *xcloak.Error %q", c.name, m, err, c.want)
		}
	}
	if _, err := New(l, Options{Limits: []Limit{ok, {Name: "b", Window: time.Hour, Limit: 1000, Cost: 5, Names: []string{"hourly", "daily"},
		Tiers: []xcloak.Tier{{Window: 24 * time.Hour, Limit: 5}}}}, Style: xcloak.StyleBoth, SkipFailed: true}); err != nil {
		t.Errorf("a valid configuration: %v", err)
	}
}
