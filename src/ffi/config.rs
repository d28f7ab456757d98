//! Module configs (`CONFIG GET/SET xcloak.*`, Redis 7.0+ and Valkey) behind
//! safe Rust: a config is a `static` [`NumericConfig`] or [`EnumConfig`]
//! naming plain Rust `fn`s that read and write the setting; the server's
//! callbacks reach it through their private data (the static's address).

use std::ffi::{c_char, c_int, c_longlong, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

/// An integer config within `min..=max`.
pub struct NumericConfig {
    /// Its name after the module's (`max-limit`: `xcloak.max-limit`).
    pub name: &'static CStr,
    pub min: i64,
    pub max: i64,
    pub get: fn() -> i64,
    /// Stores a value; an error is the text `CONFIG SET` replies.
    pub set: fn(i64) -> Result<(), &'static CStr>,
}

/// A config that takes one of `choices` (name, value).
pub struct EnumConfig {
    pub name: &'static CStr,
    pub choices: &'static [(&'static CStr, i32)],
    pub get: fn() -> i32,
    pub set: fn(i32) -> Result<(), &'static CStr>,
}

/// Whether the server has module configs (Redis 6.2 has none).
pub fn supported() -> bool {
    // SAFETY: reading (copying) the function table the server filled in at load.
    let (numeric, enumerated, load) = unsafe {
        (
            raw::RedisModule_RegisterNumericConfig,
            raw::RedisModule_RegisterEnumConfig,
            raw::RedisModule_LoadConfigs,
        )
    };
    numeric.is_some() && enumerated.is_some() && load.is_some()
}

fn ok(status: c_int) -> bool {
    status == raw::REDISMODULE_OK as c_int
}

/// Registers `config` with `default`. From `OnLoad` only, where [`supported`].
pub fn register_numeric(ctx: *mut raw::RedisModuleCtx, config: &'static NumericConfig, default: i64) -> bool {
    // SAFETY: reading the function table the server filled in at load.
    let Some(register) = (unsafe { raw::RedisModule_RegisterNumericConfig }) else {
        return false;
    };
    // SAFETY: the load context, a NUL-terminated static name, and as private
    // data the static config the callbacks read.
    ok(unsafe {
        register(
            ctx,
            config.name.as_ptr(),
            default,
            raw::REDISMODULE_CONFIG_DEFAULT,
            config.min,
            config.max,
            Some(get_numeric),
            Some(set_numeric),
            None,
            config as *const NumericConfig as *mut c_void,
        )
    })
}

/// Registers `config` with `default` (one of its values). As `register_numeric`.
pub fn register_enum(ctx: *mut raw::RedisModuleCtx, config: &'static EnumConfig, default: i32) -> bool {
    // SAFETY: reading the function table the server filled in at load.
    let Some(register) = (unsafe { raw::RedisModule_RegisterEnumConfig }) else {
        return false;
    };
    let mut names: Vec<*const c_char> = config.choices.iter().map(|(name, _)| name.as_ptr()).collect();
    let values: Vec<c_int> = config.choices.iter().map(|&(_, value)| value).collect();
    // SAFETY: as in `register_numeric`; the server copies the names and values.
    ok(unsafe {
        register(
            ctx,
            config.name.as_ptr(),
            default,
            raw::REDISMODULE_CONFIG_DEFAULT,
            names.as_mut_ptr(),
            values.as_ptr(),
            names.len() as c_int,
            Some(get_enum),
            Some(set_enum),
            None,
            config as *const EnumConfig as *mut c_void,
        )
    })
}

/// Applies the module's configs from the config file or `MODULE LOADEX`
/// (each through its `set`); false if one was refused.
pub fn load(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: reading the function table, then the load context.
    unsafe { raw::RedisModule_LoadConfigs }.is_some_and(|load| ok(unsafe { load(ctx) }))
}

/// Runs a callback's body; a panic is an error, and goes no further.
fn guarded(body: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(raw::REDISMODULE_ERR as c_int)
}

/// The config a callback is for.
///
/// # Safety
/// `privdata` must be the private data registered with a `T`: a `&'static T`.
unsafe fn config_of<T>(privdata: *mut c_void) -> &'static T {
    // SAFETY: the caller's promise.
    unsafe { &*(privdata as *const T) }
}

/// Answers a `set`: OK, or ERR with `message` handed to the server (which frees it).
fn answer(outcome: Result<(), &'static CStr>, err: *mut *mut raw::RedisModuleString) -> c_int {
    let Err(message) = outcome else {
        return raw::REDISMODULE_OK as c_int;
    };
    if !err.is_null() {
        let text = message.to_bytes();
        // SAFETY: `err` is the server's slot for the error; it frees the string.
        unsafe {
            if let Some(create) = raw::RedisModule_CreateString {
                *err = create(std::ptr::null_mut(), text.as_ptr() as *const c_char, text.len());
            }
        }
    }
    raw::REDISMODULE_ERR as c_int
}

extern "C" fn get_numeric(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    // SAFETY: registered with a `&'static NumericConfig` (`register_numeric`).
    let config = unsafe { config_of::<NumericConfig>(privdata) };
    catch_unwind(config.get).unwrap_or(config.min)
}

extern "C" fn set_numeric(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: as in get_numeric.
    let config = unsafe { config_of::<NumericConfig>(privdata) };
    // The server enforces the bounds before calling this; checked again so
    // that no value outside them can ever be stored.
    if !(config.min..=config.max).contains(&value) {
        return raw::REDISMODULE_ERR as c_int;
    }
    guarded(|| answer((config.set)(value), err))
}

extern "C" fn get_enum(_name: *const c_char, privdata: *mut c_void) -> c_int {
    // SAFETY: registered with a `&'static EnumConfig` (`register_enum`).
    let config = unsafe { config_of::<EnumConfig>(privdata) };
    catch_unwind(config.get).unwrap_or_else(|_| config.choices.first().map_or(0, |&(_, value)| value))
}

extern "C" fn set_enum(
    _name: *const c_char,
    value: c_int,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: as in get_enum.
    let config = unsafe { config_of::<EnumConfig>(privdata) };
    guarded(|| answer((config.set)(value), err))
}
