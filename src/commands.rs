//! The `XCLOAK.*` command handlers: arguments -> window -> reply.
//!
//! Each handler is an `extern "C"` function registered with the server. Its
//! body runs under `catch_unwind`: a panic becomes an error reply and a log
//! line instead of unwinding into C (which would abort the server).

use std::ffi::{c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use redis_module::raw;

use crate::args::{self, ArgError, Command};
use crate::window::{self, Decision};
use crate::zset::{api, bytes_of, Opened, ZsetKey, TTL_MARGIN_MS};

/// Upper bound of `limit`, set at load time (`MAX-LIMIT`) or by CONFIG SET.
pub static MAX_LIMIT: AtomicI64 = AtomicI64::new(args::DEFAULT_MAX_LIMIT);

/// Counters reported by `INFO xcloak`. Commands run on the main thread; the
/// atomics only make the statics safe to share.
pub static ADMITTED: AtomicU64 = AtomicU64::new(0);
pub static REJECTED: AtomicU64 = AtomicU64::new(0);
pub static PEEKS: AtomicU64 = AtomicU64::new(0);
pub static ERRORS: AtomicU64 = AtomicU64::new(0);

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
/// The most arguments a valid call has: name key window limit, 15 times
/// TIER window limit, COST c NOW t DETAILS.
const MAX_VALID_ARGC: usize = 4 + (args::MAX_TIERS - 1) * 3 + 5;

/// `XCLOAK.ALLOW key window limit [TIER window limit]... [COST cost] [NOW unix-ms] [DETAILS]`
pub extern "C" fn allow(ctx: *mut raw::RedisModuleCtx, argv: *mut *mut raw::RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || execute(ctx, argv, argc, Command::Allow))
}

/// `XCLOAK.PEEK key window limit [TIER window limit]... [COST cost] [NOW unix-ms]`
pub extern "C" fn peek(ctx: *mut raw::RedisModuleCtx, argv: *mut *mut raw::RedisModuleString, argc: c_int) -> c_int {
    guarded(ctx, || execute(ctx, argv, argc, Command::Peek))
}

fn guarded(ctx: *mut raw::RedisModuleCtx, body: impl FnOnce()) -> c_int {
    if catch_unwind(AssertUnwindSafe(body)).is_err() {
        ERRORS.fetch_add(1, Relaxed);
        reply_error(ctx, "ERR xcloak internal error, see the server log");
    }
    raw::REDISMODULE_OK as c_int
}

fn execute(ctx: *mut raw::RedisModuleCtx, argv: *mut *mut raw::RedisModuleString, argc: c_int, command: Command) {
    // SAFETY: the server hands `argc` valid strings in `argv` for this call.
    let strings = unsafe { std::slice::from_raw_parts(argv, argc.max(0) as usize) };
    let mut words: [&[u8]; MAX_VALID_ARGC + 1] = [&[]; MAX_VALID_ARGC + 1];
    let heap: Vec<&[u8]>;
    let words: &[&[u8]] = if strings.len() <= words.len() {
        for (word, &string) in words.iter_mut().zip(strings) {
            *word = bytes_of(string);
        }
        &words[..strings.len()]
    } else {
        heap = strings.iter().map(|&string| bytes_of(string)).collect();
        &heap
    };

    let request = match args::parse(command, words, MAX_LIMIT.load(Relaxed)) {
        Ok(request) => request,
        Err(ArgError::Arity) => {
            ERRORS.fetch_add(1, Relaxed);
            unsafe { api!(RedisModule_WrongArity)(ctx) };
            return;
        }
        Err(ArgError::Invalid(message)) => {
            ERRORS.fetch_add(1, Relaxed);
            reply_error(ctx, &format!("ERR {message}"));
            return;
        }
    };

    // Test-only trigger (never in a default build): proves a panic becomes an error reply.
    #[cfg(feature = "fault-injection")]
    if bytes_of(strings[1]) == b"xcloak:fault:panic" {
        panic!("xcloak fault injection: deliberate panic on key xcloak:fault:panic");
    }

    let server_ms = unsafe { api!(RedisModule_Milliseconds)() };
    let now_ms = request.now_ms.unwrap_or(server_ms);
    // SAFETY: `ctx` and the key argument belong to this call.
    let mut key = match unsafe { ZsetKey::open(ctx, strings[1], command == Command::Allow) } {
        Opened::Ready(key) => key,
        Opened::WrongType => {
            ERRORS.fetch_add(1, Relaxed);
            reply_error(ctx, WRONGTYPE);
            return;
        }
    };

    match command {
        Command::Allow => {
            let decision = window::allow(&mut key, &request, now_ms, request.details);
            key.commit(server_ms, request.tiers.longest_window_ms() + TTL_MARGIN_MS);
            drop(key);
            let counter = if decision.allowed { &ADMITTED } else { &REJECTED };
            counter.fetch_add(1, Relaxed);
            if request.details {
                reply_details(ctx, &decision, request.tiers.is_tiered());
            } else {
                unsafe { api!(RedisModule_ReplyWithLongLong)(ctx, decision.allowed as i64) };
            }
        }
        Command::Peek => {
            let decision = window::peek(&key, &request, now_ms);
            drop(key);
            PEEKS.fetch_add(1, Relaxed);
            reply_details(ctx, &decision, request.tiers.is_tiered());
        }
    }
}

/// The details reply: allowed, then the binding tier's limit, remaining,
/// retry_after_ms, reset_after_ms; with `TIER`, a sixth element holding
/// `[window, limit, remaining, retry_after_ms, reset_after_ms]` per tier.
fn reply_details(ctx: *mut raw::RedisModuleCtx, decision: &Decision, tiered: bool) {
    let binding = decision.binding();
    let fields = [
        decision.allowed as i64,
        binding.limit,
        binding.remaining,
        binding.retry_after_ms,
        binding.reset_after_ms,
    ];
    unsafe {
        api!(RedisModule_ReplyWithArray)(ctx, (fields.len() + tiered as usize) as _);
        for field in fields {
            api!(RedisModule_ReplyWithLongLong)(ctx, field);
        }
        if tiered {
            api!(RedisModule_ReplyWithArray)(ctx, decision.tiers().len() as _);
            for tier in decision.tiers() {
                let fields = [tier.window_ms, tier.limit, tier.remaining, tier.retry_after_ms, tier.reset_after_ms];
                api!(RedisModule_ReplyWithArray)(ctx, fields.len() as _);
                for field in fields {
                    api!(RedisModule_ReplyWithLongLong)(ctx, field);
                }
            }
        }
    }
}

fn reply_error(ctx: *mut raw::RedisModuleCtx, message: &str) {
    let text = CString::new(message).unwrap_or_else(|_| c"ERR invalid error text".to_owned());
    unsafe { api!(RedisModule_ReplyWithError)(ctx, text.as_ptr()) };
}
