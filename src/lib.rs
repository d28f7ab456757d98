//! xcloak: exact sliding-window rate limiting as a Redis module.
//!
//! `XCLOAK.ALLOW key window limit` trims a sliding-window log, counts it, and
//! admits-and-records in one command execution, so concurrent callers cannot
//! interleave between the count and the add (the race of a naive pipeline).
//! The log is either an ordinary sorted set, the layout of the well-known Lua
//! script (so deployments move between the two freely), or the module's own
//! compact type, about a byte per request in large windows (`STORAGE compact`).
//!
//! Architecture: the pure core is its own crate, `xcloak-core` (`core/`, no
//! module API): `grammar` declares each command once (its words, ranges,
//! flags and doc text), from which `args` parses a command line into a typed
//! request, strictly, and this crate registers the commands and their docs;
//! `window` takes the decision in plain Rust over a small `Log` trait; `log`
//! is the compact form's log and its encodings; `member` and `effect` the
//! sorted-set members and the compact form's effect text. Here, [`ffi`] is
//! the border with the server, the one module where `unsafe` is allowed (each
//! block with its SAFETY line): keys, strings, replies, the data type's
//! callbacks and values (`ffi/datatype.rs`), events and timers, configs and
//! registration, all behind safe functions, types and traits. Above it, in
//! safe Rust: [`store`] is the one folder that touches keys: the `Log` over a
//! sorted set (`store/zset.rs`) and over the compact type (`store/compact.rs`,
//! which defines the type through `ffi::datatype::ModuleType`), side by side,
//! and the replication of effects; [`commands`] wires them into handlers;
//! [`eviction`] counts evicted windows over the store; this file registers
//! everything with the server (the eviction hooks included, so that imports
//! only point down), with [`metadata`] (COMMAND DOCS, ACL categories, mapped from the grammar
//! to the server's terms) and
//! [`config`] (`MAX-LIMIT`, `STORAGE`, `xcloak.*`, the settings it owns).

// Unit tests build without the registration (`module`), which is what uses
// the handlers, metadata and config.
#![cfg_attr(test, allow(dead_code))]
// `unsafe` lives at the border with the server, `ffi.rs` and `ffi/`: the
// compiler holds the rule (and tests/hygiene.rs, that each block there has
// its SAFETY line).
#![deny(unsafe_code)]

mod commands;
mod config;
mod eviction;
#[allow(unsafe_code)] // the border with the server
mod ffi;
mod metadata;
mod store;
mod version;

#[cfg(not(test))]
mod module {
    use std::ffi::CStr;

    use redis_module::{Context, RedisString, Status};
    use xcloak_core::grammar::{self, Command};

    use crate::ffi::registration::{self, CommandHandler, Info};
    use crate::metadata;
    use crate::store::{self, compact};
    use crate::{commands, config, eviction, ffi};

    redis_module::redis_module! {
        name: "xcloak",
        version: crate::version::ENCODED,
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [],
        init: init,
    }

    /// Each command's handler and grammar (its name, flags, key position and docs).
    const COMMANDS: [(CommandHandler, &Command); 5] = [
        (commands::allow, &grammar::ALLOW),
        (commands::peek, &grammar::PEEK),
        (commands::refund, &grammar::REFUND),
        (commands::convert, &grammar::CONVERT),
        (commands::apply, &grammar::APPLY),
    ];

    fn init(ctx: &Context, args: &[RedisString]) -> Status {
        let words: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        let load_arguments = match config::parse_load_arguments(&words) {
            Ok(parsed) => parsed,
            Err(message) => return refuse(ctx, &message),
        };
        if let Some(name) = ffi::missing_api() {
            return refuse(ctx, &format!("the server does not provide {name}"));
        }
        if load_arguments.storage == store::Form::Compact {
            if let Err(message) = compact::register(ctx.ctx, eviction::compact_unlinked) {
                return refuse(ctx, &message);
            }
        }
        ffi::set_module_options(ctx.ctx, compact::registered());
        for (handler, command) in COMMANDS {
            let (name, flags) = (metadata::text(command.name), metadata::text(command.flags));
            if !registration::create_command(ctx.ctx, &name, handler, &flags, command.key_position()) {
                return refuse(ctx, &format!("could not register {}", command.name));
            }
            // Metadata is documentation: a server that rejects it still gets
            // working commands, and the log says why COMMAND DOCS is bare.
            if let Err(message) = metadata::describe(ctx.ctx, command) {
                ctx.log_warning(&format!("xcloak: {message}; continuing without it"));
            }
        }
        if let Err(message) = config::register(ctx.ctx, load_arguments) {
            return refuse(ctx, &message);
        }
        // Counts and logs evicted windows; warns about the eviction policy.
        eviction::subscribe(ctx.ctx);
        // A panic is caught at the command boundary (commands.rs) and answered
        // with an error; this puts its message in the server log, where the
        // reply points (the default hook writes to stderr, which --logfile
        // does not capture).
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |panic| {
            redis_module::logging::log_warning(format!("xcloak: internal error: {panic}"));
            previous(panic);
        }));
        registration::set_info(ctx.ctx, info);
        ctx.log_notice(&format!("version {} loaded", crate::version::TEXT));
        Status::Ok
    }

    fn refuse(ctx: &Context, message: &str) -> Status {
        ctx.log_warning(&format!("xcloak: refusing to load: {message}"));
        Status::Err
    }

    /// `INFO xcloak`: the version, counters since load, and the configured bound.
    fn info(info: &mut Info) {
        use std::sync::atomic::Ordering::Relaxed;
        let fields: [(&CStr, i64); 8] = [
            (c"admitted", commands::ADMITTED.load(Relaxed) as i64),
            (c"rejected", commands::REJECTED.load(Relaxed) as i64),
            (c"peeks", commands::PEEKS.load(Relaxed) as i64),
            (c"refunded", commands::REFUNDED.load(Relaxed) as i64),
            (c"converted", commands::CONVERTED.load(Relaxed) as i64),
            (c"errors", commands::ERRORS.load(Relaxed) as i64),
            (c"evicted", eviction::EVICTED.load(Relaxed) as i64),
            (c"max_limit", config::max_limit()),
        ];
        // The form new keys take, and whether the compact type is registered.
        let storage = std::ffi::CString::new(store::creation_form().name()).unwrap_or_default();
        let compact_type = if compact::registered() {
            c"registered"
        } else {
            c"not-registered"
        };
        info.section(c"stats");
        info.field_text(c"version", crate::version::C_TEXT);
        for (name, value) in fields {
            info.field_i64(name, value);
        }
        info.field_text(c"storage", &storage);
        info.field_text(c"compact_type", compact_type);
        info.field_text(c"evicted_forms", eviction::counted_forms());
    }
}
