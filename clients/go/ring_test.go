package xcloak

import (
	"context"
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
	l := NewLimiter(ring, Options{})
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
