package xcloak

// The block cache through the Limiter, against a live server with the
// module: every "no call" is counted by the server (INFO commandstats).

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

func TestBlockCacheLive(t *testing.T) {
	server := testserver.Start(t, testserver.Config{})
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	ctx := context.Background()
	allows := func() int64 { return server.Calls("xcloak.allow") }
	must := func(t *testing.T, d Decision, err error, allowed bool, via Via) Decision {
		t.Helper()
		if err != nil || d.Allowed != allowed || d.Via != via {
			t.Fatalf("%+v, %v; want allowed=%v via %s", d, err, allowed, via)
		}
		return d
	}

	// A rejection, then the same request answered by the cache with no
	// call: the server's figures, remaining 0, the retry-after between what
	// the server said minus the time since before the call was sent, and
	// minus the time since its reply. Catches a cache that calls anyway, a
	// retry-after not counted down (or counted from the reply, late), and
	// Stats that don't count.
	t.Run("cached rejection", func(t *testing.T) {
		l := mustLimiter(t, rdb, Options{Prefix: "hit:"})
		for i := 0; i < 2; i++ {
			d, err := l.Allow(ctx, "k", time.Minute, 2)
			must(t, d, err, true, ViaCommand)
		}
		beforeSend := time.Now()
		d, err := l.Allow(ctx, "k", time.Minute, 2)
		server := must(t, d, err, false, ViaCommand)
		afterReply := time.Now()
		if st := l.Stats(); st != (Stats{CacheHits: 0, CacheEntries: 1}) {
			t.Errorf("after the rejection: %+v, want 1 entry", st)
		}
		n := allows()
		for i := 0; i < 2; i++ {
			if i == 1 {
				time.Sleep(30 * time.Millisecond) // the retry-after counts down
			}
			beforeHit := time.Now()
			d, err := l.Allow(ctx, "k", time.Minute, 2)
			afterHit := time.Now()
			cached := must(t, d, err, false, ViaCache)
			if cached.Limit != 2 || cached.Window != time.Minute || cached.Remaining != 0 || cached.Tier != 0 || cached.Stamp != -1 || len(cached.Tiers) != 0 {
				t.Errorf("cached: %+v", cached)
			}
			lo := server.RetryAfter - afterHit.Sub(beforeSend)
			hi := server.RetryAfter - beforeHit.Sub(afterReply) + time.Millisecond
			if cached.RetryAfter < lo || cached.RetryAfter > hi {
				t.Errorf("hit %d: retry-after %v, want from %v to %v (the server's %v counted down)", i, cached.RetryAfter, lo, hi, server.RetryAfter)
			}
			if cached.ResetAfter > server.ResetAfter || cached.ResetAfter < server.ResetAfter-afterHit.Sub(beforeSend)-time.Millisecond {
				t.Errorf("hit %d: reset-after %v, the server's %v aged", i, cached.ResetAfter, server.ResetAfter)
			}
		}
		if got := allows(); got != n {
			t.Errorf("the server ran %d XCLOAK.ALLOW for 2 cached rejections, want 0", got-n)
		}
		if st := l.Stats(); st != (Stats{CacheHits: 2, CacheEntries: 1}) {
			t.Errorf("stats %+v, want 2 hits, 1 entry", st)
		}
		// Without the cache, the same sequence calls every time.
		off := mustLimiter(t, rdb, Options{Prefix: "hit:", BlockCache: -1})
		n = allows()
		d, err = off.Allow(ctx, "k", time.Minute, 2)
		must(t, d, err, false, ViaCommand)
		if got := allows(); got != n+1 || off.Stats() != (Stats{}) {
			t.Errorf("BlockCache -1: %d calls, stats %+v; want 1 call and no stats", got-n, off.Stats())
		}
	})

	// Expiry: a 300 ms window; after its rejection every answer is the
	// cache's until the local deadline, then the request is sent again and
	// admitted (the server's window has opened). Catches an entry that
	// outlives its deadline (no admission within the bound) and a cached
	// answer after the deadline.
	t.Run("expiry", func(t *testing.T) {
		l := mustLimiter(t, rdb, Options{Prefix: "exp:"})
		d, err := l.Allow(ctx, "k", 300*time.Millisecond, 1)
		must(t, d, err, true, ViaCommand)
		d, err = l.Allow(ctx, "k", 300*time.Millisecond, 1)
		rejected := must(t, d, err, false, ViaCommand)
		latest := time.Now().Add(rejected.RetryAfter) // the cache's deadline is no later
		n, hits := allows(), 0
		admitted := testserver.Eventually(5*time.Second, func() bool {
			asked := time.Now()
			d, err := l.Allow(ctx, "k", 300*time.Millisecond, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Via == ViaCache {
				hits++
				if asked.After(latest) {
					t.Fatalf("a cached rejection %v past the deadline", asked.Sub(latest))
				}
			}
			return d.Allowed
		})
		sent := allows() - n
		if !admitted || hits == 0 || sent < 1 || sent > 3 {
			t.Errorf("admitted %v after %d cached rejections and %d calls; want admitted, hits, and 1 to 3 calls", admitted, hits, sent)
		}
		if st := l.Stats(); st.CacheEntries != 0 {
			t.Errorf("after the admission: %+v, want no entry", st)
		}
	})

	// A larger cost is cached, a smaller one sent; its admission drops the
	// entry. Another shape (tiers) is sent.
	t.Run("cost and tiers", func(t *testing.T) {
		l := mustLimiter(t, rdb, Options{Prefix: "cost:"})
		d, err := l.Allow(ctx, "k", time.Minute, 3, WithCost(2))
		must(t, d, err, true, ViaCommand)
		d, err = l.Allow(ctx, "k", time.Minute, 3, WithCost(2))
		must(t, d, err, false, ViaCommand)
		n := allows()
		d, err = l.Allow(ctx, "k", time.Minute, 3, WithCost(3))
		must(t, d, err, false, ViaCache)
		if allows() != n {
			t.Fatalf("a larger cost was sent")
		}
		d, err = l.Allow(ctx, "k", time.Minute, 3, WithTiers(Tier{time.Hour, 100}), WithCost(2))
		must(t, d, err, false, ViaCommand)         // other tiers: sent (and rejected by the server)
		d, err = l.Allow(ctx, "k", time.Minute, 3) // cost 1: sent, and it fits
		must(t, d, err, true, ViaCommand)
		if got := allows(); got != n+2 || l.Stats().CacheEntries != 0 {
			t.Errorf("%d calls, %+v; want 2 calls and the entry dropped by the admission", got-n, l.Stats())
		}
		d, err = l.Allow(ctx, "k", time.Minute, 3, WithCost(2))
		must(t, d, err, false, ViaCommand)
	})

	// Refund and Reset through the Limiter drop the key's entry before
	// sending: the next Allow is sent and admitted.
	t.Run("refund and reset drop", func(t *testing.T) {
		l := mustLimiter(t, rdb, Options{Prefix: "drop:"})
		for _, how := range []string{"refund", "reset"} {
			d, err := l.Allow(ctx, how, time.Minute, 1, WithStamp())
			admitted := must(t, d, err, true, ViaCommand)
			d, err = l.Allow(ctx, how, time.Minute, 1)
			must(t, d, err, false, ViaCommand)
			d, err = l.Allow(ctx, how, time.Minute, 1)
			must(t, d, err, false, ViaCache)
			if how == "refund" {
				if n, err := l.Refund(ctx, how, admitted.Stamp); n != 1 || err != nil {
					t.Fatal(n, err)
				}
			} else if existed, err := l.Reset(ctx, how); !existed || err != nil {
				t.Fatal(existed, err)
			}
			if st := l.Stats(); st.CacheEntries != 0 {
				t.Errorf("%s: %+v, want the entry dropped", how, st)
			}
			d, err = l.Allow(ctx, how, time.Minute, 1)
			must(t, d, err, true, ViaCommand)
		}
	})

	// Peek, WithNow and a Clock never consult the cache (and a Clock's
	// calls never record).
	t.Run("bypass", func(t *testing.T) {
		l := mustLimiter(t, rdb, Options{Prefix: "by:"})
		d, err := l.Allow(ctx, "k", time.Minute, 1)
		must(t, d, err, true, ViaCommand)
		d, err = l.Allow(ctx, "k", time.Minute, 1)
		must(t, d, err, false, ViaCommand)
		peeks, n, hits := server.Calls("xcloak.peek"), allows(), l.Stats().CacheHits
		d, err = l.Peek(ctx, "k", time.Minute, 1)
		must(t, d, err, false, ViaCommand)
		d, err = l.Allow(ctx, "k", time.Minute, 1, WithNow(time.Now().UnixMilli()))
		must(t, d, err, false, ViaCommand)
		if server.Calls("xcloak.peek") != peeks+1 || allows() != n+1 || l.Stats().CacheHits != hits {
			t.Errorf("peek and WithNow: %d peeks, %d allows, %d hits; want 1, 1, 0",
				server.Calls("xcloak.peek")-peeks, allows()-n, l.Stats().CacheHits-hits)
		}
		clock := &virtualClock{now: time.Now()}
		c := mustLimiter(t, rdb, Options{Prefix: "by:", Clock: clock})
		n = allows()
		for i := 0; i < 2; i++ {
			d, err = c.Allow(ctx, "clock", time.Minute, 1)
			must(t, d, err, i == 0, ViaCommand)
		}
		d, err = c.Allow(ctx, "clock", time.Minute, 1)
		must(t, d, err, false, ViaCommand)
		if allows() != n+3 || c.Stats() != (Stats{}) {
			t.Errorf("a Clock's limiter: %d calls, %+v; want 3 calls and nothing cached", allows()-n, c.Stats())
		}
	})

	// AllowAll: a hit at request j is the server's rejection at j (0..j-1
	// refunded); a first request blocked costs no call at all.
	t.Run("allow all", func(t *testing.T) {
		l := mustLimiter(t, rdb, Options{Prefix: "all:"})
		for i := 0; i < 2; i++ {
			d, err := l.Allow(ctx, "b", time.Minute, 1)
			must(t, d, err, i == 0, ViaCommand)
		}
		requests := []Request{{Key: "a", Window: time.Minute, Limit: 5}, {Key: "b", Window: time.Minute, Limit: 1}}
		n, refunds := allows(), server.Calls("xcloak.refund")
		m, err := l.AllowAll(ctx, requests)
		if err != nil || m.Allowed || m.Rejected != 1 || len(m.Decisions) != 2 || m.Decisions[1].Via != ViaCache || m.Binding.Via != ViaCache {
			t.Fatalf("%+v, %v", m, err)
		}
		if allows() != n+1 || server.Calls("xcloak.refund") != refunds+1 {
			t.Errorf("%d allows, %d refunds; want a's admission and its refund", allows()-n, server.Calls("xcloak.refund")-refunds)
		}
		if p, _ := l.Peek(ctx, "a", time.Minute, 5); p.Remaining != 5 {
			t.Errorf("a: %d remaining, want 5 (refunded)", p.Remaining)
		}
		n = allows()
		m, err = l.AllowAll(ctx, []Request{requests[1], requests[0]})
		if err != nil || m.Rejected != 0 || len(m.Decisions) != 1 || allows() != n {
			t.Errorf("blocked first: %+v, %v, %d calls; want rejected at 0 with no call", m, err, allows()-n)
		}
	})

	// Acquire on a blocked key: its first turn is the cache's (no call), it
	// sleeps the counted-down retry-after locally, then is admitted.
	t.Run("acquire", func(t *testing.T) {
		l := mustLimiter(t, rdb, Options{Prefix: "acq:"})
		for i := 0; i < 2; i++ {
			d, err := l.Allow(ctx, "k", 300*time.Millisecond, 1)
			must(t, d, err, i == 0, ViaCommand)
		}
		n, hits := allows(), l.Stats().CacheHits
		d, err := l.Acquire(ctx, "k", 300*time.Millisecond, 1, 5*time.Second)
		must(t, d, err, true, ViaCommand)
		if sent := allows() - n; sent < 1 || sent > 2 || l.Stats().CacheHits != hits+1 {
			t.Errorf("acquire: %d calls, %d hits; want 1 hit, then 1 or 2 calls", sent, l.Stats().CacheHits-hits)
		}
	})

	// An outage does not reach a blocked key: with the server paused, its
	// rejection still comes from the cache, under PolicyRaise, while another
	// key goes to the policy (the shared server is resumed at its end).
	t.Run("outage", func(t *testing.T) {
		l := mustLimiter(t, rdb, Options{Prefix: "out:", Timeout: 200 * time.Millisecond})
		for i := 0; i < 2; i++ {
			d, err := l.Allow(ctx, "k", time.Minute, 1)
			must(t, d, err, i == 0, ViaCommand)
		}
		server.Pause()
		defer server.Resume()
		d, err := l.Allow(ctx, "k", time.Minute, 1)
		must(t, d, err, false, ViaCache)
		if _, err := l.Allow(ctx, "other", time.Minute, 1); !errors.Is(err, ErrUnavailable) {
			t.Errorf("another key with the server paused: %v, want ErrUnavailable", err)
		}
	})

	// 100 goroutines on one key (go test -race): exactly the limit
	// admitted, counted by the server; every Allow a call or a hit.
	t.Run("goroutines", func(t *testing.T) {
		l := mustLimiter(t, rdb, Options{Prefix: "many:"})
		n := allows()
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < 100; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 10; i++ {
					d, err := l.Allow(ctx, "k", time.Minute, 10)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		onServer, _ := rdb.ZCard(ctx, "many:k").Result()
		calls, hits := allows()-n, l.Stats().CacheHits
		if admitted.Load() != 10 || onServer != 10 || calls+int64(hits) != 1000 || hits == 0 {
			t.Errorf("admitted %d, %d on the server, %d calls + %d hits; want 10, 10, 1000 with hits", admitted.Load(), onServer, calls, hits)
		}
	})
}
