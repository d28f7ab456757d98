//! The block cache (docs/clients.md, "Block cache"), pure: no I/O, no clock
//! of its own. A server rejection with a `retry_after` says that this key,
//! for this request's shape and any cost at least as large, can't be
//! admitted before the instant the call was sent plus `retry_after`; until
//! then the same request is rejected here, without a call. It never admits.
//!
//! Times are durations on the local monotonic clock since an origin of the
//! caller's (the engine: an `Instant` taken when the limiter was built; the
//! tests: a virtual clock). The call's send time is taken before it is sent,
//! so a cached deadline is never later than the server's: the cache may
//! answer early (a request that would have been rejected is sent), never late.
//!
//! Bounded: at most `capacity` entries, the least recently used evicted
//! first; an expired entry is dropped when met. A `HashMap` from the key to
//! an index in a `Vec` of slots that are also a doubly linked list by index
//! (most recent first): every operation is O(1), with no unsafe code and no
//! dependency.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::{Decision, TierState, Via};
use crate::request::{Request, Tier};

/// What a limiter's block cache did since the limiter was built
/// ([`Limiter::stats`](crate::Limiter::stats)). Zeros when the cache is off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stats {
    /// Calls answered by the cache (`via = Via::Cache`), each one a round
    /// trip to Redis saved.
    pub cache_hits: u64,
    /// Entries held now (an expired one counts until it is met or evicted).
    pub cache_entries: usize,
}

/// The default number of entries.
pub(crate) const DEFAULT_ENTRIES: usize = 10_000;
/// The most entries `block_cache` takes.
pub(crate) const MAX_ENTRIES: usize = 1_000_000;

/// No slot (the end of the list).
const NIL: u32 = u32::MAX;

/// What a rejection of one key said, for one request shape.
struct Blocked {
    // The shape it holds for: exactly this window, limit and tiers.
    window: Duration,
    limit: u64,
    tiers: Box<[Tier]>,
    /// The rejected request's cost: a cost at least this large is rejected.
    cost: u64,
    /// When the call was sent (before it was sent), and `sent_at + retry_after`.
    sent_at: Duration,
    deadline: Duration,
    // The server's decision, as it gave it.
    decided_limit: u64,
    decided_window: Duration,
    tier: usize,
    reset_after: Duration,
    states: Box<[TierState]>,
}

struct Slot {
    key: Arc<str>,
    blocked: Blocked,
    /// Toward the most recently used, and toward the least.
    newer: u32,
    older: u32,
}

pub(crate) struct BlockCache {
    capacity: usize,
    index: HashMap<Arc<str>, u32>,
    slots: Vec<Slot>,
    /// The most and the least recently used slots.
    newest: u32,
    oldest: u32,
    hits: u64,
    /// Refunds and resets so far ([`BlockCache::forget`]).
    forgets: u64,
}

/// `duration` in whole milliseconds, rounded up.
fn ceil_ms(duration: Duration) -> Duration {
    let ms = duration.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// `duration` in whole milliseconds, rounded down.
fn floor_ms(duration: Duration) -> Duration {
    Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

impl BlockCache {
    /// At most `capacity` entries (at least 1: a cache of 0 is no cache).
    pub(crate) fn new(capacity: usize) -> BlockCache {
        BlockCache {
            capacity: capacity.max(1),
            index: HashMap::new(),
            slots: Vec::new(),
            newest: NIL,
            oldest: NIL,
            hits: 0,
            forgets: 0,
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            cache_hits: self.hits,
            cache_entries: self.slots.len(),
        }
    }

    /// The rejection `request` (its key after the prefix) would get at `now`,
    /// or `None`: send it. A hit needs an entry that has not expired (an
    /// expired one is dropped), for the same window, limit and tiers, and a
    /// cost at least the rejected one's and at most every tier's limit (a
    /// larger cost can never fit: the server says so, not a wait).
    pub(crate) fn lookup(&mut self, request: &Request, now: Duration) -> Option<Decision> {
        let at = *self.index.get(request.key.as_str())?;
        let blocked = &self.slots[at as usize].blocked;
        if now >= blocked.deadline {
            self.remove(at);
            return None;
        }
        let same_shape =
            blocked.window == request.window && blocked.limit == request.limit && *blocked.tiers == *request.tiers;
        let fits = request.cost <= request.limit && request.tiers.iter().all(|t| request.cost <= t.limit);
        if !same_shape || request.cost < blocked.cost || !fits {
            return None;
        }
        let elapsed = floor_ms(now.saturating_sub(blocked.sent_at));
        let decision = Decision {
            allowed: false,
            limit: blocked.decided_limit,
            remaining: 0,
            retry_after: Some(ceil_ms(blocked.deadline - now).max(Duration::from_millis(1))),
            reset_after: blocked.reset_after.saturating_sub(elapsed),
            cost_exceeds_limit: false,
            window: blocked.decided_window,
            tier: blocked.tier,
            tiers: blocked
                .states
                .iter()
                .map(|t| TierState {
                    retry_after: t.retry_after.map(|r| r.saturating_sub(elapsed)),
                    reset_after: t.reset_after.saturating_sub(elapsed),
                    ..t.clone()
                })
                .collect(),
            stamp: None,
            oldest: None,
            via: Via::Cache,
            error: None,
        };
        self.touch(at);
        self.hits += 1;
        Some(decision)
    }

    /// [`BlockCache::record_since`] with no refund or reset in between.
    #[cfg(test)]
    pub(crate) fn record(&mut self, request: &Request, decision: &Decision, sent_at: Duration) {
        self.record_since(request, decision, sent_at, self.forgets);
    }

    /// How many refunds and resets were seen: read when a call is sent, and
    /// given back to [`BlockCache::record_since`] with its decision.
    pub(crate) fn forgets(&self) -> u64 {
        self.forgets
    }

    /// What the server decided for `request`, sent at `sent_at` when
    /// [`BlockCache::forgets`] was `forgets`: a rejection with a retry-after
    /// is held (replacing the key's entry), an admission drops the key's
    /// entry (the window opened earlier than held: a refund elsewhere); a
    /// rejection that can never fit, or the error policy's answer, changes
    /// nothing. A refund or reset since `forgets` may have opened the window
    /// after the server rejected this call: its rejection is not held (the
    /// key's next one will be), so a refund in flight beside it never leaves
    /// the key blocked in this process.
    pub(crate) fn record_since(&mut self, request: &Request, decision: &Decision, sent_at: Duration, forgets: u64) {
        if decision.via == Via::Error || decision.via == Via::Cache {
            return;
        }
        if decision.allowed {
            self.drop_key(&request.key);
            return;
        }
        if forgets != self.forgets {
            return;
        }
        let Some(retry_after) = decision
            .retry_after
            .filter(|r| !r.is_zero() && !decision.cost_exceeds_limit)
        else {
            return;
        };
        let blocked = Blocked {
            window: request.window,
            limit: request.limit,
            tiers: request.tiers.clone().into_boxed_slice(),
            cost: request.cost,
            sent_at,
            deadline: sent_at.saturating_add(retry_after),
            decided_limit: decision.limit,
            decided_window: decision.window,
            tier: decision.tier,
            reset_after: decision.reset_after,
            states: decision.tiers.clone().into_boxed_slice(),
        };
        if let Some(&at) = self.index.get(request.key.as_str()) {
            self.slots[at as usize].blocked = blocked;
            self.touch(at);
            return;
        }
        let key: Arc<str> = Arc::from(request.key.as_str());
        let at = if self.slots.len() >= self.capacity {
            // Full: the least recently used slot takes the new key.
            let at = self.oldest;
            self.unlink(at);
            let slot = &mut self.slots[at as usize];
            self.index.remove(&slot.key);
            slot.key = key.clone();
            slot.blocked = blocked;
            at
        } else {
            self.slots.push(Slot {
                key: key.clone(),
                blocked,
                newer: NIL,
                older: NIL,
            });
            (self.slots.len() - 1) as u32
        };
        self.index.insert(key, at);
        self.push_newest(at);
    }

    /// Drops `key`'s entry (a refund or a reset of it through this limiter),
    /// and counts it: a rejection of any key sent before it is not held.
    pub(crate) fn forget(&mut self, key: &str) {
        self.forgets += 1;
        self.drop_key(key);
    }

    fn drop_key(&mut self, key: &str) {
        if let Some(&at) = self.index.get(key) {
            self.remove(at);
        }
    }

    /// Makes `at` the most recently used.
    fn touch(&mut self, at: u32) {
        if self.newest != at {
            self.unlink(at);
            self.push_newest(at);
        }
    }

    fn push_newest(&mut self, at: u32) {
        let slot = &mut self.slots[at as usize];
        slot.newer = NIL;
        slot.older = self.newest;
        if self.newest != NIL {
            self.slots[self.newest as usize].newer = at;
        } else {
            self.oldest = at;
        }
        self.newest = at;
    }

    /// Takes `at` out of the list (it stays in `slots` and `index`).
    fn unlink(&mut self, at: u32) {
        let (newer, older) = {
            let slot = &self.slots[at as usize];
            (slot.newer, slot.older)
        };
        match newer {
            NIL => self.newest = older,
            n => self.slots[n as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.slots[o as usize].newer = newer,
        }
    }

    /// Removes slot `at` altogether; the last slot moves into its place.
    fn remove(&mut self, at: u32) {
        self.unlink(at);
        let removed = self.slots.swap_remove(at as usize);
        self.index.remove(&removed.key);
        let moved_from = self.slots.len() as u32;
        if at == moved_from {
            return;
        }
        // The slot that was last is now at `at`: its neighbours, the list's
        // ends and the index point to it there.
        let (newer, older) = {
            let slot = &self.slots[at as usize];
            (slot.newer, slot.older)
        };
        match newer {
            NIL => self.newest = at,
            n => self.slots[n as usize].older = at,
        }
        match older {
            NIL => self.oldest = at,
            o => self.slots[o as usize].newer = at,
        }
        let key = self.slots[at as usize].key.clone();
        self.index.insert(key, at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn minute(key: &str) -> Request {
        Request::new(key, MS(60_000), 10)
    }

    /// The server's rejection of `request`: retry after `retry`, the window empty in `reset`.
    fn rejected(request: &Request, retry: u64, reset: u64) -> Decision {
        let reply = redis::Value::Array(
            [0, request.limit as i64, 0, retry as i64, reset as i64]
                .map(redis::Value::Int)
                .to_vec(),
        );
        Decision::from_reply(&reply, request, Via::Command).unwrap()
    }

    fn admitted(request: &Request) -> Decision {
        Decision {
            allowed: true,
            retry_after: Some(Duration::ZERO),
            ..rejected(request, 0, 100)
        }
    }

    /// The list from newest to oldest, checked against the other direction,
    /// the index and the slots.
    fn order(cache: &BlockCache) -> Vec<String> {
        let (mut forward, mut at, mut previous) = (Vec::new(), cache.newest, NIL);
        while at != NIL {
            let slot = &cache.slots[at as usize];
            assert_eq!(slot.newer, previous);
            assert_eq!(cache.index[&slot.key], at);
            forward.push(slot.key.to_string());
            (previous, at) = (at, slot.older);
        }
        assert_eq!(cache.oldest, previous);
        assert_eq!(
            (forward.len(), cache.index.len()),
            (cache.slots.len(), cache.slots.len())
        );
        forward
    }

    /// A reply as the vectors write it, as the `redis` crate reads it.
    fn value(json: &serde_json::Value) -> redis::Value {
        match json {
            serde_json::Value::Number(n) => redis::Value::Int(n.as_i64().unwrap()),
            serde_json::Value::Array(items) => redis::Value::Array(items.iter().map(value).collect()),
            other => panic!("reply {other}"),
        }
    }

    /// A Decision in the vectors' JSON shape.
    fn decision_json(d: &Decision) -> serde_json::Value {
        let ms = |d: Duration| d.as_millis() as i64;
        let retry = |r: Option<Duration>| r.map_or(-1, ms);
        serde_json::json!({
            "allowed": d.allowed,
            "limit": d.limit,
            "remaining": d.remaining,
            "retry_after_ms": retry(d.retry_after),
            "reset_after_ms": ms(d.reset_after),
            "cost_exceeds_limit": d.cost_exceeds_limit,
            "window_ms": ms(d.window),
            "tier": d.tier,
            "tiers": d.tiers.iter().map(|t| serde_json::json!({
                "window_ms": ms(t.window),
                "limit": t.limit,
                "remaining": t.remaining,
                "retry_after_ms": retry(t.retry_after),
                "reset_after_ms": ms(t.reset_after),
            })).collect::<Vec<_>>(),
            "stamp": d.stamp,
            "via": match d.via {
                Via::Command => "command",
                Via::Script => "script",
                Via::Error => "error",
                Via::Cache => "cache",
            },
        })
    }

    fn headers_json(d: &Decision, style: crate::Style) -> serde_json::Value {
        d.headers(style)
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), serde_json::Value::from(v.to_str().unwrap())))
            .collect()
    }

    /// Every case of clients/conformance/block_cache.json (docs/clients.md,
    /// "Block cache") through this cache on a virtual monotonic clock: a
    /// `sent` step must miss, then its reply is decoded and recorded as sent
    /// at `at`; another must hit with exactly the decision and headers given.
    #[test]
    fn every_block_cache_vector() {
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../../conformance/block_cache.json")).unwrap();
        assert_eq!(vectors["schema"], 1);
        let mut steps = 0;
        for case in vectors["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let mut cache = BlockCache::new(case["capacity"].as_u64().unwrap() as usize);
            let mut hits = 0;
            for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
                let what = format!("{name} step {i}");
                let at = MS(step["at"].as_u64().unwrap());
                match step["op"].as_str().unwrap() {
                    "allow" => {
                        let mut request = Request::new(
                            step["key"].as_str().unwrap(),
                            MS(step["window"].as_u64().unwrap()),
                            step["limit"].as_u64().unwrap(),
                        )
                        .cost(step["cost"].as_u64().unwrap());
                        for tier in step["tiers"].as_array().unwrap() {
                            request = request.tier(MS(tier[0].as_u64().unwrap()), tier[1].as_u64().unwrap());
                        }
                        let found = cache.lookup(&request, at);
                        if step["sent"] == true {
                            assert_eq!(found, None, "{what}: must be sent");
                            let decided = Decision::from_reply(&value(&step["reply"]), &request, Via::Command).unwrap();
                            cache.record(&request, &decided, at);
                        } else {
                            let d = found.unwrap_or_else(|| panic!("{what}: must be answered by the cache"));
                            hits += 1;
                            assert_eq!(decision_json(&d), step["decision"], "{what}");
                            for (style, field) in [(crate::Style::Ietf, "ietf"), (crate::Style::Legacy, "legacy")] {
                                // Header names are case-insensitive: http's are lower case.
                                let expected: serde_json::Value = step["headers"][field]
                                    .as_object()
                                    .unwrap()
                                    .iter()
                                    .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                                    .collect();
                                assert_eq!(headers_json(&d, style), expected, "{what}: {field} headers");
                            }
                        }
                    }
                    "forget" => cache.forget(step["key"].as_str().unwrap()),
                    "size" => assert_eq!(
                        cache.stats().cache_entries as u64,
                        step["entries"].as_u64().unwrap(),
                        "{what}"
                    ),
                    other => panic!("{what}: unknown op {other}"),
                }
                steps += 1;
            }
            assert_eq!(cache.stats().cache_hits, hits, "{name}: hits counted");
        }
        assert!(steps >= 60, "{steps} steps");
    }

    #[test]
    fn a_hit_counts_down_and_the_deadline_drops_the_entry() {
        let mut cache = BlockCache::new(10);
        let request = minute("k");
        cache.record(&request, &rejected(&request, 2_000, 59_000), MS(1_000));
        let hit = cache.lookup(&request, MS(1_500) + Duration::from_micros(300)).unwrap();
        // 1,499.7 ms left rounds up; 500.3 ms passed rounds down.
        assert_eq!(
            (hit.allowed, hit.via, hit.remaining, hit.retry_after, hit.reset_after),
            (false, Via::Cache, 0, Some(MS(1_500)), MS(58_500))
        );
        // Never below 1 ms while it holds.
        assert_eq!(
            cache
                .lookup(&request, MS(3_000) - Duration::from_nanos(1))
                .unwrap()
                .retry_after,
            Some(MS(1))
        );
        assert_eq!(
            cache.stats(),
            Stats {
                cache_hits: 2,
                cache_entries: 1
            }
        );
        assert!(cache.lookup(&request, MS(3_000)).is_none());
        assert_eq!(
            cache.stats(),
            Stats {
                cache_hits: 2,
                cache_entries: 0
            }
        );
    }

    #[test]
    fn only_the_same_shape_with_a_cost_at_least_as_large_hits() {
        let mut cache = BlockCache::new(10);
        let request = minute("k").cost(3);
        cache.record(&request, &rejected(&request, 5_000, 5_000), MS(0));
        assert!(cache.lookup(&request.clone().cost(4), MS(1)).is_some());
        // Above the limit it can never fit: the server answers that, not the cache.
        assert!(cache.lookup(&request.clone().cost(11), MS(1)).is_none());
        let tiered = minute("t").tier(MS(3_600_000), 5).cost(3);
        cache.record(&tiered, &rejected(&tiered, 5_000, 5_000), MS(0));
        assert!(cache.lookup(&tiered.clone().cost(5), MS(1)).is_some());
        assert!(cache.lookup(&tiered.clone().cost(6), MS(1)).is_none());
        assert!(cache.lookup(&request.clone().cost(2), MS(1)).is_none());
        assert!(cache
            .lookup(&Request::new("k", MS(60_000), 11).cost(3), MS(1))
            .is_none());
        assert!(cache.lookup(&Request::new("k", MS(1_000), 10).cost(3), MS(1)).is_none());
        assert!(cache.lookup(&request.clone().tier(MS(3_600_000), 100), MS(1)).is_none());
        // A miss of another shape leaves the entry.
        assert!(cache.lookup(&request, MS(2)).is_some());
    }

    #[test]
    fn tiers_count_down_and_the_server_s_figures_stay() {
        let mut cache = BlockCache::new(10);
        let request = Request::new("k", MS(1_000), 2).tier(MS(60_000), 2);
        let reply = redis::parse_redis_value(b"*6\r\n:0\r\n:2\r\n:0\r\n:900\r\n:900\r\n*2\r\n*5\r\n:1000\r\n:2\r\n:1\r\n:0\r\n:500\r\n*5\r\n:60000\r\n:2\r\n:0\r\n:900\r\n:900\r\n").unwrap();
        let server = Decision::from_reply(&reply, &request, Via::Script).unwrap();
        cache.record(&request, &server, MS(10));
        let hit = cache.lookup(&request, MS(710)).unwrap();
        let tiers: Vec<_> = hit
            .tiers
            .iter()
            .map(|t| (t.window, t.limit, t.remaining, t.retry_after, t.reset_after))
            .collect();
        assert_eq!(
            tiers,
            [
                (MS(1_000), 2, 1, Some(MS(0)), MS(0)),
                (MS(60_000), 2, 0, Some(MS(200)), MS(200))
            ]
        );
        assert_eq!(
            (hit.tier, hit.window, hit.limit, hit.retry_after),
            (1, MS(60_000), 2, Some(MS(200)))
        );
    }

    #[test]
    fn admissions_never_fits_and_errors_are_not_held_and_an_admission_drops() {
        let mut cache = BlockCache::new(10);
        let request = minute("k");
        cache.record(&request, &admitted(&request), MS(0));
        let never = Decision {
            retry_after: None,
            cost_exceeds_limit: true,
            ..rejected(&request, 0, 0)
        };
        cache.record(&request, &never, MS(0));
        let error = Decision {
            via: Via::Error,
            ..rejected(&request, 100, 100)
        };
        cache.record(&request, &error, MS(0));
        assert_eq!(cache.stats().cache_entries, 0);
        cache.record(&request, &rejected(&request, 100, 100), MS(0));
        assert_eq!(cache.stats().cache_entries, 1);
        // Another cost was admitted: the window opened, the entry goes.
        cache.record(&request, &admitted(&request), MS(1));
        assert!(cache.lookup(&request, MS(2)).is_none());
        assert_eq!(cache.stats().cache_entries, 0);
    }

    #[test]
    fn a_rejection_sent_before_a_refund_is_not_held() {
        let mut cache = BlockCache::new(10);
        let request = minute("k");
        let sent = cache.forgets();
        // A refund of the key while the call was in flight: its window may
        // have opened after the server rejected the call.
        cache.forget("k");
        cache.record_since(&request, &rejected(&request, 1_000, 1_000), MS(0), sent);
        assert_eq!(cache.stats().cache_entries, 0);
        cache.record_since(&request, &rejected(&request, 1_000, 1_000), MS(1), cache.forgets());
        assert!(cache.lookup(&request, MS(2)).is_some());
    }

    #[test]
    fn the_least_recently_used_is_evicted_and_forget_keeps_the_list_whole() {
        let mut cache = BlockCache::new(3);
        for key in ["a", "b", "c"] {
            let r = minute(key);
            cache.record(&r, &rejected(&r, 1_000, 1_000), MS(0));
        }
        assert_eq!(order(&cache), ["c", "b", "a"]);
        // A hit on "a" makes it the newest: "b" is the least recently used.
        assert!(cache.lookup(&minute("a"), MS(1)).is_some());
        assert_eq!(order(&cache), ["a", "c", "b"]);
        let d = minute("d");
        cache.record(&d, &rejected(&d, 1_000, 1_000), MS(1));
        assert_eq!(order(&cache), ["d", "a", "c"]);
        assert!(cache.lookup(&minute("b"), MS(2)).is_none());
        // A replacement is a use too.
        let c = minute("c");
        cache.record(&c, &rejected(&c, 2_000, 2_000), MS(2));
        assert_eq!(order(&cache), ["c", "d", "a"]);
        // Removing from the middle, the ends and the last slot.
        for (key, left) in [("d", vec!["c", "a"]), ("a", vec!["c"]), ("x", vec!["c"]), ("c", vec![])] {
            cache.forget(key);
            assert_eq!(order(&cache), left);
        }
        for key in ["e", "f", "g", "h"] {
            let r = minute(key);
            cache.record(&r, &rejected(&r, 1_000, 1_000), MS(3));
        }
        cache.forget("f");
        assert_eq!(order(&cache), ["h", "g"]);
    }
}
