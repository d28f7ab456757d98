//! What `OnLoad` registers besides the type, configs and events, behind
//! safe Rust: the commands, and the `INFO` section, written through [`Info`].

use std::ffi::{c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use redis_module::raw;

use super::api;

/// A command handler as the server calls it (commands.rs's handlers).
pub type CommandHandler = extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// Creates the command `name`, with `flags` and its one key at position `key`
/// (the first, last and step of its keys: key, key, 1). From `OnLoad` only.
pub fn create_command(
    ctx: *mut raw::RedisModuleCtx,
    name: &CStr,
    handler: CommandHandler,
    flags: &CStr,
    key: usize,
) -> bool {
    let Ok(key) = c_int::try_from(key) else {
        return false;
    };
    // SAFETY: the load context; the name and flags are NUL-terminated and
    // copied by the server.
    let status =
        unsafe { api!(RedisModule_CreateCommand)(ctx, name.as_ptr(), Some(handler), flags.as_ptr(), key, key, 1) };
    status == raw::REDISMODULE_OK as c_int
}

/// The `INFO` section being written (`INFO <module>`).
pub struct Info {
    ctx: *mut raw::RedisModuleInfoCtx,
}

impl Info {
    /// Starts the section `<module>_<name>` (its fields follow).
    pub fn section(&mut self, name: &CStr) {
        // SAFETY: the info context of this callback; `name` is NUL-terminated.
        unsafe { api!(RedisModule_InfoAddSection)(self.ctx, name.as_ptr()) };
    }

    pub fn field_i64(&mut self, name: &CStr, value: i64) {
        // SAFETY: as above.
        unsafe { api!(RedisModule_InfoAddFieldLongLong)(self.ctx, name.as_ptr(), value) };
    }

    pub fn field_text(&mut self, name: &CStr, value: &CStr) {
        // SAFETY: as above; the server copies the value.
        unsafe { api!(RedisModule_InfoAddFieldCString)(self.ctx, name.as_ptr(), value.as_ptr() as *mut _) };
    }
}

static INFO: OnceLock<fn(&mut Info)> = OnceLock::new();

/// Makes `write` the module's `INFO` section (replacing the one the
/// `redis_module!` macro registered before `init`). From `OnLoad` only.
pub fn set_info(ctx: *mut raw::RedisModuleCtx, write: fn(&mut Info)) {
    let _ = INFO.set(write);
    // SAFETY: the load context; `info` is a static callback.
    unsafe { api!(RedisModule_RegisterInfoFunc)(ctx, Some(info)) };
}

extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    if let Some(write) = INFO.get() {
        // A panic (logged by the hook lib.rs sets) ends the section there.
        let _ = catch_unwind(AssertUnwindSafe(|| write(&mut Info { ctx })));
    }
}
