//! The `XCLOAK.*` command handlers: arguments -> window -> reply.
//!
//! Each handler is an `extern "C"` function registered with the server. Its
//! body runs under `catch_unwind`: a panic becomes an error reply and a log
//! line instead of unwinding into C (which would abort the server).

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use redis_module::raw;

use crate::config;
use crate::ffi::{self, bytes_of, reply_error, reply_i64, with_arguments, with_words, Key};
use crate::store::{self, compact, Form, Opened, Refusal, TTL_MARGIN_MS, WRONGTYPE};
use xcloak_core::args::{self, ArgError, Command};
use xcloak_core::effect::Effect;
use xcloak_core::window::{self, Decision};

/// Counters reported by `INFO xcloak`. Commands run on the main thread; the
/// atomics only make the statics safe to share.
pub static ADMITTED: AtomicU64 = AtomicU64::new(0);
pub static REJECTED: AtomicU64 = AtomicU64::new(0);
pub static PEEKS: AtomicU64 = AtomicU64::new(0);
pub static ERRORS: AtomicU64 = AtomicU64::new(0);
pub static CONVERTED: AtomicU64 = AtomicU64::new(0);
/// Entries removed by XCLOAK.REFUND.
pub static REFUNDED: AtomicU64 = AtomicU64::new(0);

/// `XCLOAK.ALLOW key window limit [TIER window limit]... [COST cost] [NOW unix-ms] [DETAILS] [STAMP]`
pub extern "C" fn allow(ctx: *mut raw::RedisModuleCtx, argv: *mut *mut raw::RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || execute(ctx, argv, argc, Command::Allow))
}

/// `XCLOAK.PEEK key window limit [TIER window limit]... [COST cost] [NOW unix-ms] [OLDEST]`
pub extern "C" fn peek(ctx: *mut raw::RedisModuleCtx, argv: *mut *mut raw::RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || execute(ctx, argv, argc, Command::Peek))
}

/// `XCLOAK.REFUND key stamp [COST cost]`: removes up to `cost` entries
/// stamped exactly `stamp` and replies how many went.
pub extern "C" fn refund(ctx: *mut raw::RedisModuleCtx, argv: *mut *mut raw::RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || {
        with_arguments(argv, argc, |strings| {
            let request = match with_words(strings, args::parse_refund) {
                Ok(request) => request,
                Err(error) => return refuse(ctx, error),
            };
            let Some(mut key) = open_window(ctx, strings[1], true) else {
                return;
            };
            let removed = window::refund(&mut key, request.stamp_ms, request.cost);
            key.commit_removal();
            drop(key);
            REFUNDED.fetch_add(removed, Relaxed);
            reply_i64(ctx, removed as i64);
        })
    })
}

/// `XCLOAK.CONVERT key ZSET|COMPACT`
pub extern "C" fn convert(ctx: *mut raw::RedisModuleCtx, argv: *mut *mut raw::RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || {
        with_arguments(argv, argc, |strings| {
            let to = match with_words(strings, args::parse_convert) {
                Ok(to) => to,
                Err(error) => return refuse(ctx, error),
            };
            if to == Form::Compact && !compact::registered() {
                let message = "compact storage is not enabled: load the module with STORAGE compact";
                return refuse(ctx, ArgError::Invalid(message.to_string()));
            }
            match store::convert(ctx, strings[1], to, config::max_limit() as u64) {
                Ok(converted) => {
                    CONVERTED.fetch_add(converted as u64, Relaxed);
                    reply_i64(ctx, converted as i64);
                }
                Err(Refusal::WrongType) => wrong_type(ctx),
                Err(Refusal::Invalid(message)) => refuse(ctx, ArgError::Invalid(format!("cannot convert: {message}"))),
            }
        })
    })
}

/// `XCLOAK.APPLY key <effect> [<canonical bytes>]`: the compact form's
/// replicated effect (`store/effect.rs`), refused from clients.
pub extern "C" fn apply(ctx: *mut raw::RedisModuleCtx, argv: *mut *mut raw::RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || {
        if !compact::from_primary_or_aof(ctx) {
            let message = "XCLOAK.APPLY is internal: it replays the compact form's effects from a primary or the AOF";
            return refuse(ctx, ArgError::Invalid(message.to_string()));
        }
        with_arguments(argv, argc, |strings| apply_effect(ctx, strings))
    })
}

/// XCLOAK.APPLY's body, once it is known to come from a primary or the AOF.
fn apply_effect(ctx: *mut raw::RedisModuleCtx, strings: &[&raw::RedisModuleString]) {
    if !(3..=4).contains(&strings.len()) {
        return refuse(ctx, ArgError::Arity);
    }
    if !compact::registered() {
        // An AOF or a primary holding compact windows, and this server
        // loaded without STORAGE compact: say so where operators look.
        let message = format!(
                "XCLOAK.APPLY for key '{}' ignored: compact storage is not enabled on this server (load the module with STORAGE compact)",
                String::from_utf8_lossy(bytes_of(strings[1]))
            );
        redis_module::logging::log_warning(format!("xcloak: {message}"));
        return refuse(ctx, ArgError::Invalid(message));
    }
    let effect = match Effect::parse(bytes_of(strings[2])) {
        Ok(effect) => effect,
        Err(message) => return refuse(ctx, ArgError::Invalid(message)),
    };
    let key = Key::open(ctx, strings[1], true);
    match compact::apply(key, &effect, strings.get(3).map(|&s| bytes_of(s))) {
        Ok(()) => {
            // An effect is replicated only when it changed the window: a
            // reader tracking it on this replica is told.
            ffi::signal_modified(ctx, ffi::raw_of(strings[1]));
            ffi::replicate_verbatim(ctx);
            ffi::reply_simple_string(ctx, c"OK");
        }
        Err(message) if message.starts_with("WRONGTYPE") => wrong_type(ctx),
        Err(message) => refuse(ctx, ArgError::Invalid(message)),
    }
}

/// Opens the window at `name` (an argument of this call), or answers
/// WRONGTYPE, counted as an error, and gives `None`.
fn open_window(ctx: *mut raw::RedisModuleCtx, name: &raw::RedisModuleString, writable: bool) -> Option<store::Window> {
    match store::open(ctx, name, writable) {
        Opened::Ready(window) => Some(window),
        Opened::WrongType => {
            wrong_type(ctx);
            None
        }
    }
}

/// Answers WRONGTYPE, counted as an error like every other (`INFO xcloak`).
fn wrong_type(ctx: *mut raw::RedisModuleCtx) {
    ERRORS.fetch_add(1, Relaxed);
    reply_error(ctx, WRONGTYPE);
}

/// Answers a bad call with its error, counting it.
fn refuse(ctx: *mut raw::RedisModuleCtx, error: ArgError) {
    ERRORS.fetch_add(1, Relaxed);
    match error {
        ArgError::Arity => ffi::reply_wrong_arity(ctx),
        ArgError::Invalid(message) => reply_error(ctx, &format!("ERR {message}")),
    }
}

fn guarded(ctx: *mut raw::RedisModuleCtx, body: impl FnOnce()) -> c_int {
    if catch_unwind(AssertUnwindSafe(body)).is_err() {
        ERRORS.fetch_add(1, Relaxed);
        reply_error(ctx, "ERR xcloak internal error, see the server log");
    }
    raw::REDISMODULE_OK as c_int
}

fn execute(ctx: *mut raw::RedisModuleCtx, argv: *mut *mut raw::RedisModuleString, argc: c_int, command: Command) {
    with_arguments(argv, argc, |strings| execute_on(ctx, strings, command))
}

fn execute_on(ctx: *mut raw::RedisModuleCtx, strings: &[&raw::RedisModuleString], command: Command) {
    let parsed = with_words(strings, |words| args::parse(command, words, config::max_limit()));
    let request = match parsed {
        Ok(request) => request,
        Err(error) => return refuse(ctx, error),
    };

    // Test-only trigger (never in a default build): proves a panic becomes an error reply.
    #[cfg(feature = "fault-injection")]
    if bytes_of(strings[1]) == b"xcloak:fault:panic" {
        panic!("xcloak fault injection: deliberate panic on key xcloak:fault:panic");
    }

    let server_ms = ffi::milliseconds();
    let now_ms = request.now_ms.unwrap_or(server_ms);
    let Some(mut key) = open_window(ctx, strings[1], command == Command::Allow) else {
        return;
    };

    match command {
        Command::Allow => {
            let ttl_ms = request.tiers.longest_window_ms() + TTL_MARGIN_MS;
            // STAMP: the millisecond this admission recorded, the handle a
            // refund names; -1 for a rejection.
            let stamp = |allowed: bool| request.stamp.then_some(if allowed { now_ms } else { -1 });
            if request.details {
                let decision = window::allow(&mut key, &request, now_ms, true);
                key.commit(server_ms, ttl_ms);
                drop(key);
                count(decision.allowed);
                reply_details(ctx, &decision, request.tiers.is_tiered(), stamp(decision.allowed));
            } else {
                let allowed = window::admit(&mut key, &request, now_ms);
                key.commit(server_ms, ttl_ms);
                drop(key);
                count(allowed);
                reply_i64(ctx, stamp(allowed).unwrap_or(allowed as i64));
            }
        }
        Command::Peek => {
            let decision = window::peek(&key, &request, now_ms);
            // OLDEST: where the binding tier's window starts, -1 if it is empty.
            let oldest = request
                .oldest
                .then(|| window::oldest_live(&key, decision.binding().window_ms, now_ms).unwrap_or(-1));
            drop(key);
            PEEKS.fetch_add(1, Relaxed);
            reply_details(ctx, &decision, request.tiers.is_tiered(), oldest);
        }
    }
}

fn count(allowed: bool) {
    let counter = if allowed { &ADMITTED } else { &REJECTED };
    counter.fetch_add(1, Relaxed);
}

/// The details reply: allowed, then the binding tier's limit, remaining,
/// retry_after_ms, reset_after_ms; with `TIER`, a sixth element holding
/// `[window, limit, remaining, retry_after_ms, reset_after_ms]` per tier;
/// last, `last`: with ALLOW's `STAMP` the stamp, with PEEK's `OLDEST` the
/// oldest live entry's stamp.
fn reply_details(ctx: *mut raw::RedisModuleCtx, decision: &Decision, tiered: bool, last: Option<i64>) {
    let binding = decision.binding();
    let fields = [
        decision.allowed as i64,
        binding.limit,
        binding.remaining,
        binding.retry_after_ms,
        binding.reset_after_ms,
    ];
    // One array of as many fields as it announces.
    ffi::reply_array(ctx, fields.len() + tiered as usize + last.is_some() as usize);
    for field in fields {
        reply_i64(ctx, field);
    }
    if tiered {
        ffi::reply_array(ctx, decision.tiers().len());
        for tier in decision.tiers() {
            let fields = [
                tier.window_ms,
                tier.limit,
                tier.remaining,
                tier.retry_after_ms,
                tier.reset_after_ms,
            ];
            ffi::reply_array(ctx, fields.len());
            for field in fields {
                reply_i64(ctx, field);
            }
        }
    }
    if let Some(last) = last {
        reply_i64(ctx, last);
    }
}
