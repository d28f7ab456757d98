//! The sorted-set form of a window: [`Log`] over a Redis sorted set, and the
//! effects it replicates. The members are written and read by
//! `xcloak_core::member`.
//!
//! Layout (shared with the article's script and `src/lua/`): one sorted set per
//! limited identity, score = admission time in ms, one member per unit of cost.
//! Members are unique without any auxiliary key. With `s = t mod 10^11` (the
//! stamp's last 11 digits: a cycle of 3.17 years), the `k`-th entry admitted at
//! millisecond `t` is the integer `s * 1000 + k` while `k < 1000`, and
//! `"{s}:{k:010}"` beyond. The integer has at most 14 digits: a listpack stores
//! it as an 8-byte integer, and a skiplist's string of it fits the allocator's
//! 16-byte class (a 16-digit one takes 24 bytes: 13% more memory per entry in
//! large windows). Both forms sort by `k` among entries of equal score, so the
//! last entry at `t` tells the next free `k` in O(log n). Every add uses NX,
//! so a member that exists anyway is skipped, never overwritten: another
//! writer's, or (only with a window over 3 years, or a `NOW` jumping by a
//! multiple of the cycle) an entry of a stamp 10^11 ms away.
//!
//! Effects, not the command, are replicated: `ZREMRANGEBYSCORE key -inf cutoff`
//! when the trim removed something, `ZREM key m1 m2 ...` with the exact
//! members a refund removed, `ZADD key t m1 t m2 ...` with the exact members
//! added, and `PEXPIREAT key abs-ms`. Redis wraps them in MULTI/EXEC.

use redis_module::raw;

use xcloak_core::member::{format_member, member_slot};
use xcloak_core::window::Log;

use super::Changes;
use crate::ffi::{Key, Owned};

/// Expired members `trim` collects in its single pass over the range.
const TRIM_BATCH: usize = 16;

/// Score/member pairs per replicated `ZADD` when a whole window is written.
const ZADD_BATCH: usize = 512;

/// A window held in a sorted set, open for one call.
pub struct ZsetLog {
    pub key: Key,
    pub changes: Changes,
    /// Members added by `record`, for replication. The first is held
    /// inline: an admission of cost 1 allocates nothing.
    first_added: Option<Owned>,
    more_added: Vec<Owned>,
    /// Members removed by `remove_at` (a refund), for replication.
    removed: Vec<Owned>,
}

impl ZsetLog {
    pub fn new(key: Key) -> ZsetLog {
        ZsetLog {
            key,
            changes: Changes::default(),
            first_added: None,
            more_added: Vec::new(),
            removed: Vec::new(),
        }
    }

    fn ctx(&self) -> *mut raw::RedisModuleCtx {
        self.key.ctx()
    }

    /// Positions the range iterator on the first (or last) entry with a score
    /// in the range; false if there is none.
    fn seek(&self, min: f64, max: f64, min_exclusive: bool, first: bool) -> bool {
        seek(&self.key, min, max, min_exclusive, first)
    }

    fn stop(&self) {
        self.key.zset_stop();
    }

    /// The member and score under the iterator. The member is freed by `Owned`.
    fn current(&self) -> (Owned, f64) {
        self.key.zset_current()
    }

    /// The next free `k` for a member at `now_ms`: one past the last entry
    /// there in this module's format, or 0.
    fn next_slot(&self, now_ms: i64) -> i64 {
        let at = now_ms as f64;
        if !self.seek(at, at, false, false) {
            return 0;
        }
        let (member, _) = self.current();
        self.stop();
        member_slot(member.bytes(), now_ms).map_or(0, |k| k + 1)
    }

    /// Replicates the call's changes: `ZREMRANGEBYSCORE key -inf cutoff`
    /// after a trim, `ZREM key m1 m2 ...` with the exact members a refund
    /// removed, `ZADD key t m1 t m2 ...` with the exact members added, and
    /// `PEXPIREAT key ms` when the expiry is re-armed.
    pub fn replicate_changes(&self, expire_at_ms: Option<i64>) {
        if self.changes.trimmed > 0 {
            self.key.replicate_zremrangebyscore(self.changes.cutoff_ms);
        }
        if !self.removed.is_empty() {
            self.key
                .replicate_strings(c"ZREM", &self.removed.iter().collect::<Vec<_>>());
        }
        if let Some(first) = &self.first_added {
            let at_ms = self.changes.added_at_ms;
            if self.more_added.is_empty() {
                // The common case, cost 1: no argument vector to build.
                self.key.replicate_zadd_one(at_ms, first);
            } else {
                let members: Vec<&Owned> = std::iter::once(first).chain(&self.more_added).collect();
                replicate_zadd(&self.key, at_ms, &members);
            }
        }
        if let Some(expire_at_ms) = expire_at_ms {
            self.key.replicate_pexpireat(expire_at_ms);
        }
    }
}

/// Replicates `ZADD key at m1 at m2 ...` for `members`, all scored `at_ms`.
fn replicate_zadd(key: &Key, at_ms: i64, members: &[&Owned]) {
    let score = Owned::from_i64(key.ctx(), at_ms);
    let mut argv: Vec<&Owned> = Vec::with_capacity(members.len() * 2);
    for &member in members {
        argv.push(&score);
        argv.push(member);
    }
    key.replicate_strings(c"ZADD", &argv);
}

fn seek(key: &Key, min: f64, max: f64, min_exclusive: bool, first: bool) -> bool {
    !key.is_empty() && key.zset_seek(min, max, min_exclusive, first)
}

/// Every entry of the sorted set at `key` as runs `(stamp_ms, count)`,
/// oldest first; refused if a score is not a stamp (0 to 2^53 - 1).
pub fn read_runs(key: &Key) -> Result<Vec<(i64, u64)>, String> {
    let mut runs: Vec<(i64, u64)> = Vec::new();
    if !seek(key, f64::NEG_INFINITY, f64::INFINITY, false, true) {
        return Ok(runs);
    }
    let result = loop {
        let (member, score) = key.zset_current();
        drop(member);
        if !(0.0..=xcloak_core::args::MAX_EXACT_MS as f64).contains(&score) {
            break Err(format!(
                "the sorted set holds a score ({score}) that is not a stamp from 0 to {}",
                xcloak_core::args::MAX_EXACT_MS
            ));
        }
        let stamp_ms = score_ms(score);
        match runs.last_mut() {
            Some((last_ms, count)) if *last_ms == stamp_ms => *count += 1,
            _ => runs.push((stamp_ms, 1)),
        }
        if !key.zset_next() {
            break Ok(runs);
        }
    };
    key.zset_stop();
    result
}

/// Writes `runs` into the empty `key` as a sorted set, with this module's
/// members (`k` = 0, 1, ... at each stamp), and replicates the `ZADD`s.
pub fn write_runs(key: &Key, runs: &[(i64, u64)]) {
    let mut buffer = [0u8; 48];
    for &(stamp_ms, count) in runs {
        let mut pending: Vec<Owned> = Vec::new();
        for k in 0..count as i64 {
            let member = Owned::from_bytes(key.ctx(), format_member(&mut buffer, stamp_ms, k));
            key.zset_add_nx(stamp_ms as f64, &member);
            pending.push(member);
            if pending.len() == ZADD_BATCH {
                replicate_zadd(key, stamp_ms, &pending.iter().collect::<Vec<_>>());
                pending.clear();
            }
        }
        if !pending.is_empty() {
            replicate_zadd(key, stamp_ms, &pending.iter().collect::<Vec<_>>());
        }
    }
}

impl Log for ZsetLog {
    fn len(&self) -> u64 {
        self.key.value_length()
    }

    fn count_expired(&self, cutoff_ms: i64) -> u64 {
        if !self.seek(f64::NEG_INFINITY, cutoff_ms as f64, false, true) {
            return 0;
        }
        let mut count = 1;
        while self.key.zset_next() {
            count += 1;
        }
        self.stop();
        count
    }

    fn trim(&mut self, cutoff_ms: i64) -> u64 {
        self.changes.cutoff_ms = cutoff_ms;
        let cutoff = cutoff_ms as f64;
        if !self.seek(f64::NEG_INFINITY, cutoff, false, true) {
            return 0;
        }
        // One pass over the expired range collects up to TRIM_BATCH members
        // (the API forbids removing while iterating); a steady window sheds
        // one or two entries per call.
        let mut expired: [Option<Owned>; TRIM_BATCH] = [const { None }; TRIM_BATCH];
        let mut collected = 0;
        let more = loop {
            expired[collected] = Some(self.current().0);
            collected += 1;
            let next = self.key.zset_next();
            if !next || collected == TRIM_BATCH {
                break next;
            }
        };
        self.stop();
        if !more && collected as u64 == self.len() || more && !self.seek(cutoff, f64::INFINITY, true, true) {
            // Nothing live left: drop the whole key at once.
            self.changes.trimmed = self.len();
            self.key.delete();
            return self.changes.trimmed;
        }
        if more {
            self.stop();
        }
        for member in expired.iter().flatten() {
            self.key.zset_rem(member);
        }
        self.changes.trimmed = collected as u64;
        // A long backlog (more than a batch expired at once): one at a time.
        while more && self.seek(f64::NEG_INFINITY, cutoff, false, true) {
            let (member, _) = self.current();
            self.stop();
            self.key.zset_rem(&member);
            self.changes.trimmed += 1;
        }
        self.changes.trimmed
    }

    fn nth_live(&self, cutoff_ms: i64, n: u64) -> Option<i64> {
        if n == 0 || !self.seek(cutoff_ms as f64, f64::INFINITY, true, true) {
            return None;
        }
        for _ in 1..n {
            if !self.key.zset_next() {
                self.stop();
                return None;
            }
        }
        let (_, score) = self.current();
        self.stop();
        Some(score_ms(score))
    }

    fn newest(&self) -> Option<i64> {
        if !self.seek(f64::NEG_INFINITY, f64::INFINITY, false, false) {
            return None;
        }
        let (_, score) = self.current();
        self.stop();
        Some(score_ms(score))
    }

    fn record(&mut self, now_ms: i64, cost: u64) {
        self.changes.added_at_ms = now_ms;
        let mut slot = self.next_slot(now_ms);
        let mut buffer = [0u8; 48];
        let mut added = 0;
        while added < cost {
            let member = Owned::from_bytes(self.ctx(), format_member(&mut buffer, now_ms, slot));
            slot += 1;
            // The key is empty or a sorted set; the score is an integer
            // below 2^53, never NaN.
            let Some(was_added) = self.key.zset_add_nx(now_ms as f64, &member) else {
                break;
            };
            // Not added: that member exists (another writer's); try the next slot.
            if was_added {
                match self.first_added {
                    None => self.first_added = Some(member),
                    Some(_) => {
                        if self.more_added.is_empty() {
                            self.more_added.reserve(cost as usize - 1);
                        }
                        self.more_added.push(member);
                    }
                }
                added += 1;
            }
        }
        self.changes.added += added;
    }

    /// Removes up to `count` members scored exactly `stamp_ms`, the last
    /// ones first (the highest slots: the next free slot stays one past the
    /// last entry there), keeping them for replication.
    fn remove_at(&mut self, stamp_ms: i64, count: u64) -> u64 {
        let at = stamp_ms as f64;
        if count == 0 || !self.seek(at, at, false, false) {
            return 0;
        }
        // Collected first: the API forbids removing while iterating.
        let mut members: Vec<Owned> = Vec::new();
        loop {
            members.push(self.current().0);
            if members.len() as u64 == count || !self.key.zset_prev() {
                break;
            }
        }
        self.stop();
        for member in &members {
            self.key.zset_rem(member);
        }
        if self.len() == 0 {
            self.key.delete(); // an empty window leaves no key (whatever the server did already)
        }
        let removed = members.len() as u64;
        self.changes.removed += removed;
        self.changes.removed_at_ms = stamp_ms;
        self.removed.extend(members);
        removed
    }
}

/// A score as whole milliseconds. Entries written by this module or the script
/// are integers; a fractional score from another writer rounds up, so waits
/// are never reported shorter than they are.
fn score_ms(score: f64) -> i64 {
    score.ceil() as i64
}

/// Whether the open `key` is a sorted set whose first entry is one this
/// module writes: its member is the one `format_member` gives its score
/// (`eviction.rs` asks, for a key the server lends it).
pub fn is_window(key: &Key) -> bool {
    if key.key_type() != raw::REDISMODULE_KEYTYPE_ZSET || !key.zset_seek(f64::NEG_INFINITY, f64::INFINITY, false, true)
    {
        key.zset_stop();
        return false;
    }
    let (member, score) = key.zset_current();
    let window = !member.is_null()
        && score.fract() == 0.0
        && score.abs() < 9.0e15
        && member_slot(member.bytes(), score as i64).is_some();
    drop(member);
    key.zset_stop();
    window
}
