//! Telling the operator about eviction. An evicted window is a reset: the
//! identity it limited starts again with its full limit. So the module counts
//! the windows the server evicts (`INFO xcloak`: `xcloak_evicted`), logs them
//! (at most one line a minute), and names an eviction policy that can evict
//! windows in the log at load and whenever `CONFIG SET` changes it (7.0+).
//!
//! How a key is recognised as a window once the server has chosen to evict it
//! depends on what the server tells a module, and when:
//! - Redis 7.2+ and Valkey fire the `Key` server event (subevent `EVICTED`)
//!   while the key is still readable. A compact key is a window by its type;
//!   a sorted set is one when its first entry's member is the member this
//!   module (or the Lua fallback) writes for that entry's score
//!   (`zset::member_slot`), which no other writer's sorted set matches by chance.
//! - Redis 6.2 and 7.0 fire only the `evicted` keyspace event, after the key
//!   is gone. The compact type's `unlink` callback, which the server calls
//!   while deleting it, just before the event, names the key; a sorted set
//!   can't be told from any other there, so it is not counted
//!   (`xcloak_evicted_forms:compact`).
//!
//! Replicas never evict (they apply the primary's `DEL`): each node counts
//! what it evicted itself.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use redis_module::raw;

use crate::ffi::{self, bytes_of, events, Key};
use crate::store::{compact, zset};

/// Windows evicted since load (`xcloak_evicted`).
pub static EVICTED: AtomicU64 = AtomicU64::new(0);

/// Whether evicted sorted-set windows are counted too (the `Key` event exists).
static COUNTS_ZSETS: AtomicBool = AtomicBool::new(false);

/// The forms `xcloak_evicted` counts on this server.
pub fn counted_forms() -> &'static CStr {
    if COUNTS_ZSETS.load(Relaxed) {
        c"zset,compact"
    } else {
        c"compact"
    }
}

/// At most one eviction line per this many milliseconds.
const LOG_INTERVAL_MS: i64 = 60_000;
/// When the last eviction line was written (server ms), 0 before the first.
static LAST_LOG_MS: AtomicI64 = AtomicI64::new(0);
/// Evictions not yet in a log line, and whether a timer will write them.
static UNLOGGED: AtomicU64 = AtomicU64::new(0);
static TIMER_PENDING: AtomicBool = AtomicBool::new(false);

/// The compact key the server unlinked last (6.2 and 7.0): the address of
/// the key object and its name. Eviction passes the same object to `unlink`
/// and then to the `evicted` event, so both must match.
static LAST_UNLINKED: Mutex<(usize, Vec<u8>)> = Mutex::new((0, Vec::new()));

/// Subscribes to what the server offers (call from `OnLoad`, after the
/// compact type is registered) and warns if the eviction policy can evict windows.
pub fn subscribe(ctx: *mut raw::RedisModuleCtx) {
    let subscribed = events::subscribe_key_evicted(ctx, key_evicted);
    COUNTS_ZSETS.store(subscribed, Relaxed);
    if !subscribed {
        events::subscribe_evicted_notification(ctx, evicted_notification);
    }
    events::subscribe_config_changes(ctx, config_changed);
    warn_about_policy(ctx, "at load");
}

/// The `Key` event's `EVICTED` (7.2+): the key is still in place, readable.
fn key_evicted(ctx: *mut raw::RedisModuleCtx, key: &Key) {
    if compact::is_ours(key) || zset::is_window(key) {
        window_evicted(ctx);
    }
}

/// The compact type's `unlink` callback: remembers the key for the
/// `evicted` event that follows an eviction (6.2 and 7.0 only).
pub fn compact_unlinked(key: &raw::RedisModuleString) {
    if COUNTS_ZSETS.load(Relaxed) {
        return;
    }
    if let Ok(mut last) = LAST_UNLINKED.lock() {
        last.0 = std::ptr::from_ref(key) as usize;
        last.1.clear();
        last.1.extend_from_slice(bytes_of(key));
    }
}

/// The `evicted` keyspace event (6.2 and 7.0): the key is gone; it was a
/// compact window if the compact type's `unlink` named it just before.
fn evicted_notification(ctx: *mut raw::RedisModuleCtx, key: &raw::RedisModuleString) {
    let matched = LAST_UNLINKED.lock().is_ok_and(|mut last| {
        let matched = last.0 == std::ptr::from_ref(key) as usize && last.1 == bytes_of(key);
        last.0 = 0;
        matched
    });
    if matched {
        window_evicted(ctx);
    }
}

/// Counts one evicted window and logs it: the first at once, then at most
/// one line a minute with the number since the last line.
fn window_evicted(ctx: *mut raw::RedisModuleCtx) {
    let total = EVICTED.fetch_add(1, Relaxed) + 1;
    UNLOGGED.fetch_add(1, Relaxed);
    let now_ms = ffi::milliseconds();
    let since_last_ms = now_ms - LAST_LOG_MS.load(Relaxed);
    if LAST_LOG_MS.load(Relaxed) == 0 || since_last_ms >= LOG_INTERVAL_MS {
        log_evictions(now_ms, total);
    } else if !TIMER_PENDING.swap(true, Relaxed)
        && !events::create_timer(ctx, LOG_INTERVAL_MS - since_last_ms, log_pending)
    {
        TIMER_PENDING.store(false, Relaxed);
    }
}

fn log_pending() {
    TIMER_PENDING.store(false, Relaxed);
    log_evictions(ffi::milliseconds(), EVICTED.load(Relaxed));
}

fn log_evictions(now_ms: i64, total: u64) {
    let count = UNLOGGED.swap(0, Relaxed);
    if count == 0 {
        return;
    }
    let first = LAST_LOG_MS.swap(now_ms, Relaxed) == 0;
    let what = if count == 1 {
        "1 rate-limit window was".to_string()
    } else {
        format!("{count} rate-limit windows were")
    };
    let when = if first {
        String::new()
    } else {
        " in the last minute".to_string()
    };
    redis_module::logging::log_warning(format!(
        "xcloak: {what} evicted{when} ({total} since load, INFO xcloak xcloak_evicted): each identity whose \
         window was evicted starts again with its full limit. Give the server more maxmemory, or run \
         maxmemory-policy noeviction (docs/operations.md#eviction)"
    ));
}

/// `CONFIG SET` (7.0+): warns again if the eviction policy changed to one
/// that evicts windows.
fn config_changed(ctx: *mut raw::RedisModuleCtx, names: &[&CStr]) {
    if names.iter().any(|name| name.to_bytes() == b"maxmemory-policy") {
        warn_about_policy(ctx, "after CONFIG SET");
    }
}

/// What the log says about a `maxmemory-policy`, if it can evict windows.
pub fn policy_warning(policy: &str) -> Option<String> {
    let reason = if policy.starts_with("allkeys-") {
        "it may evict any key, rate-limit windows included"
    } else if policy.starts_with("volatile-") {
        "windows always carry a TTL, so it may evict them"
    } else {
        return None;
    };
    Some(format!(
        "maxmemory-policy is {policy}: {reason}. An evicted window is a reset (its identity starts again with \
         its full limit). Run noeviction where windows must hold (ALLOW then fails with -OOM and the client's \
         error policy decides), or size maxmemory so that nothing is evicted; INFO xcloak counts evicted windows \
         (xcloak_evicted)"
    ))
}

fn warn_about_policy(ctx: *mut raw::RedisModuleCtx, when: &str) {
    let Some(policy) = maxmemory_policy(ctx) else { return };
    if let Some(warning) = policy_warning(&policy) {
        redis_module::logging::log_warning(format!("xcloak: {when}: {warning}"));
    }
}

/// `maxmemory_policy` from `INFO memory`.
fn maxmemory_policy(ctx: *mut raw::RedisModuleCtx) -> Option<String> {
    events::server_info_field(ctx, c"memory", c"maxmemory_policy")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_that_evict_windows_are_named() {
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            let warning = policy_warning(policy).unwrap_or_else(|| panic!("{policy} can evict windows"));
            assert!(
                warning.starts_with(&format!("maxmemory-policy is {policy}: ")),
                "{warning}"
            );
        }
        assert!(policy_warning("allkeys-lru").unwrap().contains("any key"));
        assert!(policy_warning("volatile-ttl").unwrap().contains("TTL"));
        assert_eq!(policy_warning("noeviction"), None);
        assert_eq!(policy_warning(""), None);
    }
}
