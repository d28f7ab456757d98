//! xcloak: exact sliding-window rate limiting as a Redis module.
//!
//! `XCLOAK.ALLOW key window limit` trims a sliding-window log, counts it, and
//! admits-and-records in one command execution, so concurrent callers cannot
//! interleave between the count and the add (the race of a naive pipeline).
//! The log is an ordinary sorted set, the layout of the well-known Lua script,
//! so deployments move between the two freely.
//!
//! Architecture: [`args`] parses a command line into a typed request, strictly;
//! [`window`] takes the decision in plain Rust over a small `Log` trait;
//! [`zset`] is the one file that touches keys (the `Log` over a sorted set and
//! the replication of effects); [`commands`] wires them into handlers; this
//! file registers everything with the server.

mod args;
mod commands;
mod window;
mod zset;

#[cfg(not(test))]
mod module {
    use std::ffi::{c_int, CStr};

    use redis_module::{raw, Context, RedisString, Status};

    use crate::args::{parse_i64, MAX_LIMIT_CEILING};
    use crate::commands;

    redis_module::redis_module! {
        name: "xcloak",
        version: 1,
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [],
        init: init,
    }

    type Handler = extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

    /// Name, handler, flags. Key positions are 1,1,1 for both.
    const COMMANDS: [(&CStr, Handler, &CStr); 2] = [
        (c"xcloak.allow", commands::allow, c"write deny-oom fast"),
        (c"xcloak.peek", commands::peek, c"readonly fast"),
    ];

    fn init(ctx: &Context, args: &[RedisString]) -> Status {
        if let Err(message) = load_arguments(args) {
            ctx.log_warning(&format!("xcloak: refusing to load: {message}"));
            return Status::Err;
        }
        for (name, handler, flags) in COMMANDS {
            // SAFETY: called from OnLoad with the server's context; the names
            // and flags are NUL-terminated statics.
            let status = unsafe {
                raw::RedisModule_CreateCommand.expect("CreateCommand")(
                    ctx.ctx,
                    name.as_ptr(),
                    Some(handler),
                    flags.as_ptr(),
                    1,
                    1,
                    1,
                )
            };
            if status != raw::REDISMODULE_OK as c_int {
                ctx.log_warning(&format!("xcloak: could not register {}", name.to_string_lossy()));
                return Status::Err;
            }
        }
        // Replaces the info callback the macro registered (it runs before init).
        unsafe { raw::RedisModule_RegisterInfoFunc.expect("RegisterInfoFunc")(ctx.ctx, Some(info)) };
        Status::Ok
    }

    /// `loadmodule xcloak.so [MAX-LIMIT n]`
    fn load_arguments(args: &[RedisString]) -> Result<(), String> {
        let mut rest = args.iter().map(|a| a.as_slice());
        while let Some(name) = rest.next() {
            if name.eq_ignore_ascii_case(b"MAX-LIMIT") {
                let value = rest
                    .next()
                    .and_then(parse_i64)
                    .filter(|v| (1..=MAX_LIMIT_CEILING).contains(v))
                    .ok_or_else(|| format!("MAX-LIMIT must be an integer from 1 to {MAX_LIMIT_CEILING}"))?;
                commands::MAX_LIMIT.store(value, std::sync::atomic::Ordering::Relaxed);
            } else {
                return Err(format!(
                    "unknown load argument '{}' (expected MAX-LIMIT n)",
                    String::from_utf8_lossy(name)
                ));
            }
        }
        Ok(())
    }

    /// `INFO xcloak`: counters since load, and the configured bound.
    extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
        use std::sync::atomic::Ordering::Relaxed;
        let fields: [(&CStr, i64); 5] = [
            (c"admitted", commands::ADMITTED.load(Relaxed) as i64),
            (c"rejected", commands::REJECTED.load(Relaxed) as i64),
            (c"peeks", commands::PEEKS.load(Relaxed) as i64),
            (c"errors", commands::ERRORS.load(Relaxed) as i64),
            (c"max_limit", commands::MAX_LIMIT.load(Relaxed)),
        ];
        // SAFETY: `ctx` is the info context the server passed to this callback.
        unsafe {
            raw::RedisModule_InfoAddSection.expect("InfoAddSection")(ctx, c"stats".as_ptr());
            for (name, value) in fields {
                raw::RedisModule_InfoAddFieldLongLong.expect("InfoAddFieldLongLong")(ctx, name.as_ptr(), value);
            }
        }
    }
}
