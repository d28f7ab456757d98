//! The one file that touches keys: [`Log`] over a Redis sorted set, and the
//! replication of what a call changed.
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
//! when the trim removed something, `ZADD key t m1 t m2 ...` with the exact
//! members, and `PEXPIREAT key abs-ms`. Redis wraps them in MULTI/EXEC.

use std::ffi::c_int;
use std::os::raw::c_char;
use std::ptr;

use redis_module::raw;

use crate::window::Log;

/// Margin added to the window for the key's TTL (see `docs/design.md`).
pub const TTL_MARGIN_MS: i64 = 1000;

/// An admission leaves the key's expiry alone while it is still more than
/// `window + TTL_MARGIN_MS - TTL_REFRESH_SLACK_MS` away: a busy key re-arms
/// (and replicates `PEXPIREAT`) at most every 500 ms instead of on every
/// admission, and the TTL after an admission stays in (window + 500, window + 1000].
pub const TTL_REFRESH_SLACK_MS: i64 = 500;

/// Largest `k` stored in the compact integer form of a member.
const COMPACT_SLOTS: i64 = 1000;

/// Stamps enter members modulo this (their last 11 digits), see the file docs.
const STAMP_CYCLE_MS: i64 = 100_000_000_000;

/// Expired members `trim` collects in its single pass over the range.
const TRIM_BATCH: usize = 16;

/// Calls a function of the module API. Every one used here exists on all
/// supported servers (checked at load, see `lib.rs`).
macro_rules! api {
    ($name:ident) => {{
        // SAFETY: the API table is filled once, at load, before any call.
        #[allow(unused_unsafe)]
        let function = unsafe { raw::$name };
        function.expect(concat!(stringify!($name), " is missing"))
    }};
}
pub(crate) use api;

/// The first module API function this module calls that the server did not
/// provide, if any: `lib.rs` refuses to load then, so `api!` never fails.
pub fn missing_api() -> Option<&'static str> {
    macro_rules! first_missing {
        ($($name:ident),* $(,)?) => {{
            // SAFETY: reads the table the server filled in before OnLoad's body.
            $( if unsafe { raw::$name }.is_none() { return Some(stringify!($name)); } )*
            None
        }};
    }
    first_missing!(
        RedisModule_OpenKey, RedisModule_CloseKey, RedisModule_KeyType, RedisModule_ValueLength,
        RedisModule_ZsetFirstInScoreRange, RedisModule_ZsetLastInScoreRange,
        RedisModule_ZsetRangeEndReached, RedisModule_ZsetRangeStop, RedisModule_ZsetRangeNext,
        RedisModule_ZsetRangeCurrentElement, RedisModule_ZsetAdd, RedisModule_ZsetRem,
        RedisModule_DeleteKey, RedisModule_GetExpire, RedisModule_SetExpire, RedisModule_Replicate,
        RedisModule_NotifyKeyspaceEvent, RedisModule_CreateString, RedisModule_CreateStringFromLongLong,
        RedisModule_FreeString, RedisModule_StringPtrLen, RedisModule_Milliseconds,
        RedisModule_WrongArity, RedisModule_ReplyWithLongLong, RedisModule_ReplyWithArray,
        RedisModule_ReplyWithError,
    )
}

/// How a key was found when opened.
pub enum Opened {
    Ready(ZsetKey),
    WrongType,
}

/// An open key, closed on drop (also when unwinding from a panic).
pub struct ZsetKey {
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleKey,
    name: *mut raw::RedisModuleString,
    writable: bool,
    /// Entries removed by `trim`, and the cutoff used, for replication.
    trimmed: u64,
    cutoff_ms: i64,
    /// Members added by `record`, and their score, for replication. The
    /// first is held inline: an admission of cost 1 allocates nothing.
    first_added: Option<Owned>,
    more_added: Vec<Owned>,
    added_at_ms: i64,
}

impl Drop for ZsetKey {
    fn drop(&mut self) {
        // SAFETY: `key` came from OpenKey and is closed exactly once, here.
        unsafe { api!(RedisModule_CloseKey)(self.key) };
    }
}

impl ZsetKey {
    /// Opens `name` for reading, or for reading and writing.
    ///
    /// # Safety
    /// `ctx` and `name` must be the live context and an argument of the
    /// command being executed.
    pub unsafe fn open(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        writable: bool,
    ) -> Opened {
        let mode = if writable {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        let key = unsafe { api!(RedisModule_OpenKey)(ctx, name, mode as c_int) };
        let opened = ZsetKey {
            ctx,
            key,
            name,
            writable,
            trimmed: 0,
            cutoff_ms: 0,
            first_added: None,
            more_added: Vec::new(),
            added_at_ms: 0,
        };
        let key_type = unsafe { api!(RedisModule_KeyType)(key) } as isize;
        if key_type == raw::REDISMODULE_KEYTYPE_EMPTY || key_type == raw::REDISMODULE_KEYTYPE_ZSET {
            Opened::Ready(opened)
        } else {
            Opened::WrongType
        }
    }

    fn is_empty(&self) -> bool {
        (unsafe { api!(RedisModule_KeyType)(self.key) }) as isize == raw::REDISMODULE_KEYTYPE_EMPTY
    }

    /// Positions the range iterator on the first (or last) entry with a score
    /// in the range; false if there is none.
    fn seek(&self, min: f64, max: f64, min_exclusive: bool, first: bool) -> bool {
        if self.is_empty() {
            return false;
        }
        let seek = if first {
            api!(RedisModule_ZsetFirstInScoreRange)
        } else {
            api!(RedisModule_ZsetLastInScoreRange)
        };
        // SAFETY: the key is an open, non-empty sorted set.
        unsafe {
            seek(self.key, min, max, min_exclusive as c_int, 0) == raw::REDISMODULE_OK as c_int
                && api!(RedisModule_ZsetRangeEndReached)(self.key) == 0
        }
    }

    fn stop(&self) {
        unsafe { api!(RedisModule_ZsetRangeStop)(self.key) };
    }

    /// The member and score under the iterator. The member is freed by `Owned`.
    fn current(&self) -> (Owned, f64) {
        let mut score = 0.0;
        let member = unsafe { api!(RedisModule_ZsetRangeCurrentElement)(self.key, &mut score) };
        (Owned { ctx: self.ctx, string: member }, score)
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

    /// Ends a write call: after an admission, sets the key to expire
    /// `ttl_ms` after `server_ms`, unless it already expires more than
    /// `ttl_ms - TTL_REFRESH_SLACK_MS` from now (so an expiry is never
    /// shortened: a server clock that stepped back must not cut short entries
    /// stamped before the step); then replicates and notifies what changed.
    pub fn commit(&self, server_ms: i64, ttl_ms: i64) {
        let expire_at_ms = server_ms + ttl_ms;
        let ctx = self.ctx;
        let replicate = api!(RedisModule_Replicate);
        let notify = api!(RedisModule_NotifyKeyspaceEvent);
        // SAFETY: format strings match the arguments passed after them: "s" a
        // RedisModuleString, "c" a C string, "l" a long long, "v" an array and
        // its length. RedisModule_Replicate retains what it needs.
        unsafe {
            if self.trimmed > 0 {
                replicate(ctx, c"ZREMRANGEBYSCORE".as_ptr(), c"scl".as_ptr(), self.name, c"-inf".as_ptr(), self.cutoff_ms);
                notify(ctx, raw::NotifyEvent::ZSET.bits(), c"zremrangebyscore".as_ptr(), self.name);
                if self.is_empty() {
                    notify(ctx, raw::NotifyEvent::GENERIC.bits(), c"del".as_ptr(), self.name);
                }
            }
            if let Some(first) = &self.first_added {
                let extend = self.needs_expiry(ttl_ms);
                if extend {
                    self.expire_at(expire_at_ms);
                }
                if self.more_added.is_empty() {
                    // The common case, cost 1: no argument vector to build.
                    replicate(ctx, c"ZADD".as_ptr(), c"sls".as_ptr(), self.name, self.added_at_ms as std::ffi::c_longlong, first.string);
                } else {
                    let score = Owned::from_i64(ctx, self.added_at_ms);
                    let mut argv: Vec<*mut raw::RedisModuleString> = Vec::with_capacity((1 + self.more_added.len()) * 2);
                    for member in std::iter::once(first).chain(&self.more_added) {
                        argv.push(score.string);
                        argv.push(member.string);
                    }
                    replicate(ctx, c"ZADD".as_ptr(), c"sv".as_ptr(), self.name, argv.as_ptr(), argv.len());
                }
                notify(ctx, raw::NotifyEvent::ZSET.bits(), c"zadd".as_ptr(), self.name);
                if extend {
                    replicate(ctx, c"PEXPIREAT".as_ptr(), c"sl".as_ptr(), self.name, expire_at_ms);
                    notify(ctx, raw::NotifyEvent::GENERIC.bits(), c"expire".as_ptr(), self.name);
                }
            }
        }
    }

    /// Whether the key has no expiry, or one within `ttl_ms - TTL_REFRESH_SLACK_MS` from now.
    fn needs_expiry(&self, ttl_ms: i64) -> bool {
        // SAFETY: the key is open and holds a value.
        let remaining_ms = unsafe { api!(RedisModule_GetExpire)(self.key) };
        remaining_ms == raw::REDISMODULE_NO_EXPIRE as i64 || remaining_ms <= ttl_ms - TTL_REFRESH_SLACK_MS
    }

    fn expire_at(&self, expire_at_ms: i64) {
        // SAFETY: the key is open for writing and holds a value (just added to).
        unsafe {
            match raw::RedisModule_SetAbsExpire {
                Some(set_abs) => set_abs(self.key, expire_at_ms),
                None => api!(RedisModule_SetExpire)(
                    self.key,
                    (expire_at_ms - api!(RedisModule_Milliseconds)()).max(1),
                ),
            };
        }
    }
}

impl Log for ZsetKey {
    fn len(&self) -> u64 {
        unsafe { api!(RedisModule_ValueLength)(self.key) as u64 }
    }

    fn count_expired(&self, cutoff_ms: i64) -> u64 {
        if !self.seek(f64::NEG_INFINITY, cutoff_ms as f64, false, true) {
            return 0;
        }
        let mut count = 1;
        while unsafe { api!(RedisModule_ZsetRangeNext)(self.key) } != 0 {
            count += 1;
        }
        self.stop();
        count
    }

    fn trim(&mut self, cutoff_ms: i64) -> u64 {
        debug_assert!(self.writable);
        self.cutoff_ms = cutoff_ms;
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
            let next = unsafe { api!(RedisModule_ZsetRangeNext)(self.key) } != 0;
            if !next || collected == TRIM_BATCH {
                break next;
            }
        };
        self.stop();
        if !more && collected as u64 == self.len() || more && !self.seek(cutoff, f64::INFINITY, true, true) {
            // Nothing live left: drop the whole key at once.
            self.trimmed = self.len();
            unsafe { api!(RedisModule_DeleteKey)(self.key) };
            return self.trimmed;
        }
        if more {
            self.stop();
        }
        for member in expired.iter().flatten() {
            unsafe { api!(RedisModule_ZsetRem)(self.key, member.string, ptr::null_mut()) };
        }
        self.trimmed = collected as u64;
        // A long backlog (more than a batch expired at once): one at a time.
        while more && self.seek(f64::NEG_INFINITY, cutoff, false, true) {
            let (member, _) = self.current();
            self.stop();
            unsafe { api!(RedisModule_ZsetRem)(self.key, member.string, ptr::null_mut()) };
            self.trimmed += 1;
        }
        self.trimmed
    }

    fn nth_live(&self, cutoff_ms: i64, n: u64) -> Option<i64> {
        if n == 0 || !self.seek(cutoff_ms as f64, f64::INFINITY, true, true) {
            return None;
        }
        for _ in 1..n {
            if unsafe { api!(RedisModule_ZsetRangeNext)(self.key) } == 0 {
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
        debug_assert!(self.writable);
        self.added_at_ms = now_ms;
        let mut slot = self.next_slot(now_ms);
        let mut buffer = [0u8; 48];
        let mut added = 0;
        while added < cost {
            let member = Owned::from_bytes(self.ctx, format_member(&mut buffer, now_ms, slot));
            slot += 1;
            let mut flags = raw::REDISMODULE_ZADD_NX as c_int;
            // SAFETY: the key is open for writing and is empty or a sorted set;
            // the score is an integer below 2^53, never NaN.
            let status = unsafe { api!(RedisModule_ZsetAdd)(self.key, now_ms as f64, member.string, &mut flags) };
            if status != raw::REDISMODULE_OK as c_int {
                break;
            }
            // NOP: that member exists (another writer's); try the next slot.
            if flags & raw::REDISMODULE_ZADD_ADDED as c_int != 0 {
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
    }
}

/// A score as whole milliseconds. Entries written by this module or the script
/// are integers; a fractional score from another writer rounds up, so waits
/// are never reported shorter than they are.
fn score_ms(score: f64) -> i64 {
    score.ceil() as i64
}

/// A RedisModuleString this module created or was handed, freed on drop.
pub struct Owned {
    ctx: *mut raw::RedisModuleCtx,
    string: *mut raw::RedisModuleString,
}

impl Owned {
    fn from_bytes(ctx: *mut raw::RedisModuleCtx, bytes: &[u8]) -> Self {
        let string = unsafe { api!(RedisModule_CreateString)(ctx, bytes.as_ptr() as *const c_char, bytes.len()) };
        Owned { ctx, string }
    }

    fn from_i64(ctx: *mut raw::RedisModuleCtx, value: i64) -> Self {
        let string = unsafe { api!(RedisModule_CreateStringFromLongLong)(ctx, value) };
        Owned { ctx, string }
    }

    fn bytes(&self) -> &[u8] {
        bytes_of(self.string)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.string.is_null() {
            // SAFETY: created by this module (or handed over by the iterator,
            // which transfers ownership) and freed exactly once.
            unsafe { api!(RedisModule_FreeString)(self.ctx, self.string) };
        }
    }
}

/// The bytes of a RedisModuleString (valid while the string is).
pub fn bytes_of<'a>(string: *const raw::RedisModuleString) -> &'a [u8] {
    if string.is_null() {
        return &[];
    }
    let mut len = 0usize;
    // SAFETY: StringPtrLen returns a pointer to `len` bytes owned by `string`.
    unsafe {
        let data = api!(RedisModule_StringPtrLen)(string, &mut len);
        std::slice::from_raw_parts(data as *const u8, len)
    }
}

/// Writes the member of slot `k` at `now_ms` into `buffer` (by hand: this
/// runs on every admission, and `core::fmt` costs more than the rest of it).
pub fn format_member(buffer: &mut [u8; 48], now_ms: i64, k: i64) -> &[u8] {
    let stamp = now_ms.rem_euclid(STAMP_CYCLE_MS);
    let len = if k < COMPACT_SLOTS {
        write_decimal(&mut buffer[..], (stamp * COMPACT_SLOTS + k) as u64, 1)
    } else {
        let stamp = write_decimal(&mut buffer[..], stamp as u64, 1);
        buffer[stamp] = b':';
        stamp + 1 + write_decimal(&mut buffer[stamp + 1..], k as u64, 10)
    };
    &buffer[..len]
}

/// Writes `value` in decimal, zero-padded to `width` (<= 20) digits; returns the length.
fn write_decimal(out: &mut [u8], mut value: u64, width: usize) -> usize {
    let mut digits = [b'0'; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    let start = start.min(digits.len() - width);
    let len = digits.len() - start;
    out[..len].copy_from_slice(&digits[start..]);
    len
}

/// The slot `k` of a member written at `now_ms` by this module, if it is one.
pub fn member_slot(member: &[u8], now_ms: i64) -> Option<i64> {
    let stamp = now_ms.rem_euclid(STAMP_CYCLE_MS);
    if let Some(colon) = member.iter().position(|&b| b == b':') {
        let (head, slot) = (&member[..colon], &member[colon + 1..]);
        if crate::args::parse_i64(head)? != stamp || slot.is_empty() || !slot.iter().all(u8::is_ascii_digit) {
            return None;
        }
        return std::str::from_utf8(slot).ok()?.parse().ok();
    }
    let value = crate::args::parse_i64(member)?;
    (value >= 0 && value / COMPACT_SLOTS == stamp).then_some(value % COMPACT_SLOTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(now_ms: i64, k: i64) -> String {
        let mut buffer = [0u8; 48];
        String::from_utf8(format_member(&mut buffer, now_ms, k).to_vec()).unwrap()
    }

    #[test]
    fn members_round_trip() {
        for now_ms in [0, 1, 999, 1_732_941_234_567, crate::args::MAX_EXACT_MS] {
            for k in [0, 1, 998, 999, 1000, 1001, 123_456, 999_999_999] {
                let text = member(now_ms, k);
                assert_eq!(member_slot(text.as_bytes(), now_ms), Some(k), "{text}");
                assert_eq!(member_slot(text.as_bytes(), now_ms + 1), None, "{text} is not of now+1");
            }
        }
    }

    #[test]
    fn members_are_unique_across_stamps_and_slots() {
        let mut seen = std::collections::HashSet::new();
        let stamps = (0..50).chain(1_732_941_234_500..1_732_941_234_550).chain([99_999_999_999]);
        for now_ms in stamps {
            for k in (0..1005).chain([99_999, 100_000]) {
                assert!(seen.insert(member(now_ms, k)), "duplicate at {now_ms}/{k}");
            }
        }
    }

    #[test]
    fn members_sort_by_slot_within_a_stamp() {
        let now_ms = 1_732_941_234_567;
        let texts: Vec<String> = [0, 1, 10, 999, 1000, 1001, 9999, 10_000, 1_000_000].iter().map(|&k| member(now_ms, k)).collect();
        let mut sorted = texts.clone();
        sorted.sort();
        assert_eq!(texts, sorted, "the last member at a score must carry the largest slot");
    }

    #[test]
    fn the_scripts_members_are_not_ours() {
        assert_eq!(member_slot(b"1000-5", 1000), None);
        assert_eq!(member_slot(b"1000:", 1000), None);
        assert_eq!(member_slot(b"-1000", 1000), None);
    }

    #[test]
    fn members_are_the_stamps_last_11_digits_then_the_slot() {
        for now_ms in [0, 1, 9, 10, 999, 99_999_999_999, 100_000_000_000, 1_732_941_234_567, crate::args::MAX_EXACT_MS] {
            let stamp = now_ms % 100_000_000_000;
            for k in [0, 1, 9, 10, 999, 1000, 1001, 123_456, 999_999_999, 1_000_000_000, 12_345_678_901] {
                let expected = if k < 1000 { format!("{}", stamp * 1000 + k) } else { format!("{stamp}:{k:010}") };
                assert_eq!(member(now_ms, k), expected);
            }
        }
    }

    #[test]
    fn stamps_a_cycle_apart_share_members_and_nx_tells_them_apart() {
        // The price of 14 digits: the same member 10^11 ms (3.17 years) later.
        // Both can only be live together with a window over 3 years (or NOW
        // jumping by the cycle); ZADD NX then skips to the next free slot.
        assert_eq!(member(1, 5), member(100_000_000_001, 5));
        assert_eq!(member_slot(member(1, 5).as_bytes(), 100_000_000_001), Some(5));
    }

    #[test]
    fn compact_members_have_at_most_14_digits() {
        assert_eq!(member(1_732_941_234_567, 7), "32941234567007");
        for now_ms in [99_999_999_999, 1_799_999_999_999, crate::args::MAX_EXACT_MS] {
            assert!(member(now_ms, 999).len() <= 14, "{}", member(now_ms, 999));
        }
    }
}
