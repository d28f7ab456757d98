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

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use redis_module::raw;

use crate::ffi::{api, bytes_of, Key};
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

/// A callback from C: a panic is logged and goes no further.
fn quietly(body: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(body)).is_err() {
        redis_module::logging::log_warning("xcloak: internal error in an event callback, see above");
    }
}

/// Subscribes to what the server offers (call from `OnLoad`, after the
/// compact type is registered) and warns if the eviction policy can evict windows.
pub fn subscribe(ctx: *mut raw::RedisModuleCtx) {
    let key_event = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_KEY,
        dataver: 1,
    };
    // SAFETY: reading the API table, then calling it with the load context.
    unsafe {
        let supported = raw::RedisModule_IsSubEventSupported
            .is_some_and(|supported| supported(key_event, raw::REDISMODULE_SUBEVENT_KEY_EVICTED) != 0);
        let subscribed = supported
            && raw::RedisModule_SubscribeToServerEvent
                .is_some_and(|subscribe| subscribe(ctx, key_event, Some(key_removed)) == raw::REDISMODULE_OK as c_int);
        COUNTS_ZSETS.store(subscribed, Relaxed);
        if !subscribed {
            if let Some(subscribe) = raw::RedisModule_SubscribeToKeyspaceEvents {
                subscribe(ctx, raw::REDISMODULE_NOTIFY_EVICTED, Some(evicted_event));
            }
        }
        let config_event = raw::RedisModuleEvent {
            id: raw::REDISMODULE_EVENT_CONFIG,
            dataver: 1,
        };
        let config_supported = raw::RedisModule_IsSubEventSupported
            .is_some_and(|supported| supported(config_event, raw::REDISMODULE_SUBEVENT_CONFIG_CHANGE) != 0);
        if config_supported {
            if let Some(subscribe) = raw::RedisModule_SubscribeToServerEvent {
                subscribe(ctx, config_event, Some(config_changed));
            }
        }
    }
    warn_about_policy(ctx, "at load");
}

/// The `Key` event (7.2+): the key is still in place, readable.
extern "C" fn key_removed(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_KEY_EVICTED || data.is_null() {
        return;
    }
    quietly(|| {
        // SAFETY: for this event the server passes a RedisModuleKeyInfoV1
        // whose key is open for reading during the callback; the stand-in
        // `Key` is never dropped, so it closes nothing.
        let raw_key = unsafe { (*(data as *mut raw::RedisModuleKeyInfoV1)).key };
        if raw_key.is_null() {
            return;
        }
        // SAFETY: the key is open for reading during this callback, and
        // used only within it.
        let key = unsafe { Key::lent(ctx, raw_key) };
        if compact::is_ours(&key) || zset::is_window(&key) {
            window_evicted(ctx);
        }
    });
}

/// The compact type's `unlink` callback: remembers the key for the
/// `evicted` event that follows an eviction (6.2 and 7.0 only).
pub extern "C" fn compact_unlinked(key: *mut raw::RedisModuleString, _value: *const c_void) {
    if COUNTS_ZSETS.load(Relaxed) || key.is_null() {
        return;
    }
    quietly(|| {
        if let Ok(mut last) = LAST_UNLINKED.lock() {
            last.0 = key as usize;
            last.1.clear();
            // SAFETY: the server passes a live key name for the callback.
            last.1.extend_from_slice(unsafe { key.as_ref() }.map_or(&[], bytes_of));
        }
    });
}

/// The `evicted` keyspace event (6.2 and 7.0): the key is gone; it was a
/// compact window if the compact type's `unlink` named it just before.
extern "C" fn evicted_event(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    quietly(|| {
        let matched = LAST_UNLINKED.lock().is_ok_and(|mut last| {
            // SAFETY: the server passes a live key name for the callback.
            let matched = last.0 == key as usize && last.1 == unsafe { key.as_ref() }.map_or(&[][..], bytes_of);
            last.0 = 0;
            matched
        });
        if matched {
            window_evicted(ctx);
        }
    });
    raw::REDISMODULE_OK as c_int
}

/// Counts one evicted window and logs it: the first at once, then at most
/// one line a minute with the number since the last line.
fn window_evicted(ctx: *mut raw::RedisModuleCtx) {
    let total = EVICTED.fetch_add(1, Relaxed) + 1;
    UNLOGGED.fetch_add(1, Relaxed);
    // SAFETY: a plain read of the server clock.
    let now_ms = unsafe { api!(RedisModule_Milliseconds)() };
    let since_last_ms = now_ms - LAST_LOG_MS.load(Relaxed);
    if LAST_LOG_MS.load(Relaxed) == 0 || since_last_ms >= LOG_INTERVAL_MS {
        log_evictions(now_ms, total);
    } else if !TIMER_PENDING.swap(true, Relaxed) {
        // SAFETY: a timer on the main thread; its callback takes no data.
        let created = unsafe {
            raw::RedisModule_CreateTimer.map(|create| {
                create(
                    ctx,
                    (LOG_INTERVAL_MS - since_last_ms) as raw::mstime_t,
                    Some(log_pending),
                    std::ptr::null_mut(),
                )
            })
        };
        if created.is_none() {
            TIMER_PENDING.store(false, Relaxed);
        }
    }
}

extern "C" fn log_pending(_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    quietly(|| {
        TIMER_PENDING.store(false, Relaxed);
        // SAFETY: a plain read of the server clock.
        let now_ms = unsafe { api!(RedisModule_Milliseconds)() };
        log_evictions(now_ms, EVICTED.load(Relaxed));
    });
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
extern "C" fn config_changed(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    if data.is_null() {
        return;
    }
    quietly(|| {
        // SAFETY: for this event the server passes a RedisModuleConfigChangeV1
        // listing `num_changes` NUL-terminated names.
        let change = unsafe { &*(data as *const raw::RedisModuleConfigChangeV1) };
        let names = unsafe { std::slice::from_raw_parts(change.config_names, change.num_changes as usize) };
        if names
            .iter()
            .any(|&name| !name.is_null() && unsafe { CStr::from_ptr(name) }.to_bytes() == b"maxmemory-policy")
        {
            warn_about_policy(ctx, "after CONFIG SET");
        }
    });
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
    // SAFETY: the server info is read and freed here; the field's text is
    // copied before the free.
    unsafe {
        let (get, field, free) = (
            raw::RedisModule_GetServerInfo?,
            raw::RedisModule_ServerInfoGetFieldC?,
            raw::RedisModule_FreeServerInfo?,
        );
        let info = get(ctx, c"memory".as_ptr());
        if info.is_null() {
            return None;
        }
        let value = field(info, c"maxmemory_policy".as_ptr());
        let policy = (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned());
        free(ctx, info);
        policy
    }
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
