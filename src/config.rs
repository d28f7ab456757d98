//! The module's one setting, the upper bound of `limit`.
//!
//! Two ways to set it, one value:
//! - the load argument `loadmodule xcloak.so MAX-LIMIT n` (every server);
//! - the module config `xcloak.max-limit` (Redis 7.0+, Valkey): `CONFIG GET`,
//!   `CONFIG SET`, a line `xcloak.max-limit n` in the config file, and
//!   `MODULE LOADEX ... CONFIG xcloak.max-limit n`.
//!
//! `MAX-LIMIT` sets the config's *default*; a value from the config file or
//! `MODULE LOADEX ... CONFIG` is applied after it and wins. That is the order
//! `CONFIG REWRITE` needs: it persists a `CONFIG SET` as a config-file line,
//! which must still hold after a restart with the same `loadmodule` line.
//! Both refuse the load when out of range, with a log line.

use std::ffi::{c_char, c_int, c_longlong, c_void};
use std::sync::atomic::Ordering::Relaxed;

use redis_module::raw;

use crate::args::{parse_i64, DEFAULT_MAX_LIMIT, MAX_LIMIT_CEILING};
use crate::commands::MAX_LIMIT;

/// Smallest value `MAX-LIMIT` / `xcloak.max-limit` may take.
pub const MAX_LIMIT_FLOOR: i64 = 1;

/// Parses the load arguments: `[MAX-LIMIT n]`. Returns the bound to start
/// from (the default when absent).
pub fn parse_load_arguments(args: &[&[u8]]) -> Result<i64, String> {
    let mut max_limit = DEFAULT_MAX_LIMIT;
    let mut seen = false;
    let mut rest = args.iter();
    while let Some(name) = rest.next() {
        if !name.eq_ignore_ascii_case(b"MAX-LIMIT") {
            return Err(format!(
                "unknown load argument '{}' (expected MAX-LIMIT n)",
                String::from_utf8_lossy(name)
            ));
        }
        if seen {
            return Err("MAX-LIMIT is given more than once".to_string());
        }
        seen = true;
        max_limit = rest
            .next()
            .and_then(|value| parse_i64(value))
            .filter(|value| (MAX_LIMIT_FLOOR..=MAX_LIMIT_CEILING).contains(value))
            .ok_or_else(|| format!("MAX-LIMIT must be an integer from {MAX_LIMIT_FLOOR} to {MAX_LIMIT_CEILING}"))?;
    }
    Ok(max_limit)
}

/// What [`register`] did on this server.
#[derive(Debug, PartialEq, Eq)]
pub enum Registered {
    /// `xcloak.max-limit` exists and the config file's value (if any) is applied.
    ModuleConfig,
    /// The server has no module configs (Redis 6.2): `MAX-LIMIT` only.
    LoadArgumentOnly,
}

/// Sets the bound from the load argument, then registers `xcloak.max-limit`
/// with that as its default and applies config-file values. Call from
/// `OnLoad`, after the commands are created.
pub fn register(ctx: *mut raw::RedisModuleCtx, max_limit_from_args: i64) -> Result<Registered, String> {
    MAX_LIMIT.store(max_limit_from_args, Relaxed);
    // SAFETY: reading the function pointers the server filled in at load.
    let (register_numeric, load_configs) =
        unsafe { (raw::RedisModule_RegisterNumericConfig, raw::RedisModule_LoadConfigs) };
    let (Some(register_numeric), Some(load_configs)) = (register_numeric, load_configs) else {
        return Ok(Registered::LoadArgumentOnly);
    };
    // SAFETY: `ctx` is the load context; the name is a NUL-terminated static;
    // the callbacks only touch the MAX_LIMIT atomic.
    let status = unsafe {
        register_numeric(
            ctx,
            c"max-limit".as_ptr(),
            max_limit_from_args,
            raw::REDISMODULE_CONFIG_DEFAULT,
            MAX_LIMIT_FLOOR,
            MAX_LIMIT_CEILING,
            Some(get_max_limit),
            Some(set_max_limit),
            None,
            std::ptr::null_mut(),
        )
    };
    if status != raw::REDISMODULE_OK as c_int {
        return Err("could not register the config xcloak.max-limit".to_string());
    }
    // SAFETY: as above. Applies `xcloak.max-limit` from the config file or
    // MODULE LOADEX; the server has checked it against FLOOR..=CEILING.
    if unsafe { load_configs(ctx) } != raw::REDISMODULE_OK as c_int {
        return Err(format!(
            "xcloak.max-limit from the configuration is invalid (must be an integer from \
             {MAX_LIMIT_FLOOR} to {MAX_LIMIT_CEILING})"
        ));
    }
    Ok(Registered::ModuleConfig)
}

extern "C" fn get_max_limit(_name: *const c_char, _privdata: *mut c_void) -> c_longlong {
    MAX_LIMIT.load(Relaxed)
}

extern "C" fn set_max_limit(
    _name: *const c_char,
    value: c_longlong,
    _privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // The server enforces the registered bounds before calling this; checked
    // again so that no value outside them can ever be stored.
    if !(MAX_LIMIT_FLOOR..=MAX_LIMIT_CEILING).contains(&value) {
        return raw::REDISMODULE_ERR as c_int;
    }
    MAX_LIMIT.store(value, Relaxed);
    raw::REDISMODULE_OK as c_int
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<i64, String> {
        let words: Vec<&[u8]> = line.split_whitespace().map(str::as_bytes).collect();
        parse_load_arguments(&words)
    }

    #[test]
    fn load_arguments() {
        assert_eq!(parse(""), Ok(DEFAULT_MAX_LIMIT));
        assert_eq!(parse("MAX-LIMIT 5"), Ok(5));
        assert_eq!(parse("max-limit 1000000000"), Ok(1_000_000_000));
        assert_eq!(parse("MAX-LIMIT 1"), Ok(1));
        let range = "MAX-LIMIT must be an integer from 1 to 1000000000";
        for bad in ["MAX-LIMIT", "MAX-LIMIT 0", "MAX-LIMIT 1000000001", "MAX-LIMIT -1", "MAX-LIMIT 1e3", "MAX-LIMIT +5"] {
            assert_eq!(parse(bad), Err(range.to_string()), "{bad}");
        }
        assert_eq!(parse("MAX-LIMIT 5 MAX-LIMIT 6"), Err("MAX-LIMIT is given more than once".into()));
        assert_eq!(parse("LIMIT 5"), Err("unknown load argument 'LIMIT' (expected MAX-LIMIT n)".into()));
    }
}
