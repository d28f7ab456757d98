package xcloak

// The block cache's rules on its pure core, on a virtual monotonic clock:
// each test names what a broken cache would do. block_cache_vectors_test.go
// runs the shared vectors (clients/conformance/block_cache.json) through the
// same core; blockcache_live_test.go the rules that need a server.

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// virtualCache is a cache of capacity entries on a clock the test moves (ms).
func virtualCache(capacity int) (*blockCache, *float64) {
	at := new(float64)
	return newBlockCache(capacity, func() time.Duration { return time.Duration(*at * float64(time.Millisecond)) }), at
}

// reply builds an ALLOW ... DETAILS reply: the five head fields, then tiers.
func reply(allowed, limit, remaining, retry, reset int64, tiers ...[5]int64) interface{} {
	r := []interface{}{allowed, limit, remaining, retry, reset}
	if len(tiers) > 0 {
		ts := make([]interface{}, len(tiers))
		for i, t := range tiers {
			ts[i] = []interface{}{t[0], t[1], t[2], t[3], t[4]}
		}
		r = append(r, ts)
	}
	return r
}

// send is a request that must miss at the cache's time, then the server's
// reply recorded as sent at that time.
func send(t *testing.T, c *blockCache, key string, s shape, raw interface{}) {
	t.Helper()
	if d, _, hit := c.lookup(key, s); hit {
		t.Fatalf("%s %+v: a hit (%+v), want a miss", key, s, d)
	}
	_, tk, _ := c.lookup(key, s)
	d, err := parseDecision(raw, s.windowMs, len(s.tiers) > 0, false, false)
	if err != nil {
		t.Fatal(err)
	}
	d.Via = ViaCommand
	c.record(key, s, tk, d)
}

func hit(t *testing.T, c *blockCache, key string, s shape) Decision {
	t.Helper()
	d, _, ok := c.lookup(key, s)
	if !ok {
		t.Fatalf("%s %+v: a miss, want a hit", key, s)
	}
	if d.Allowed || d.Via != ViaCache || d.Remaining != 0 || d.Stamp != -1 || d.Oldest != -1 || d.CostExceedsLimit || d.Err != nil {
		t.Fatalf("a hit must be a rejection via cache with nothing else: %+v", d)
	}
	return d
}

func miss(t *testing.T, c *blockCache, key string, s shape) {
	t.Helper()
	if d, _, ok := c.lookup(key, s); ok {
		t.Fatalf("%s %+v: a hit (%+v), want a miss", key, s, d)
	}
}

var plain = shape{windowMs: 60000, limit: 10, cost: 1}

// The retry-after counts down from the server's figure to the deadline
// (sent_at + retry_after), rounded up to the millisecond and at least 1;
// reset_after ages by the whole milliseconds elapsed; at the deadline the
// entry is dropped, and the request is sent.
func TestBlockCacheCountdownAndExpiry(t *testing.T) {
	c, at := virtualCache(10)
	*at = 1000
	send(t, c, "k", plain, reply(0, 10, 0, 5000, 59000))
	*at = 1000.5
	d := hit(t, c, "k", plain)
	if d.RetryAfter != 5000*time.Millisecond || d.ResetAfter != 59000*time.Millisecond || d.Limit != 10 || d.Window != time.Minute {
		t.Errorf("0.5 ms later: %+v, want retry 5000 ms (ceil 4999.5), reset 59000 ms (0 whole ms elapsed)", d)
	}
	*at = 3999.25
	d = hit(t, c, "k", plain)
	if d.RetryAfter != 2001*time.Millisecond || d.ResetAfter != 56001*time.Millisecond {
		t.Errorf("2999.25 ms later: retry %v reset %v, want 2001ms (ceil 2000.75) and 56001ms (59000-2999)", d.RetryAfter, d.ResetAfter)
	}
	if h := d.Headers(StyleIETF).Get("Retry-After"); h != "3" {
		t.Errorf("Retry-After %q, want 3 (2001 ms rounded up)", h)
	}
	*at = 5999.9
	if d = hit(t, c, "k", plain); d.RetryAfter != time.Millisecond {
		t.Errorf("0.1 ms before the deadline: retry %v, want 1ms", d.RetryAfter)
	}
	if st := c.stats(); st.CacheHits != 3 || st.CacheEntries != 1 {
		t.Errorf("stats %+v, want 3 hits, 1 entry", st)
	}
	*at = 6000
	miss(t, c, "k", plain)
	if st := c.stats(); st.CacheEntries != 0 || st.CacheHits != 3 {
		t.Errorf("the expired entry met must be dropped: %+v", st)
	}
}

// A larger cost is cached, a smaller one is sent (and its rejection
// replaces the entry); another window, limit or tiers are sent and leave
// the entry.
func TestBlockCacheShape(t *testing.T) {
	c, at := virtualCache(10)
	three := shape{windowMs: 60000, limit: 10, cost: 3}
	send(t, c, "k", three, reply(0, 10, 1, 20000, 50000))
	hit(t, c, "k", three)
	hit(t, c, "k", shape{windowMs: 60000, limit: 10, cost: 7})
	miss(t, c, "k", shape{windowMs: 60000, limit: 10, cost: 2})
	miss(t, c, "k", shape{windowMs: 60001, limit: 10, cost: 3})
	miss(t, c, "k", shape{windowMs: 60000, limit: 11, cost: 3})
	tiered := shape{windowMs: 60000, limit: 10, tiers: []tierArg{{3600000, 100}}, cost: 3}
	miss(t, c, "k", tiered)
	hit(t, c, "k", three) // still there
	// The smaller cost rejected too: its entry replaces the larger one's.
	*at = 10
	send(t, c, "k", shape{windowMs: 60000, limit: 10, cost: 2}, reply(0, 10, 1, 15000, 50000))
	if d := hit(t, c, "k", shape{windowMs: 60000, limit: 10, cost: 2}); d.RetryAfter != 15000*time.Millisecond {
		t.Errorf("the replaced entry: retry %v, want 15s", d.RetryAfter)
	}
	miss(t, c, "k", shape{windowMs: 60000, limit: 10, cost: 1})
}

// Tiers: each tier's window, limit and remaining as the server gave them,
// its retry and reset aged and floored at 0; the binding tier kept.
func TestBlockCacheTiers(t *testing.T) {
	c, at := virtualCache(10)
	s := shape{windowMs: 1000, limit: 5, tiers: []tierArg{{60000, 10}}, cost: 1}
	send(t, c, "k", s, reply(0, 10, 0, 30000, 59000, [5]int64{1000, 5, 3, 0, 800}, [5]int64{60000, 10, 0, 30000, 59000}))
	*at = 1000.7
	d := hit(t, c, "k", s)
	want := []TierState{
		{Window: time.Second, Limit: 5, Remaining: 3, RetryAfter: 0, ResetAfter: 0},
		{Window: time.Minute, Limit: 10, Remaining: 0, RetryAfter: 29000 * time.Millisecond, ResetAfter: 58000 * time.Millisecond},
	}
	got := fmt.Sprint(d.Tier, d.Window, d.Limit, d.RetryAfter, d.ResetAfter)
	if got != fmt.Sprint(1, time.Minute, 10, 29000*time.Millisecond, 58000*time.Millisecond) {
		t.Errorf("binding: %s", got)
	}
	for i, w := range want {
		g := d.Tiers[i]
		if g.Window != w.Window || g.Limit != w.Limit || g.Remaining != w.Remaining || g.RetryAfter != w.RetryAfter || g.ResetAfter != w.ResetAfter {
			t.Errorf("tier %d: %+v, want %+v", i, g, w)
		}
	}
	d.Tiers[1].Limit = 99 // a caller's change must not reach the entry
	if d = hit(t, c, "k", s); d.Tiers[1].Limit != 10 {
		t.Errorf("the entry shares its tiers with a Decision handed out")
	}
}

// Never recorded: a request that can never fit (retry -1), a retry of 0, a
// rejection whose key was forgotten (refund, reset, admission) while it was
// in flight, an error policy's decision. An admission and forget drop.
func TestBlockCacheNotRecorded(t *testing.T) {
	c, _ := virtualCache(10)
	send(t, c, "never", shape{windowMs: 60000, limit: 10, cost: 11}, reply(0, 10, 10, -1, 0))
	miss(t, c, "never", shape{windowMs: 60000, limit: 10, cost: 11})
	send(t, c, "zero", plain, reply(0, 10, 0, 0, 0)) // a retry of 0 is no block
	miss(t, c, "zero", plain)

	send(t, c, "k", plain, reply(0, 10, 0, 5000, 59000))
	hit(t, c, "k", plain)
	c.forget("k")
	miss(t, c, "k", plain)

	send(t, c, "k", plain, reply(0, 10, 0, 5000, 59000))
	send(t, c, "k", shape{windowMs: 60000, limit: 10, cost: 0}, reply(1, 10, 9, 0, 60000)) // cost 0 misses; admitted
	miss(t, c, "k", plain)

	// A rejection in flight while its key is refunded: not recorded.
	_, tk, _ := c.lookup("k", plain)
	c.forget("k")
	d, _ := parseDecision(reply(0, 10, 0, 5000, 59000), 60000, false, false, false)
	c.record("k", plain, tk, d)
	miss(t, c, "k", plain)
	// ...while another key is forgotten: recorded (unless its slot collides).
	var other string
	for i := 0; other == ""; i++ {
		if k := fmt.Sprint("o", i); c.slot(k) != c.slot("k") {
			other = k
		}
	}
	_, tk, _ = c.lookup("k", plain)
	c.forget(other)
	c.record("k", plain, tk, d)
	hit(t, c, "k", plain)
	// An error policy's decision is never recorded.
	_, tk, _ = c.lookup("e", plain)
	c.record("e", plain, tk, Decision{Limit: 10, Via: ViaError, RetryAfter: time.Second, exact: true, retryMs: 1000})
	miss(t, c, "e", plain)
}

// Least recently used eviction: a hit touches its entry; the capacity
// bounds the entries.
func TestBlockCacheEviction(t *testing.T) {
	c, _ := virtualCache(2)
	send(t, c, "a", plain, reply(0, 10, 0, 5000, 59000))
	send(t, c, "b", plain, reply(0, 10, 0, 5000, 59000))
	hit(t, c, "a", plain) // b is now the least recently used
	send(t, c, "c", plain, reply(0, 10, 0, 5000, 59000))
	if st := c.stats(); st.CacheEntries != 2 {
		t.Fatalf("%d entries, want the capacity 2", st.CacheEntries)
	}
	miss(t, c, "b", plain)
	hit(t, c, "a", plain)
	hit(t, c, "c", plain)
}

// BenchmarkBlockCacheMemory: the heap held per entry (runtime.ReadMemStats
// after GC), 100,000 entries of 24-byte keys, without tiers and with 2
// tiers (the key, the shape, the server's figures, the list element and
// the map's share).
//
//	go test -run '^$' -bench BlockCacheMemory -benchtime 1x .
func BenchmarkBlockCacheMemory(b *testing.B) {
	const n = 100_000
	for _, c := range []struct {
		name  string
		s     shape
		reply interface{}
	}{
		{"no tiers", shape{windowMs: 60000, limit: 10, cost: 1}, reply(0, 10, 0, 30000, 59000)},
		{"2 tiers", shape{windowMs: 1000, limit: 5, tiers: []tierArg{{60000, 10}}, cost: 1},
			reply(0, 10, 0, 30000, 59000, [5]int64{1000, 5, 3, 0, 800}, [5]int64{60000, 10, 0, 30000, 59000})},
	} {
		b.Run(c.name, func(b *testing.B) {
			d, err := parseDecision(c.reply, c.s.windowMs, len(c.s.tiers) > 0, false, false)
			if err != nil {
				b.Fatal(err)
			}
			d.Via = ViaCommand
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			cache := newBlockCache(n, nil)
			for i := 0; i < n; i++ {
				key := fmt.Sprintf("rl:login:%015d", i) // 24 bytes
				s := c.s
				if len(s.tiers) > 0 {
					s.tiers = append([]tierArg(nil), c.s.tiers...) // each call has its own
				}
				_, tk, _ := cache.lookup(key, s)
				cache.record(key, s, tk, d)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			if st := cache.stats(); st.CacheEntries != n {
				b.Fatalf("%d entries", st.CacheEntries)
			}
			runtime.KeepAlive(cache)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/entry")
		})
	}
}

// BenchmarkBlockCacheHit: one lookup that hits (no tiers), its allocations.
func BenchmarkBlockCacheHit(b *testing.B) {
	c := newBlockCache(10, nil)
	d, _ := parseDecision(reply(0, 10, 0, 3_600_000, 3_600_000), 60000, false, false, false)
	_, tk, _ := c.lookup("k", plain)
	c.record("k", plain, tk, d)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, _, ok := c.lookup("k", plain); !ok {
			b.Fatal("miss")
		}
	}
}
