//! What the server tells the module outside its commands, behind safe Rust:
//! server events (a key evicted, a config changed), keyspace events, timers,
//! and reads of `INFO`. Each subscription takes a plain Rust `fn` with safe
//! arguments; the `extern "C"` trampolines here convert the server's
//! pointers and run it under [`quietly`] (no panic crosses into C).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use redis_module::raw;

use super::Key;

/// The hooks subscribed (once, at load).
static KEY_EVICTED: OnceLock<fn(*mut raw::RedisModuleCtx, &Key)> = OnceLock::new();
static EVICTED_NOTIFICATION: OnceLock<fn(*mut raw::RedisModuleCtx, &raw::RedisModuleString)> = OnceLock::new();
static CONFIG_CHANGED: OnceLock<fn(*mut raw::RedisModuleCtx, &[&CStr])> = OnceLock::new();

/// A callback from C: a panic is logged and goes no further.
fn quietly(body: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(body)).is_err() {
        redis_module::logging::log_warning("xcloak: internal error in an event callback, see above");
    }
}

fn event(id: u64) -> raw::RedisModuleEvent {
    raw::RedisModuleEvent { id, dataver: 1 }
}

/// Whether the server fires `subevent` of the server event `id`.
fn supported(id: u64, subevent: u64) -> bool {
    // SAFETY: reading the function table, then calling a function of it that
    // takes plain values.
    unsafe { raw::RedisModule_IsSubEventSupported }.is_some_and(|is| unsafe { is(event(id), subevent) } != 0)
}

/// Subscribes `hook` to the `Key` server event's `EVICTED` subevent (Redis
/// 7.2+, Valkey), which names the key while it is still readable: `hook`
/// gets it open for reading. False where the server has no such event.
/// From `OnLoad` only (`ctx` its context).
pub fn subscribe_key_evicted(ctx: *mut raw::RedisModuleCtx, hook: fn(*mut raw::RedisModuleCtx, &Key)) -> bool {
    if !supported(raw::REDISMODULE_EVENT_KEY, raw::REDISMODULE_SUBEVENT_KEY_EVICTED) {
        return false;
    }
    let _ = KEY_EVICTED.set(hook);
    // SAFETY: reading the function table, then subscribing with the load
    // context and a static callback.
    unsafe { raw::RedisModule_SubscribeToServerEvent }.is_some_and(|subscribe| {
        // SAFETY: as above.
        unsafe { subscribe(ctx, event(raw::REDISMODULE_EVENT_KEY), Some(key_event)) == raw::REDISMODULE_OK as c_int }
    })
}

extern "C" fn key_event(
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
        // whose key is open for reading during the callback.
        let raw_key = unsafe { (*(data as *mut raw::RedisModuleKeyInfoV1)).key };
        let Some(hook) = KEY_EVICTED.get().filter(|_| !raw_key.is_null()) else {
            return;
        };
        // SAFETY: the key is open for reading during this callback, and the
        // lent `Key` lives only within it (and closes nothing).
        let key = unsafe { Key::lent(ctx, raw_key) };
        hook(ctx, &key);
    });
}

/// Subscribes `hook` to the `evicted` keyspace event (every server; on 6.2
/// and 7.0 it fires after the key is gone): `hook` gets the key's name.
/// From `OnLoad` only.
pub fn subscribe_evicted_notification(
    ctx: *mut raw::RedisModuleCtx,
    hook: fn(*mut raw::RedisModuleCtx, &raw::RedisModuleString),
) {
    let _ = EVICTED_NOTIFICATION.set(hook);
    // SAFETY: reading the function table, then subscribing with the load
    // context and a static callback.
    if let Some(subscribe) = unsafe { raw::RedisModule_SubscribeToKeyspaceEvents } {
        // SAFETY: as above.
        unsafe { subscribe(ctx, raw::REDISMODULE_NOTIFY_EVICTED, Some(evicted_notification)) };
    }
}

extern "C" fn evicted_notification(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    quietly(|| {
        // SAFETY: the server passes a live key name (or null) for the callback.
        if let (Some(hook), Some(key)) = (EVICTED_NOTIFICATION.get(), unsafe { key.as_ref() }) {
            hook(ctx, key);
        }
    });
    raw::REDISMODULE_OK as c_int
}

/// Subscribes `hook` to `CONFIG SET` (7.0+): it gets the names of the
/// configs that changed. Nothing where the server has no such event.
/// From `OnLoad` only.
pub fn subscribe_config_changes(ctx: *mut raw::RedisModuleCtx, hook: fn(*mut raw::RedisModuleCtx, &[&CStr])) {
    if !supported(raw::REDISMODULE_EVENT_CONFIG, raw::REDISMODULE_SUBEVENT_CONFIG_CHANGE) {
        return;
    }
    let _ = CONFIG_CHANGED.set(hook);
    // SAFETY: reading the function table, then subscribing with the load
    // context and a static callback.
    if let Some(subscribe) = unsafe { raw::RedisModule_SubscribeToServerEvent } {
        // SAFETY: as above.
        unsafe { subscribe(ctx, event(raw::REDISMODULE_EVENT_CONFIG), Some(config_event)) };
    }
}

extern "C" fn config_event(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    if data.is_null() {
        return;
    }
    quietly(|| {
        let Some(hook) = CONFIG_CHANGED.get() else { return };
        // SAFETY: for this event the server passes a RedisModuleConfigChangeV1
        // listing `num_changes` NUL-terminated names, live for the callback.
        let change = unsafe { &*(data as *const raw::RedisModuleConfigChangeV1) };
        // SAFETY: as above: `num_changes` pointers at `config_names`.
        let pointers = unsafe { std::slice::from_raw_parts(change.config_names, change.num_changes as usize) };
        let names: Vec<&CStr> = pointers
            .iter()
            .filter(|name| !name.is_null())
            // SAFETY: as above: each non-null name is NUL-terminated.
            .map(|&name| unsafe { CStr::from_ptr(name) })
            .collect();
        hook(ctx, &names);
    });
}

/// Calls `callback` once, `delay_ms` from now, on the main thread; false
/// if the server could not create the timer.
pub fn create_timer(ctx: *mut raw::RedisModuleCtx, delay_ms: i64, callback: fn()) -> bool {
    // SAFETY: reading the function table, then creating a timer with the
    // context of the executing callback; its data is `callback` itself.
    unsafe { raw::RedisModule_CreateTimer }.is_some_and(|create| {
        // SAFETY: as above.
        unsafe {
            create(
                ctx,
                delay_ms as raw::mstime_t,
                Some(timer_fired),
                callback as *mut c_void,
            )
        };
        true
    })
}

extern "C" fn timer_fired(_ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    // SAFETY: `data` is the `fn()` `create_timer` was given, cast to a pointer
    // (the same size on every platform the server runs on).
    let callback = unsafe { std::mem::transmute::<*mut c_void, fn()>(data) };
    quietly(callback);
}

/// The text of `field` in the `INFO` section `section`, if the server has it.
pub fn server_info_field(ctx: *mut raw::RedisModuleCtx, section: &CStr, field: &CStr) -> Option<String> {
    // SAFETY: reading the function table the server filled in at load.
    let (get, get_field, free) = unsafe {
        (
            raw::RedisModule_GetServerInfo?,
            raw::RedisModule_ServerInfoGetFieldC?,
            raw::RedisModule_FreeServerInfo?,
        )
    };
    // SAFETY: the context of the executing callback; the info is freed below.
    let info = unsafe { get(ctx, section.as_ptr()) };
    if info.is_null() {
        return None;
    }
    // SAFETY: a live info; the field's text is copied before the free, once.
    unsafe {
        let value = get_field(info, field.as_ptr());
        let text = (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned());
        free(ctx, info);
        text
    }
}
