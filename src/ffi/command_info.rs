//! `COMMAND DOCS` / `COMMAND INFO` and ACL categories, handed to the server:
//! [`apply`] lays out a command's [`Docs`] (built from the grammar by
//! `metadata.rs`) as the C structures of `RedisModule_SetCommandInfo`, and
//! calls it and `RedisModule_SetCommandACLCategories`.
//!
//! Each is applied only when the server exports the function (the pointer is
//! `Some`); an older server still loads the module, without the metadata. The
//! server copies the structures it is handed (every string and array), so
//! they live only for the call (they used to be leaked at load, which
//! valgrind reported as 3,152 bytes definitely lost).

use std::ffi::{c_int, CStr, CString};
use std::ptr;

use redis_module::raw;

/// One command's documentation, in the server's terms.
pub struct Docs {
    pub name: CString,
    pub summary: CString,
    pub complexity: CString,
    pub since: CString,
    pub tips: Option<CString>,
    pub arity: c_int,
    /// `REDISMODULE_CMD_KEY_*` flags of the single key.
    pub key_flags: u64,
    /// Its position in the call (the command name is 0).
    pub key_position: c_int,
    pub acl_categories: CString,
    pub args: Vec<DocArg>,
}

/// One argument, in the server's terms.
pub struct DocArg {
    pub name: CString,
    pub type_: raw::RedisModuleCommandArgType,
    /// 0 for the key (its key spec), -1 otherwise.
    pub key_spec_index: c_int,
    pub token: Option<CString>,
    pub summary: CString,
    /// `REDISMODULE_CMD_ARG_*` flags.
    pub flags: c_int,
    /// The arguments inside a block.
    pub block: Vec<DocArg>,
}

/// The layout version the server checks the structures against (the
/// `REDISMODULE_COMMAND_INFO_VERSION` of `redismodule.h`, which bindgen cannot
/// export because it is a `static const` in the header).
static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

/// What [`apply`] could apply on this server.
#[derive(Debug, Default)]
pub struct Applied {
    pub docs: bool,
    pub acl_categories: bool,
}

/// Attaches `docs` to the already created command. Call from `OnLoad` only.
/// An `Err` carries a message for the log; the command itself still works.
pub fn apply(ctx: *mut raw::RedisModuleCtx, docs: &Docs) -> Result<Applied, String> {
    let mut applied = Applied::default();
    // SAFETY: reading the function pointers the server filled in at load.
    let (get_command, set_info, set_acl) = unsafe {
        (
            raw::RedisModule_GetCommand,
            raw::RedisModule_SetCommandInfo,
            raw::RedisModule_SetCommandACLCategories,
        )
    };
    let Some(get_command) = get_command else {
        return Ok(applied); // Redis 6.2: no command handles, no docs.
    };
    let name = docs.name.to_string_lossy();
    // SAFETY: `ctx` is the load context and the name NUL-terminated.
    let command = unsafe { get_command(ctx, docs.name.as_ptr()) };
    if command.is_null() {
        return Err(format!("{name} is not registered"));
    }
    if let Some(set_info) = set_info {
        let mut held = Held::default();
        let info = command_info(docs, &mut held);
        // SAFETY: `command` is this module's, created in this OnLoad; `info`
        // points into `docs`, `held` and statics, alive during the call, and
        // the server copies all of it (RM_SetCommandInfo duplicates every
        // string and array), so it is freed when `held` drops.
        if unsafe { set_info(command, &info) } != raw::REDISMODULE_OK as c_int {
            return Err(format!("the server rejected the command info of {name}"));
        }
        applied.docs = true;
    }
    if let Some(set_acl) = set_acl {
        // SAFETY: as above; the categories are NUL-terminated and copied.
        if unsafe { set_acl(command, docs.acl_categories.as_ptr()) } != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "the server rejected the ACL categories '{}' of {name}",
                docs.acl_categories.to_string_lossy()
            ));
        }
        applied.acl_categories = true;
    }
    Ok(applied)
}

/// The arrays a command info points to, alive until the server copied them.
#[derive(Default)]
struct Held {
    key_specs: Vec<Vec<raw::RedisModuleCommandKeySpec>>,
    args: Vec<Vec<raw::RedisModuleCommandArg>>,
}

fn command_info(docs: &Docs, held: &mut Held) -> raw::RedisModuleCommandInfo {
    // SAFETY: zeroed: a plain C struct; all-zero is the terminator the
    // server looks for (begin_search_type INVALID).
    let mut key_spec: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    key_spec.flags = docs.key_flags;
    key_spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    key_spec.bs.index.pos = docs.key_position;
    key_spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    key_spec.fk.range.lastkey = 0;
    key_spec.fk.range.keystep = 1;
    key_spec.fk.range.limit = 0;
    let key_specs = terminated(vec![key_spec], &mut held.key_specs);

    let args = server_args(&docs.args, held);

    raw::RedisModuleCommandInfo {
        version: &INFO_VERSION,
        summary: docs.summary.as_ptr(),
        complexity: docs.complexity.as_ptr(),
        since: docs.since.as_ptr(),
        history: ptr::null_mut(),
        tips: docs.tips.as_deref().map_or(ptr::null(), CStr::as_ptr),
        arity: docs.arity,
        key_specs,
        args,
    }
}

/// The server's form of `args` (and of the arguments of their blocks),
/// terminated, held in `held`.
fn server_args(args: &[DocArg], held: &mut Held) -> *mut raw::RedisModuleCommandArg {
    let args = args
        .iter()
        .map(|arg| raw::RedisModuleCommandArg {
            name: arg.name.as_ptr(),
            type_: arg.type_,
            key_spec_index: arg.key_spec_index,
            token: arg.token.as_deref().map_or(ptr::null(), CStr::as_ptr),
            summary: arg.summary.as_ptr(),
            since: ptr::null(),
            flags: arg.flags,
            deprecated_since: ptr::null(),
            subargs: if arg.block.is_empty() {
                ptr::null_mut()
            } else {
                server_args(&arg.block, held)
            },
            display_text: ptr::null(),
        })
        .collect();
    terminated(args, &mut held.args)
}

/// `items` followed by an all-zero terminator, moved into `held` (moving a
/// Vec keeps its buffer where it is); returns the first element.
fn terminated<T>(mut items: Vec<T>, held: &mut Vec<Vec<T>>) -> *mut T {
    // SAFETY: only used with the plain C structs above, for which all-zero
    // bytes are a valid value (and the terminator).
    items.push(unsafe { std::mem::zeroed() });
    let first = items.as_mut_ptr();
    held.push(items);
    first
}
