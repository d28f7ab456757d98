//! What the server tells clients and operators about the commands.
//!
//! - `COMMAND DOCS` / `COMMAND INFO` (Redis 7.0+, Valkey): summary, since,
//!   complexity, arity, key specs and typed arguments, through
//!   `RedisModule_SetCommandInfo`;
//! - ACL categories (Redis 7.2+, Valkey), through
//!   `RedisModule_SetCommandACLCategories`.
//!
//! Each is applied only when the server exports the function (the pointer is
//! `Some`); an older server still loads the module, without the metadata. The
//! server copies the structures it is handed (every string and array), so
//! they live only for the call; they used to be leaked at load, which
//! valgrind reported as 3,152 bytes definitely lost (`make test-valgrind`).

use std::ffi::{c_int, CStr};
use std::ptr;

use redis_module::raw;

/// Version of this module's commands, as `COMMAND DOCS` shows it in `since`.
const SINCE: &CStr = c"0.1.0";

/// One command's documentation, declared once.
pub struct CommandDoc {
    pub name: &'static CStr,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    /// Space-separated hints for clients and proxies.
    pub tips: Option<&'static CStr>,
    /// Arity as `COMMAND INFO` reports it: negative means "at least".
    pub arity: c_int,
    /// `REDISMODULE_CMD_KEY_*` flags of the single key (argument 1).
    pub key_flags: u32,
    /// Space-separated ACL categories (7.2+).
    pub acl_categories: &'static CStr,
    pub args: &'static [Arg],
}

/// One argument after the command name.
pub struct Arg {
    pub name: &'static CStr,
    pub kind: Kind,
    /// The keyword that introduces the value (`COST 5`), or the whole token.
    pub token: Option<&'static CStr>,
    pub summary: &'static CStr,
    pub optional: bool,
    /// May be given several times, each with its token (`TIER w l TIER w l`).
    pub repeats: bool,
    /// The arguments inside a block (`Kind::Block`), empty otherwise.
    pub block: &'static [Arg],
}

impl Arg {
    /// A required argument with no token, no repeat, no block (the base of the constants below).
    const fn plain(name: &'static CStr, kind: Kind, summary: &'static CStr) -> Arg {
        Arg {
            name,
            kind,
            token: None,
            summary,
            optional: false,
            repeats: false,
            block: &[],
        }
    }
}

#[derive(Clone, Copy)]
pub enum Kind {
    Key,
    String,
    Integer,
    UnixTime,
    PureToken,
    Block,
}

impl Kind {
    fn raw(self) -> raw::RedisModuleCommandArgType {
        match self {
            Kind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
            Kind::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
            Kind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
            Kind::UnixTime => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME,
            Kind::PureToken => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
            Kind::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
        }
    }
}

const KEY: Arg = Arg::plain(
    c"key",
    Kind::Key,
    c"The window's log (one per client identity): a sorted set, or the compact type xcloaklog.",
);
const WINDOW: Arg = Arg::plain(
    c"window",
    Kind::Integer,
    c"Window length in milliseconds, 1 to 9007199254740991.",
);
const LIMIT: Arg = Arg::plain(
    c"limit",
    Kind::Integer,
    c"Most units admitted per window, 0 to xcloak.max-limit (default 1000000).",
);
const TIER: Arg = Arg {
    token: Some(c"TIER"),
    optional: true,
    repeats: true,
    block: &[
        Arg::plain(
            c"window",
            Kind::Integer,
            c"This tier's window in milliseconds, 1 to 9007199254740991.",
        ),
        Arg::plain(c"limit", Kind::Integer, c"This tier's limit, 0 to xcloak.max-limit."),
    ],
    ..Arg::plain(
        c"tier",
        Kind::Block,
        c"Another window and limit checked in the same call, up to 15 times: admitted only if every tier has room.",
    )
};
const COST: Arg = Arg {
    token: Some(c"COST"),
    optional: true,
    ..Arg::plain(
        c"cost",
        Kind::Integer,
        c"Units this request consumes, 1 to 1000000 (default 1); all or nothing.",
    )
};
const NOW: Arg = Arg {
    token: Some(c"NOW"),
    optional: true,
    ..Arg::plain(
        c"unix-time-milliseconds",
        Kind::UnixTime,
        c"The caller's clock in unix milliseconds, 0 to 9007199254740991 (default: the server's).",
    )
};
const DETAILS: Arg = Arg {
    token: Some(c"DETAILS"),
    optional: true,
    ..Arg::plain(
        c"details",
        Kind::PureToken,
        c"Reply [allowed, limit, remaining, retry_after_ms, reset_after_ms] instead of 1/0, with a sixth element, \
the per-tier array, when TIER is given.",
    )
};

const STAMP: Arg = Arg {
    token: Some(c"STAMP"),
    optional: true,
    ..Arg::plain(
        c"stamp",
        Kind::PureToken,
        c"Reply the admission's stamp (the millisecond it recorded, -1 if rejected) instead of 1/0, or as the \
last element of the DETAILS reply: the handle XCLOAK.REFUND takes.",
    )
};

const OLDEST: Arg = Arg {
    token: Some(c"OLDEST"),
    optional: true,
    ..Arg::plain(
        c"oldest",
        Kind::PureToken,
        c"Add, last, the stamp of the oldest entry live in the binding tier's window (where that moving \
window starts), -1 if the window holds none.",
    )
};

pub const ALLOW: CommandDoc = CommandDoc {
    name: c"xcloak.allow",
    summary: c"Admits a request of COST units if the sliding window (and every TIER) has room, and records it \
once. Replies 1/0 (with STAMP the admission's stamp, or -1), or with DETAILS [allowed, limit, remaining, \
retry_after_ms, reset_after_ms], plus the per-tier array when TIER is given and the stamp with STAMP.",
    complexity: c"O(log(N) + (M + C)*log(N)) with N the entries in the key, M the entries that \
expired (removed) and C the cost; each TIER shorter than the longest window adds O(log(N) + E), E the entries \
older than its window; DETAILS adds O(K) per tier, K <= N the entries older than the one whose departure makes room.",
    tips: Some(c"nondeterministic_output"),
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE,
    acl_categories: c"write fast",
    args: &[KEY, WINDOW, LIMIT, TIER, COST, NOW, DETAILS, STAMP],
};

pub const PEEK: CommandDoc = CommandDoc {
    name: c"xcloak.peek",
    summary: c"Replies what XCLOAK.ALLOW would decide now, writing nothing: \
[allowed, limit, remaining, retry_after_ms, reset_after_ms], plus the per-tier array when TIER is given and \
the oldest live entry's stamp with OLDEST.",
    complexity: c"O(log(N) + M + K) with N the entries in the key, M the entries that expired \
(counted, not removed) and K <= N the entries older than the one whose departure makes room; each TIER adds \
as much.",
    tips: Some(c"nondeterministic_output"),
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    acl_categories: c"read fast",
    args: &[KEY, WINDOW, LIMIT, TIER, COST, NOW, OLDEST],
};

pub const REFUND: CommandDoc = CommandDoc {
    name: c"xcloak.refund",
    summary: c"Gives back an admission: removes up to COST entries stamped exactly stamp (the STAMP reply of \
XCLOAK.ALLOW) and replies how many it removed. Trims nothing and leaves the TTL alone.",
    complexity: c"O(log(N) + C*log(N)) with N the entries in the key and C the cost (O(N) on a compact window \
when the stamp is not the newest).",
    tips: None,
    arity: -3,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    acl_categories: c"write fast",
    args: &[
        KEY,
        Arg::plain(
            c"stamp",
            Kind::Integer,
            c"The admission's stamp in unix milliseconds, 0 to 9007199254740991 (the STAMP reply of XCLOAK.ALLOW).",
        ),
        Arg {
            token: Some(c"COST"),
            optional: true,
            ..Arg::plain(
                c"cost",
                Kind::Integer,
                c"Units to give back, 1 to 1000000 (default 1); never more than that stamp holds.",
            )
        },
    ],
};

pub const CONVERT: CommandDoc = CommandDoc {
    name: c"xcloak.convert",
    summary: c"Rewrites one window in the other storage form (ZSET: a sorted set; COMPACT: the module's \
compact type), keeping every entry and the TTL. Replies 1 if converted, 0 if the key is missing or already in that form.",
    complexity: c"O(N) with N the entries in the key (O(N*log(N)) into a sorted set).",
    tips: None,
    arity: 3,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE,
    acl_categories: c"write slow",
    args: &[
        KEY,
        Arg::plain(
            c"target",
            Kind::String,
            c"ZSET or COMPACT (COMPACT needs the module loaded with STORAGE compact).",
        ),
    ],
};

pub const APPLY: CommandDoc = CommandDoc {
    name: c"xcloak.apply",
    summary: c"Internal: replays the effect of a call on a compact window (load, trim, remove, add, \
expiry) from the replication link or the AOF. Refused from clients.",
    complexity: c"O(M + 1) for a trim of M entries and an add; O(N) to load N entries.",
    tips: None,
    arity: -2,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    acl_categories: c"write",
    args: &[KEY],
};

/// The layout version the server checks the structures against (the
/// `REDISMODULE_COMMAND_INFO_VERSION` of `redismodule.h`, which bindgen cannot
/// export because it is a `static const` in the header).
static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

/// What [`describe`] could apply on this server.
#[derive(Debug, Default)]
pub struct Applied {
    pub docs: bool,
    pub acl_categories: bool,
}

/// Attaches `doc` to the already created command. Call from `OnLoad` only.
/// An `Err` carries a message for the log; the command itself still works.
pub fn describe(ctx: *mut raw::RedisModuleCtx, doc: &CommandDoc) -> Result<Applied, String> {
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
    let name = doc.name.to_string_lossy();
    // SAFETY: `ctx` is the load context and the name a NUL-terminated static.
    let command = unsafe { get_command(ctx, doc.name.as_ptr()) };
    if command.is_null() {
        return Err(format!("{name} is not registered"));
    }
    if let Some(set_info) = set_info {
        let mut held = Held::default();
        let info = command_info(doc, &mut held);
        // SAFETY: `command` is this module's, created in this OnLoad; `info`
        // points into `held` and statics, alive during the call, and the
        // server copies all of it (RM_SetCommandInfo duplicates every string
        // and array), so it is freed when `held` drops.
        if unsafe { set_info(command, &info) } != raw::REDISMODULE_OK as c_int {
            return Err(format!("the server rejected the command info of {name}"));
        }
        applied.docs = true;
    }
    if let Some(set_acl) = set_acl {
        // SAFETY: as above; the categories are a NUL-terminated static.
        if unsafe { set_acl(command, doc.acl_categories.as_ptr()) } != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "the server rejected the ACL categories '{}' of {name}",
                doc.acl_categories.to_string_lossy()
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

fn command_info(doc: &CommandDoc, held: &mut Held) -> raw::RedisModuleCommandInfo {
    // SAFETY (zeroed): both structs are plain C data; all-zero is the
    // terminator the server looks for (begin_search_type INVALID, name NULL).
    let mut key_spec: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    key_spec.flags = u64::from(doc.key_flags);
    key_spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    key_spec.bs.index.pos = 1;
    key_spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    key_spec.fk.range.lastkey = 0;
    key_spec.fk.range.keystep = 1;
    key_spec.fk.range.limit = 0;
    let key_specs = terminated(vec![key_spec], &mut held.key_specs);

    let args = server_args(doc.args, held);

    raw::RedisModuleCommandInfo {
        version: &INFO_VERSION,
        summary: doc.summary.as_ptr(),
        complexity: doc.complexity.as_ptr(),
        since: SINCE.as_ptr(),
        history: ptr::null_mut(),
        tips: doc.tips.map_or(ptr::null(), CStr::as_ptr),
        arity: doc.arity,
        key_specs,
        args,
    }
}

/// The server's form of `args` (and of the arguments of their blocks),
/// terminated, held in `held`.
fn server_args(args: &[Arg], held: &mut Held) -> *mut raw::RedisModuleCommandArg {
    let args = args
        .iter()
        .map(|arg| {
            let mut flags = 0;
            if arg.optional {
                flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
            }
            if arg.repeats {
                flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE | raw::REDISMODULE_CMD_ARG_MULTIPLE_TOKEN;
            }
            raw::RedisModuleCommandArg {
                name: arg.name.as_ptr(),
                type_: arg.kind.raw(),
                key_spec_index: if matches!(arg.kind, Kind::Key) { 0 } else { -1 },
                token: arg.token.map_or(ptr::null(), CStr::as_ptr),
                summary: arg.summary.as_ptr(),
                since: ptr::null(),
                flags: flags as c_int,
                deprecated_since: ptr::null(),
                subargs: if arg.block.is_empty() {
                    ptr::null_mut()
                } else {
                    server_args(arg.block, held)
                },
                display_text: ptr::null(),
            }
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
