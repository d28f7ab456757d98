package xcloak

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// A Ring of two shards, one without the module: each key goes to its shard
// (the Ring's own hashing, for the command and the script alike), and the
// fallback is chosen per shard. Catches a script call hashed by its SHA
// (every fallback call on one shard) and one fallback state for all shards.
func TestRingShardsAndPerShardFallback(t *testing.T) {
	with := testserver.Start(t, testserver.Config{})
	without := testserver.Start(t, testserver.Config{NoModule: true})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": with.Addr(), "b": without.Addr()}})
	defer ring.Close()
	l := mustLimiter(t, ring, Options{})
	ctx := context.Background()
	vias := map[Via]int{}
	for k := 0; k < 100; k++ {
		key := fmt.Sprintf("ring:%d", k)
		shard, err := ring.GetShardClientForKey(key)
		if err != nil {
			t.Fatal(err)
		}
		want := ViaCommand
		if shard.Options().Addr == without.Addr() {
			want = ViaScript
		}
		for round := 0; round < 2; round++ {
			r, err := l.Allow(ctx, key, time.Minute, 1)
			if err != nil || r.Allowed != (round == 0) || r.Via != want {
				t.Fatalf("%s round %d: %+v, %v (want via %s)", key, round, r, err, want)
			}
			vias[r.Via]++
		}
		server := with
		if want == ViaScript {
			server = without
		}
		if n := server.Do("ZCARD", key).(int64); n != 1 {
			t.Errorf("%s: %d entries on its shard", key, n)
		}
	}
	if vias[ViaCommand] == 0 || vias[ViaScript] == 0 {
		t.Errorf("answered by %v", vias)
	}
	if n := with.Calls("evalsha"); n != 0 {
		t.Errorf("the shard with the module ran %d scripts", n)
	}
}

// AllowAll with the second key's shard paused past the Limiter's timeout.
// Under PolicyAllow and PolicyDeny the MultiDecision holds the Decision received
// for request 0 (its admission), then the policy's for request 1 (request
// 1's tier 0: its limit and window), which binds; Allowed is the policy's,
// Rejected is 1 under deny and -1 under allow, and there are no headers.
// Under every policy request 0's admission is refunded on its own shard.
// Catches: the policy's Decision built from request 0's limit, the received
// Decisions dropped, Rejected left -1 under deny, no refund.
func TestAllowAllOutage(t *testing.T) {
	a := testserver.Start(t, testserver.Config{})
	b := testserver.Start(t, testserver.Config{})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr(), "b": b.Addr()}})
	defer ring.Close()
	ctx := context.Background()
	keyOn := func(s *testserver.Server, prefix string) (string, *redis.Client) {
		for i := 0; ; i++ {
			key := fmt.Sprintf("%s%d", prefix, i)
			shard, err := ring.GetShardClientForKey(key)
			if err != nil {
				t.Fatal(err)
			}
			if shard.Options().Addr == s.Addr() {
				return key, shard
			}
		}
	}
	for _, policy := range []ErrorPolicy{PolicyRaise, PolicyAllow, PolicyDeny} {
		l := mustLimiter(t, ring, Options{OnError: policy, Timeout: 200 * time.Millisecond})
		first, _ := keyOn(a, "first:"+policy.String()+":")
		second, shard := keyOn(b, "second:"+policy.String()+":")
		if err := shard.Ping(ctx).Err(); err != nil {
			t.Fatal(err) // a set-up connection to b: the call is written, then times out
		}
		a.ResetStats()
		b.Pause()
		m, err := l.AllowAll(ctx, []Request{
			{Key: first, Window: time.Minute, Limit: 5},
			{Key: second, Window: 2 * time.Minute, Limit: 7},
		})
		b.Resume()
		if n := a.Do("EXISTS", first).(int64); n != 0 || a.Calls("xcloak.refund") == 0 {
			t.Errorf("%s: request 0's admission was not refunded", policy)
		}
		if policy == PolicyRaise {
			if !errors.Is(err, ErrUnavailable) {
				t.Errorf("raise: %+v, %v", m, err)
			}
			continue
		}
		rejected := -1
		if policy == PolicyDeny {
			rejected = 1
		}
		if err != nil || m.Allowed != (policy == PolicyAllow) || m.Rejected != rejected || m.BindingIndex != 1 || m.Binding.Via != ViaError || len(m.Decisions) != 2 {
			t.Fatalf("%s: %+v, %v", policy, m, err)
		}
		if r := m.Decisions[0]; !r.Allowed || r.Via != ViaCommand || r.Limit != 5 || r.Remaining != 4 || r.Window != time.Minute || !r.HasStamp() {
			t.Errorf("%s: request 0's Decision %+v", policy, r)
		}
		if r := m.Decisions[1]; r.Via != ViaError || r.Err == nil || r.Allowed != m.Allowed || r.Limit != 7 || r.Window != 2*time.Minute ||
			r.Remaining != 0 || r.Tier != 0 || len(r.Tiers) != 0 || r.HasStamp() {
			t.Errorf("%s: request 1's Decision %+v", policy, r)
		}
		if m.Binding.RetryAfter != 0 || len(m.Headers(StyleBoth)) != 0 {
			t.Errorf("%s: retry after %v, headers %v", policy, m.Binding.RetryAfter, m.Headers(StyleBoth))
		}
	}
}
