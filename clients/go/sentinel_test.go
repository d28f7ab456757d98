package xcloak

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// Through Sentinel: NewFailoverClient finds the primary (the windows are
// there), NewFailoverClusterClient with ReplicaOnly sends every PEEK to a
// replica, and after a failover the client follows the new primary, whose
// windows are the replicated ones. Catches a Limiter that needs a plain
// *redis.Client's address, or routes PEEK to the primary.
func TestSentinel(t *testing.T) {
	s := testserver.StartSentinel(t, testserver.Config{}, 2, 1)
	ctx := context.Background()
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: testserver.MasterName, SentinelAddrs: s.SentinelAddrs()})
	defer rdb.Close()
	l := mustLimiter(t, rdb, Options{})
	for i := 0; i < 2; i++ {
		r, err := l.Allow(ctx, "sentinel", time.Minute, 3)
		if err != nil || !r.Allowed || r.Remaining != 2-i || r.Via != ViaCommand {
			t.Fatalf("allow %d: %+v, %v", i, r, err)
		}
	}
	if n := s.Primary.Do("ZCARD", "sentinel").(int64); n != 2 {
		t.Fatalf("the primary holds %d entries", n)
	}
	s.Primary.Do("WAIT", 2, 5000)

	reads := redis.NewFailoverClusterClient(&redis.FailoverOptions{
		MasterName: testserver.MasterName, SentinelAddrs: s.SentinelAddrs(), ReplicaOnly: true,
	})
	defer reads.Close()
	peeks := mustLimiter(t, reads, Options{})
	for _, n := range append(s.Replicas, s.Primary) {
		n.ResetStats()
	}
	for i := 0; i < 20; i++ {
		r, err := peeks.Peek(ctx, "sentinel", time.Minute, 3)
		if err != nil || !r.Allowed || r.Remaining != 1 {
			t.Fatalf("peek %d: %+v, %v", i, r, err)
		}
	}
	onReplicas := testserver.Sum(s.Replicas, "commandstats", "cmdstat_xcloak.peek", "calls")
	if onPrimary := s.Primary.Calls("xcloak.peek"); onReplicas != 20 || onPrimary != 0 {
		t.Errorf("PEEK: %d on replicas, %d on the primary", onReplicas, onPrimary)
	}

	// A failover: the client follows; the windows moved with the data.
	old := s.Primary
	s.Sentinels[0].Do("SENTINEL", "FAILOVER", testserver.MasterName)
	var promoted string
	if !testserver.Eventually(30*time.Second, func() bool {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0].Addr()})
		defer c.Close()
		addr, err := c.GetMasterAddrByName(ctx, testserver.MasterName).Result()
		if err == nil {
			promoted = addr[1]
		}
		return err == nil && "127.0.0.1:"+promoted != old.Addr()
	}) {
		t.Fatalf("no failover:\n%s", s.Sentinels[0].Log())
	}
	// go-redis switches on Sentinel's +switch-master.
	if !testserver.Eventually(30*time.Second, func() bool {
		port, err := rdb.ConfigGet(ctx, "port").Result()
		return err == nil && port["port"] == promoted
	}) {
		t.Fatalf("the client never switched to the promoted replica on %s", promoted)
	}
	r, err := l.Allow(ctx, "sentinel", time.Minute, 3)
	if err != nil || !r.Allowed || r.Remaining != 0 {
		t.Fatalf("the third admission, on the new primary: %+v, %v", r, err)
	}
	r, err = l.Allow(ctx, "sentinel", time.Minute, 3)
	if err != nil || r.Allowed {
		t.Fatalf("the fourth on the new primary: %+v, %v", r, err)
	}
	for _, n := range s.Replicas {
		if n.Addr() == "127.0.0.1:"+promoted {
			if got := n.Do("ZCARD", "sentinel").(int64); got != 3 {
				t.Errorf("the new primary holds %d entries, want 3", got)
			}
		}
	}
}
