//! The module's two settings: the upper bound of `limit`, and the storage
//! form of the windows calls create.
//!
//! Two ways to set each, one value:
//! - the load arguments `loadmodule xcloak.so [MAX-LIMIT n] [STORAGE zset|compact]`
//!   (every server);
//! - the module configs `xcloak.max-limit` and `xcloak.storage` (Redis 7.0+,
//!   Valkey): `CONFIG GET`, `CONFIG SET`, a line in the config file, and
//!   `MODULE LOADEX ... CONFIG name value`.
//!
//! A load argument sets the config's *default*; a value from the config file
//! or `MODULE LOADEX ... CONFIG` is applied after it and wins. That is the
//! order `CONFIG REWRITE` needs: it persists a `CONFIG SET` as a config-file
//! line, which must still hold after a restart with the same `loadmodule`
//! line. Both refuse the load when out of range, with a log line.
//!
//! `STORAGE compact` is what registers the compact form's data type, so
//! `xcloak.storage compact` is refused on a server loaded without it (the
//! type can't be registered after load).

use std::ffi::CStr;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use redis_module::raw;

use crate::ffi::config::{self as module_config, EnumConfig, NumericConfig};
use crate::store::{self, compact};
use xcloak_core::args::{parse_i64, Storage, DEFAULT_MAX_LIMIT, MAX_LIMIT_CEILING, MAX_LIMIT_FLOOR};

/// Upper bound of `limit`, set at load time (`MAX-LIMIT`) or by CONFIG SET:
/// this file owns it, the commands read it with [`max_limit`].
static MAX_LIMIT: AtomicI64 = AtomicI64::new(DEFAULT_MAX_LIMIT);

/// The configured upper bound of `limit`.
pub fn max_limit() -> i64 {
    MAX_LIMIT.load(Relaxed)
}

/// The load arguments, with their defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadArguments {
    pub max_limit: i64,
    pub storage: Storage,
}

/// Parses the load arguments: `[MAX-LIMIT n] [STORAGE zset|compact]`, in any order.
pub fn parse_load_arguments(args: &[&[u8]]) -> Result<LoadArguments, String> {
    let mut parsed = LoadArguments {
        max_limit: DEFAULT_MAX_LIMIT,
        storage: Storage::Zset,
    };
    let (mut seen_max_limit, mut seen_storage) = (false, false);
    let mut rest = args.iter();
    while let Some(name) = rest.next() {
        let (seen, label) = if name.eq_ignore_ascii_case(b"MAX-LIMIT") {
            (&mut seen_max_limit, "MAX-LIMIT")
        } else if name.eq_ignore_ascii_case(b"STORAGE") {
            (&mut seen_storage, "STORAGE")
        } else {
            return Err(format!(
                "unknown load argument '{}' (expected MAX-LIMIT n or STORAGE zset|compact)",
                String::from_utf8_lossy(name)
            ));
        };
        if std::mem::replace(seen, true) {
            return Err(format!("{label} is given more than once"));
        }
        let value = rest.next();
        if label == "STORAGE" {
            parsed.storage = value
                .and_then(|value| Storage::parse(value))
                .ok_or_else(|| "STORAGE must be zset or compact".to_string())?;
        } else {
            parsed.max_limit = value
                .and_then(|value| parse_i64(value))
                .filter(|value| (MAX_LIMIT_FLOOR..=MAX_LIMIT_CEILING).contains(value))
                .ok_or_else(|| format!("MAX-LIMIT must be an integer from {MAX_LIMIT_FLOOR} to {MAX_LIMIT_CEILING}"))?;
        }
    }
    Ok(parsed)
}

/// What [`register`] did on this server.
#[derive(Debug, PartialEq, Eq)]
pub enum Registered {
    /// `xcloak.max-limit` exists and the config file's value (if any) is applied.
    ModuleConfig,
    /// The server has no module configs (Redis 6.2): `MAX-LIMIT` only.
    LoadArgumentOnly,
}

/// `xcloak.max-limit`.
static MAX_LIMIT_CONFIG: NumericConfig = NumericConfig {
    name: c"max-limit",
    min: MAX_LIMIT_FLOOR,
    max: MAX_LIMIT_CEILING,
    get: max_limit,
    set: set_max_limit,
};

/// `xcloak.storage`.
static STORAGE_CONFIG: EnumConfig = EnumConfig {
    name: c"storage",
    choices: &[(c"zset", Storage::Zset as i32), (c"compact", Storage::Compact as i32)],
    get: get_storage,
    set: set_storage,
};

/// Applies the load arguments, then registers `xcloak.max-limit` and
/// `xcloak.storage` with them as defaults and applies config-file values.
/// Call from `OnLoad`, after the commands are created (and the compact type,
/// if `STORAGE compact`).
pub fn register(ctx: *mut raw::RedisModuleCtx, from_args: LoadArguments) -> Result<Registered, String> {
    MAX_LIMIT.store(from_args.max_limit, Relaxed);
    store::set_creation_form(from_args.storage);
    if !module_config::supported() {
        return Ok(Registered::LoadArgumentOnly);
    }
    if !module_config::register_numeric(ctx, &MAX_LIMIT_CONFIG, from_args.max_limit) {
        return Err("could not register the config xcloak.max-limit".to_string());
    }
    if !module_config::register_enum(ctx, &STORAGE_CONFIG, from_args.storage as i32) {
        return Err("could not register the config xcloak.storage".to_string());
    }
    // Applies `xcloak.*` from the config file or MODULE LOADEX; the server
    // has checked them against their ranges, and `set_storage` refuses
    // `compact` without the type (its message is logged).
    if !module_config::load(ctx) {
        return Err(format!(
            "xcloak.max-limit or xcloak.storage from the configuration is invalid (max-limit: an integer \
             from {MAX_LIMIT_FLOOR} to {MAX_LIMIT_CEILING}; storage: zset, or compact with the load argument STORAGE compact)"
        ));
    }
    Ok(Registered::ModuleConfig)
}

/// Stores `xcloak.max-limit` (the border has checked it against the bounds).
fn set_max_limit(value: i64) -> Result<(), &'static CStr> {
    MAX_LIMIT.store(value, Relaxed);
    Ok(())
}

fn get_storage() -> i32 {
    store::creation_form() as i32
}

/// The error `CONFIG SET xcloak.storage compact` gets without `STORAGE compact`.
pub const STORAGE_NEEDS_LOAD_ARGUMENT: &CStr =
    c"compact storage needs the module loaded with STORAGE compact (loadmodule ... STORAGE compact): the data type is registered only at load";

fn set_storage(value: i32) -> Result<(), &'static CStr> {
    let storage = if value == Storage::Compact as i32 {
        Storage::Compact
    } else {
        Storage::Zset
    };
    if storage == Storage::Compact && !compact::registered() {
        return Err(STORAGE_NEEDS_LOAD_ARGUMENT);
    }
    store::set_creation_form(storage);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<i64, String> {
        parse_all(line).map(|parsed| parsed.max_limit)
    }

    fn parse_all(line: &str) -> Result<LoadArguments, String> {
        let words: Vec<&[u8]> = line.split_whitespace().map(str::as_bytes).collect();
        parse_load_arguments(&words)
    }

    #[test]
    fn storage_load_argument() {
        assert_eq!(parse_all("").unwrap().storage, Storage::Zset);
        assert_eq!(parse_all("STORAGE compact").unwrap().storage, Storage::Compact);
        let both = parse_all("storage ZSET MAX-LIMIT 7").unwrap();
        assert_eq!(
            both,
            LoadArguments {
                max_limit: 7,
                storage: Storage::Zset
            }
        );
        for bad in ["STORAGE", "STORAGE list", "STORAGE 1"] {
            assert_eq!(parse_all(bad), Err("STORAGE must be zset or compact".into()), "{bad}");
        }
        assert_eq!(
            parse_all("STORAGE zset STORAGE compact"),
            Err("STORAGE is given more than once".into())
        );
    }

    #[test]
    fn load_arguments() {
        assert_eq!(parse(""), Ok(DEFAULT_MAX_LIMIT));
        assert_eq!(parse("MAX-LIMIT 5"), Ok(5));
        assert_eq!(parse("max-limit 1000000000"), Ok(1_000_000_000));
        assert_eq!(parse("MAX-LIMIT 1"), Ok(1));
        let range = "MAX-LIMIT must be an integer from 1 to 1000000000";
        for bad in [
            "MAX-LIMIT",
            "MAX-LIMIT 0",
            "MAX-LIMIT 1000000001",
            "MAX-LIMIT -1",
            "MAX-LIMIT 1e3",
            "MAX-LIMIT +5",
        ] {
            assert_eq!(parse(bad), Err(range.to_string()), "{bad}");
        }
        assert_eq!(
            parse("MAX-LIMIT 5 MAX-LIMIT 6"),
            Err("MAX-LIMIT is given more than once".into())
        );
        assert_eq!(
            parse("LIMIT 5"),
            Err("unknown load argument 'LIMIT' (expected MAX-LIMIT n or STORAGE zset|compact)".into())
        );
    }
}
