package xcloak

import (
	"container/list"
	"hash/maphash"
	"sync"
	"time"
)

// The block cache (docs/clients.md, Block cache): after a server rejection
// with a retry-after above 0, the key can't be admitted for that request's
// shape and a cost at least as large until the local monotonic time it was
// sent plus that retry-after. An Allow inside that time is answered here,
// rejected, with Via == ViaCache and no call. Pure: no I/O, its clock is
// injected (a monotonic reading).

// defaultBlockCache is the block cache's size when Options.BlockCache is 0.
const defaultBlockCache = 10_000

// maxBlockCache is the largest Options.BlockCache.
const maxBlockCache = 1_000_000

// Stats are a Limiter's counters (Limiter.Stats).
type Stats struct {
	// CacheHits counts the Allow calls (and AllowAll requests, Acquire
	// turns) the block cache answered without a call, since NewLimiter.
	CacheHits uint64
	// CacheEntries is how many keys the block cache holds now (expired
	// entries not yet met included).
	CacheEntries int
}

// blockCache is a least-recently-used map from a key (prefix included) to
// its last rejection. Safe for concurrent use; its mutex is never held
// across a call: lookup, unlock, send, then record.
type blockCache struct {
	mu       sync.Mutex
	capacity int
	now      func() time.Duration // monotonic, from any origin
	order    list.List            // of *blockEntry, most recently used first
	entries  map[string]*list.Element
	hits     uint64

	// A rejection is recorded only if its key was not forgotten (refund,
	// reset, an admission) since the request was sent: epoch counts the
	// forgets, forgot[slot of key] is the epoch of the last one on a key of
	// that slot. A collision only skips a record: the cache can't be late.
	epoch  uint64
	forgot [256]uint64
	seed   maphash.Seed
}

// blockEntry is one key's rejection: the request's shape (sig), its cost,
// when it was sent and until when it can't fit, and the server's figures.
type blockEntry struct {
	key      string
	windowMs int64 // sig: the positional window and limit, and the tiers
	limit    int
	tiers    []tierArg
	cost     int
	sentAt   time.Duration
	deadline time.Duration
	// the server's decision: the binding tier and its reset, and each tier
	decLimit  int
	decWindow int64
	decTier   int
	resetMs   int64
	decTiers  []cachedTier
}

type cachedTier struct {
	windowMs, retryMs, resetMs int64
	limit, remaining           int
}

// shape is a request's signature and cost, as the cache compares them.
type shape struct {
	windowMs int64
	limit    int
	tiers    []tierArg
	cost     int
}

func (s shape) same(e *blockEntry) bool {
	if s.windowMs != e.windowMs || s.limit != e.limit || len(s.tiers) != len(e.tiers) {
		return false
	}
	for i, t := range s.tiers {
		if t != e.tiers[i] {
			return false
		}
	}
	return true
}

// newBlockCache holds at most capacity entries, on the clock now (nil: the
// process's monotonic clock).
func newBlockCache(capacity int, now func() time.Duration) *blockCache {
	if now == nil {
		origin := time.Now()
		now = func() time.Duration { return time.Since(origin) } // the monotonic reading
	}
	return &blockCache{capacity: capacity, now: now, entries: make(map[string]*list.Element), seed: maphash.MakeSeed()}
}

func (c *blockCache) slot(key string) int {
	return int(maphash.String(c.seed, key) % uint64(len(c.forgot)))
}

// ticket is what a miss hands the sender: when it looked (the request's
// sent_at, taken before the call) and the forget epoch then.
type ticket struct {
	sentAt time.Duration
	epoch  uint64
}

// lookup answers a request about to be sent: a hit is the cached
// rejection (Via == ViaCache); a miss returns the ticket record needs.
func (c *blockCache) lookup(key string, s shape) (Decision, ticket, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	t := ticket{sentAt: now, epoch: c.epoch}
	el, ok := c.entries[key]
	if !ok {
		return Decision{}, t, false
	}
	e := el.Value.(*blockEntry)
	if now >= e.deadline {
		c.order.Remove(el) // an expired entry is dropped when met
		delete(c.entries, key)
		return Decision{}, t, false
	}
	if !s.same(e) || s.cost < e.cost {
		return Decision{}, t, false // another shape, or a smaller cost: sent
	}
	if s.cost > s.limit {
		return Decision{}, t, false // above a tier's limit: it never fits, and the server's answer says so
	}
	for _, tier := range s.tiers {
		if s.cost > tier.limit {
			return Decision{}, t, false
		}
	}
	c.order.MoveToFront(el)
	c.hits++
	return e.decision(now), t, true
}

// decision is e's rejection as seen at now: retry-after counted down to the
// deadline (rounded up, at least 1 ms), resets aged by the whole
// milliseconds elapsed since it was sent.
func (e *blockEntry) decision(now time.Duration) Decision {
	retryMs := max(int64((e.deadline-now+time.Millisecond-1)/time.Millisecond), 1)
	elapsedMs := int64((now - e.sentAt) / time.Millisecond)
	d := Decision{
		Limit: e.decLimit, Window: duration(e.decWindow), Tier: e.decTier,
		RetryAfter: duration(retryMs), ResetAfter: duration(max(e.resetMs-elapsedMs, 0)),
		Stamp: -1, Oldest: -1, Via: ViaCache,
		exact: true, windowMs: e.decWindow, retryMs: retryMs, resetMs: max(e.resetMs-elapsedMs, 0),
	}
	if len(e.decTiers) > 0 {
		d.Tiers = make([]TierState, len(e.decTiers))
		for i, t := range e.decTiers {
			retry, reset := max(t.retryMs-elapsedMs, 0), max(t.resetMs-elapsedMs, 0)
			d.Tiers[i] = TierState{
				Window: duration(t.windowMs), Limit: t.limit, Remaining: t.remaining,
				RetryAfter: duration(retry), ResetAfter: duration(reset),
				exact: true, windowMs: t.windowMs, retryMs: retry, resetMs: reset,
			}
		}
	}
	return d
}

// record takes the server's decision d of the request (key, s) sent at t:
// a rejection with a retry-after above 0 becomes the key's entry (unless
// the key was forgotten since t), an admission drops the key's entry.
// Anything else (a request that can never fit) changes nothing.
func (c *blockCache) record(key string, s shape, t ticket, d Decision) {
	if d.Allowed {
		c.forget(key) // the window opened earlier than cached, or no entry
		return
	}
	retryMs := d.msRetry()
	if retryMs <= 0 || d.Via == ViaError {
		return
	}
	e := &blockEntry{
		key: key, windowMs: s.windowMs, limit: s.limit, tiers: s.tiers, cost: s.cost,
		sentAt: t.sentAt, deadline: t.sentAt + time.Duration(retryMs)*time.Millisecond,
		decLimit: d.Limit, decWindow: d.msWindow(), decTier: d.Tier, resetMs: d.msReset(),
	}
	if len(d.Tiers) > 0 {
		e.decTiers = make([]cachedTier, len(d.Tiers))
		for i, tr := range d.Tiers {
			e.decTiers[i] = cachedTier{windowMs: tr.msWindow(), retryMs: max(tr.msRetry(), 0), resetMs: tr.msReset(), limit: tr.Limit, remaining: tr.Remaining}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.forgot[c.slot(key)] > t.epoch {
		return // refunded, reset or admitted since it was sent: the window may have opened
	}
	if el, ok := c.entries[key]; ok {
		el.Value = e
		c.order.MoveToFront(el)
		return
	}
	if c.order.Len() >= c.capacity {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.entries, last.Value.(*blockEntry).key)
	}
	c.entries[key] = c.order.PushFront(e)
}

// forget drops key's entry (a refund or a reset through this Limiter, an
// admission) and makes a rejection of key still in flight unrecorded.
func (c *blockCache) forget(key string) {
	slot := c.slot(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	c.forgot[slot] = c.epoch
	if el, ok := c.entries[key]; ok {
		c.order.Remove(el)
		delete(c.entries, key)
	}
}

func (c *blockCache) stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{CacheHits: c.hits, CacheEntries: c.order.Len()}
}
