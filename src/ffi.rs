//! The border with the server: every raw call of the module API, each
//! `unsafe` block with its `// SAFETY:` line, behind safe functions and
//! types. The crate denies `unsafe_code` (lib.rs); this file and its
//! submodules are the one place that allows it.
//!
//! - [`api!`] reads a function of the API table (checked at load by
//!   [`missing_api`]);
//! - [`Key`]: an open key, closed on drop, with the calls on it (type,
//!   expiry, the sorted-set range iterator, ZADD/ZREM, replication of effects
//!   naming it, keyspace events);
//! - [`Owned`]: a module string, freed on drop; [`bytes_of`] borrows a string's
//!   bytes for as long as the string;
//! - a command's arguments ([`with_arguments`], [`with_words`]) and its replies;
//! - [`datatype`]: a module data type (the compact form's `xcloaklog`) as a
//!   safe trait, its callbacks, and a key's value;
//! - [`events`]: server and keyspace events, timers, `INFO` reads;
//! - [`config`]: module configs (`xcloak.*`);
//! - [`registration`]: commands and the `INFO` section.
//! - [`command_info`]: `COMMAND DOCS` / `COMMAND INFO` and ACL categories as
//!   the server's C structures.
//!
//! A raw context (`*mut RedisModuleCtx`) taken by a function here is the
//! context the server passed to the executing command or callback: every
//! caller passes on the one it was given, as `redis_module::Context` does.

// One module a line.
pub mod config;
pub mod datatype;
pub mod events;
pub mod registration;

use std::ffi::{c_char, c_int, CStr, CString};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr;

use redis_module::raw;

pub mod command_info;

/// Calls a function of the module API. Every one used here exists on all
/// supported servers (checked at load, see `lib.rs`).
macro_rules! api {
    ($name:ident) => {{
        // SAFETY: the API table is filled once, at load, before any call.
        #[allow(unused_unsafe)]
        let function = unsafe { raw::$name };
        function.expect(concat!(stringify!($name), " is missing"))
    }};
}
pub(crate) use api;

/// The first module API function this module calls that the server did not
/// provide, if any: `lib.rs` refuses to load then, so `api!` never fails.
pub fn missing_api() -> Option<&'static str> {
    macro_rules! first_missing {
        ($($name:ident),* $(,)?) => {{
            // SAFETY: reads the table the server filled in before OnLoad's body.
            $( if unsafe { raw::$name }.is_none() { return Some(stringify!($name)); } )*
            None
        }};
    }
    first_missing!(
        RedisModule_OpenKey,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_ValueLength,
        RedisModule_ZsetFirstInScoreRange,
        RedisModule_ZsetLastInScoreRange,
        RedisModule_ZsetRangeEndReached,
        RedisModule_ZsetRangeStop,
        RedisModule_ZsetRangeNext,
        RedisModule_ZsetRangePrev,
        RedisModule_ZsetRangeCurrentElement,
        RedisModule_ZsetAdd,
        RedisModule_ZsetRem,
        RedisModule_DeleteKey,
        RedisModule_GetExpire,
        RedisModule_SetExpire,
        RedisModule_Replicate,
        RedisModule_ReplicateVerbatim,
        RedisModule_GetContextFlags,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_CreateString,
        RedisModule_CreateStringFromLongLong,
        RedisModule_FreeString,
        RedisModule_StringPtrLen,
        RedisModule_Milliseconds,
        RedisModule_WrongArity,
        RedisModule_ReplyWithLongLong,
        RedisModule_ReplyWithArray,
        RedisModule_ReplyWithError,
        RedisModule_SetModuleOptions,
        RedisModule_SignalModifiedKey,
        // The compact form (its callbacks run only once its type is registered).
        RedisModule_CreateDataType,
        RedisModule_ModuleTypeGetType,
        RedisModule_ModuleTypeGetValue,
        RedisModule_ModuleTypeSetValue,
        RedisModule_ModuleTypeReplaceValue,
        RedisModule_SaveUnsigned,
        RedisModule_LoadUnsigned,
        RedisModule_SaveStringBuffer,
        RedisModule_LoadStringBuffer,
        RedisModule_IsIOError,
        RedisModule_EmitAOF,
        RedisModule_DigestAddStringBuffer,
        RedisModule_DigestEndSequence,
        RedisModule_Free,
        RedisModule_Log,
        RedisModule_LogIOError,
    )
}

/// Sets the module's options, once, at load (`RedisModule_SetModuleOptions`
/// replaces them all at each call):
/// - the module signals a modified key itself ([`signal_modified`]): the
///   server would otherwise signal every key a command opened for writing,
///   so a rejection that changed nothing would abort a WATCH and send a
///   client-side-caching invalidation (docs/commands.md, "WATCH and
///   client-side caching");
/// - with the compact type: a short read while loading sets an error the
///   loader checks, instead of aborting the server (and so allows diskless
///   replica loads); and as the module keeps no state outside its keys, an
///   asynchronous (swapdb) load into a second keyspace is safe.
pub fn set_module_options(ctx: *mut raw::RedisModuleCtx, compact_type: bool) {
    let mut options = raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
    if compact_type {
        options |= raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS | raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD;
    }
    // SAFETY: the load context; checked present by `missing_api`.
    unsafe { api!(RedisModule_SetModuleOptions)(ctx, options as c_int) };
}

/// Tells the server that the key `name` changed (WATCH, client-side
/// caching): after every call that changed what a key stores, and only then.
pub fn signal_modified(ctx: *mut raw::RedisModuleCtx, name: *mut raw::RedisModuleString) {
    // SAFETY: the context and a key name of the call being executed.
    unsafe { api!(RedisModule_SignalModifiedKey)(ctx, name) };
}

/// The server's clock, in milliseconds.
#[inline]
pub fn milliseconds() -> i64 {
    // SAFETY: a plain read of the server clock.
    unsafe { api!(RedisModule_Milliseconds)() }
}

/// The arguments of the executing command, borrowed for `body` only.
/// `argv` and `argc` are what the server passed to the executing handler
/// (its callers are the handlers of commands.rs, with their own).
#[inline]
pub fn with_arguments<R>(
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    body: impl FnOnce(&[&raw::RedisModuleString]) -> R,
) -> R {
    // SAFETY: the server hands `argc` valid, non-null strings in `argv` for
    // this call, so each is a live `&RedisModuleString` while `body` runs.
    let strings = unsafe { std::slice::from_raw_parts(argv as *const &raw::RedisModuleString, argc.max(0) as usize) };
    body(strings)
}

/// Arguments read into a buffer on the stack; a longer call (three tiers or
/// more with every option) reads them into a Vec. 16 holds name key window
/// limit, two TIERs, COST c NOW t DETAILS STAMP.
const STACK_WORDS: usize = 16;

/// The bytes of every one of `strings`, for `body`: on the stack for up to
/// STACK_WORDS of them (the usual call allocates nothing).
#[inline]
pub fn with_words<R>(strings: &[&raw::RedisModuleString], body: impl FnOnce(&[&[u8]]) -> R) -> R {
    if strings.len() > STACK_WORDS {
        let heap: Vec<&[u8]> = strings.iter().map(|&string| bytes_of(string)).collect();
        return body(&heap);
    }
    // Only the words of this call are written (zeroing all 16 took six
    // instruction-cache lines of every call).
    let mut stack = [MaybeUninit::<&[u8]>::uninit(); STACK_WORDS];
    for (word, &string) in stack.iter_mut().zip(strings) {
        word.write(bytes_of(string));
    }
    // SAFETY: the first `strings.len()` elements were written just above.
    body(unsafe { std::slice::from_raw_parts(stack.as_ptr() as *const &[u8], strings.len()) })
}

/// Replies an integer to the executing command (`ctx`).
#[inline]
pub fn reply_i64(ctx: *mut raw::RedisModuleCtx, value: i64) {
    // SAFETY: the context of the executing command.
    unsafe { api!(RedisModule_ReplyWithLongLong)(ctx, value) };
}

/// Opens an array reply of `len` elements, the replies that follow.
#[inline]
pub fn reply_array(ctx: *mut raw::RedisModuleCtx, len: usize) {
    // SAFETY: the context of the executing command.
    unsafe { api!(RedisModule_ReplyWithArray)(ctx, len as _) };
}

/// Replies a simple string.
pub fn reply_simple_string(ctx: *mut raw::RedisModuleCtx, text: &CStr) {
    // SAFETY: the context of the executing command; `text` is NUL-terminated.
    unsafe { api!(RedisModule_ReplyWithSimpleString)(ctx, text.as_ptr()) };
}

/// Replies an error (`message` starts with its code, e.g. `ERR`).
pub fn reply_error(ctx: *mut raw::RedisModuleCtx, message: &str) {
    let text = CString::new(message).unwrap_or_else(|_| c"ERR invalid error text".to_owned());
    // SAFETY: the executing command's context; `text` is NUL-terminated and outlives the call.
    unsafe { api!(RedisModule_ReplyWithError)(ctx, text.as_ptr()) };
}

/// Replies the server's wrong-number-of-arguments error.
pub fn reply_wrong_arity(ctx: *mut raw::RedisModuleCtx) {
    // SAFETY: the context of the executing command.
    unsafe { api!(RedisModule_WrongArity)(ctx) };
}

/// Whether the executing command comes from the replication link or the
/// AOF being loaded.
pub fn from_primary_or_aof(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: the context of the executing command.
    let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx) } as u32;
    flags & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0
}

/// Replicates the executing command as it was given.
pub fn replicate_verbatim(ctx: *mut raw::RedisModuleCtx) {
    // SAFETY: the context of the executing command.
    unsafe { api!(RedisModule_ReplicateVerbatim)(ctx) };
}

/// An open key, closed on drop (also when unwinding from a panic). Its raw
/// handles are the border's: a key is opened by [`Key::open`] or lent by
/// [`Key::lent`], never built by hand.
pub struct Key {
    ctx: *mut raw::RedisModuleCtx,
    raw: *mut raw::RedisModuleKey,
    name: *mut raw::RedisModuleString,
}

impl Key {
    /// Opens `name` (a string of the executing command, or one it owns) for
    /// reading, or for reading and writing.
    pub fn open(ctx: *mut raw::RedisModuleCtx, name: &raw::RedisModuleString, writable: bool) -> Key {
        let mode = if writable {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        let name = raw_of(name);
        // SAFETY: the executing command's context and a live string.
        let raw = unsafe { api!(RedisModule_OpenKey)(ctx, name, mode as c_int) };
        Key { ctx, raw, name }
    }

    /// A key the server opened and lends to a callback (the `Key` event's
    /// key info): usable as a `Key`, never closed by this module.
    ///
    /// # Safety
    /// `raw` must be a key open for reading for as long as the result is
    /// used, within the callback that was given it with `ctx`.
    unsafe fn lent(ctx: *mut raw::RedisModuleCtx, raw: *mut raw::RedisModuleKey) -> ManuallyDrop<Key> {
        ManuallyDrop::new(Key {
            ctx,
            raw,
            name: ptr::null_mut(),
        })
    }

    /// A stand-in that holds no key (closes nothing).
    pub fn detached() -> Key {
        Key {
            ctx: ptr::null_mut(),
            raw: ptr::null_mut(),
            name: ptr::null_mut(),
        }
    }

    /// The context the key was opened with.
    pub fn ctx(&self) -> *mut raw::RedisModuleCtx {
        self.ctx
    }

    /// `RedisModule_KeyType` (`REDISMODULE_KEYTYPE_*`).
    pub fn key_type(&self) -> isize {
        // SAFETY: the key is open (or null: KeyType answers EMPTY).
        (unsafe { api!(RedisModule_KeyType)(self.raw) }) as isize
    }

    pub fn is_empty(&self) -> bool {
        self.key_type() == raw::REDISMODULE_KEYTYPE_EMPTY
    }

    /// Deletes the key (`&mut`: no value of it is borrowed meanwhile).
    pub fn delete(&mut self) {
        // SAFETY: the key is open for writing.
        unsafe { api!(RedisModule_DeleteKey)(self.raw) };
    }

    /// Milliseconds until the key expires, or `None` without an expiry.
    pub fn ttl_ms(&self) -> Option<i64> {
        // SAFETY: the key is open and holds a value.
        let remaining_ms = unsafe { api!(RedisModule_GetExpire)(self.raw) };
        (remaining_ms != raw::REDISMODULE_NO_EXPIRE as i64).then_some(remaining_ms)
    }

    /// Sets the key to expire at `expire_at_ms` (replication is the form's).
    pub fn set_expiry(&self, expire_at_ms: i64) {
        // SAFETY: the key is open for writing and holds a value.
        unsafe {
            match raw::RedisModule_SetAbsExpire {
                Some(set_abs) => set_abs(self.raw, expire_at_ms),
                None => api!(RedisModule_SetExpire)(self.raw, (expire_at_ms - milliseconds()).max(1)),
            };
        }
        self.notify(raw::NotifyEvent::GENERIC, c"expire");
    }

    /// Replicates `PEXPIREAT key expire_at_ms`.
    pub fn replicate_pexpireat(&self, expire_at_ms: i64) {
        // SAFETY: "s" the key name, "l" a long long.
        unsafe {
            api!(RedisModule_Replicate)(
                self.ctx,
                c"PEXPIREAT".as_ptr(),
                c"sl".as_ptr(),
                self.name,
                expire_at_ms as std::ffi::c_longlong,
            )
        };
    }

    /// Replicates `DEL key`.
    pub fn replicate_del(&self) {
        // SAFETY: "s" the key name.
        unsafe { api!(RedisModule_Replicate)(self.ctx, c"DEL".as_ptr(), c"s".as_ptr(), self.name) };
    }

    /// Replicates `ZREMRANGEBYSCORE key -inf cutoff_ms`.
    pub fn replicate_zremrangebyscore(&self, cutoff_ms: i64) {
        // SAFETY: "s" the key name, "c" a C string, "l" a long long.
        unsafe {
            api!(RedisModule_Replicate)(
                self.ctx,
                c"ZREMRANGEBYSCORE".as_ptr(),
                c"scl".as_ptr(),
                self.name,
                c"-inf".as_ptr(),
                cutoff_ms as std::ffi::c_longlong,
            )
        };
    }

    /// Replicates `ZADD key at_ms member` (one member: no vector to build).
    #[inline]
    pub fn replicate_zadd_one(&self, at_ms: i64, member: &Owned) {
        // SAFETY: "s" the key name, "l" a long long, "s" a live string.
        unsafe {
            api!(RedisModule_Replicate)(
                self.ctx,
                c"ZADD".as_ptr(),
                c"sls".as_ptr(),
                self.name,
                at_ms as std::ffi::c_longlong,
                member.string,
            )
        };
    }

    /// Replicates `command key first [second]`, each a binary-safe string.
    #[inline]
    pub fn replicate_bytes(&self, command: &CStr, first: &[u8], second: Option<&[u8]>) {
        let replicate = api!(RedisModule_Replicate);
        // SAFETY: "s" the key name, "b" a buffer and its length (each "b" one).
        unsafe {
            match second {
                None => replicate(
                    self.ctx,
                    command.as_ptr(),
                    c"sb".as_ptr(),
                    self.name,
                    first.as_ptr() as *const c_char,
                    first.len(),
                ),
                Some(second) => replicate(
                    self.ctx,
                    command.as_ptr(),
                    c"sbb".as_ptr(),
                    self.name,
                    first.as_ptr() as *const c_char,
                    first.len(),
                    second.as_ptr() as *const c_char,
                    second.len(),
                ),
            };
        }
    }

    /// Replicates `command key s1 s2 ...` (ZREM with members, ZADD with
    /// score/member pairs).
    pub fn replicate_strings(&self, command: &CStr, strings: &[&Owned]) {
        let argv: Vec<*mut raw::RedisModuleString> = strings.iter().map(|s| s.string).collect();
        // SAFETY: "s" the key name, "v" an array of live strings and its length;
        // RedisModule_Replicate retains what it needs.
        unsafe {
            api!(RedisModule_Replicate)(
                self.ctx,
                command.as_ptr(),
                c"sv".as_ptr(),
                self.name,
                argv.as_ptr(),
                argv.len(),
            )
        };
    }

    /// Fires the keyspace event `event` of `class` on this key.
    pub fn notify(&self, class: raw::NotifyEvent, event: &CStr) {
        // SAFETY: the context and the key name belong to this call.
        unsafe { api!(RedisModule_NotifyKeyspaceEvent)(self.ctx, class.bits(), event.as_ptr(), self.name) };
    }

    /// Tells the server this key changed (see [`signal_modified`]).
    pub fn signal_modified(&self) {
        signal_modified(self.ctx, self.name);
    }

    /// Entries of the sorted set (or the value's length).
    #[inline]
    pub fn value_length(&self) -> u64 {
        // SAFETY: the key is open.
        unsafe { api!(RedisModule_ValueLength)(self.raw) as u64 }
    }

    /// Positions the range iterator of this (non-empty sorted set) key on
    /// the first (or last) entry scored in the range; false if there is none.
    #[inline]
    pub fn zset_seek(&self, min: f64, max: f64, min_exclusive: bool, first: bool) -> bool {
        let seek = if first {
            api!(RedisModule_ZsetFirstInScoreRange)
        } else {
            api!(RedisModule_ZsetLastInScoreRange)
        };
        // SAFETY: the key is an open, non-empty sorted set (the caller's
        // check; on any other key the server answers an error).
        unsafe {
            seek(self.raw, min, max, min_exclusive as c_int, 0) == raw::REDISMODULE_OK as c_int
                && api!(RedisModule_ZsetRangeEndReached)(self.raw) == 0
        }
    }

    /// The member (null if the iterator is on none) and score under the
    /// range iterator. The member is freed by `Owned`.
    #[inline]
    pub fn zset_current(&self) -> (Owned, f64) {
        let mut score = 0.0;
        // SAFETY: the key is open; the member is handed over and freed by `Owned`.
        let member = unsafe { api!(RedisModule_ZsetRangeCurrentElement)(self.raw, &mut score) };
        (Owned::adopt(self.ctx, member), score)
    }

    /// Moves the range iterator to the next entry; false past the range.
    #[inline]
    pub fn zset_next(&self) -> bool {
        // SAFETY: the key is open (an iterator not started answers 0).
        unsafe { api!(RedisModule_ZsetRangeNext)(self.raw) != 0 }
    }

    /// Moves the range iterator to the previous entry; false before the range.
    #[inline]
    pub fn zset_prev(&self) -> bool {
        // SAFETY: the key is open (an iterator not started answers 0).
        unsafe { api!(RedisModule_ZsetRangePrev)(self.raw) != 0 }
    }

    /// Stops the range iterator (a no-op when none is started).
    #[inline]
    pub fn zset_stop(&self) {
        // SAFETY: the key is open.
        unsafe { api!(RedisModule_ZsetRangeStop)(self.raw) };
    }

    /// `ZADD NX key score member`: `None` if the server refused (not a
    /// sorted set, a NaN score), else whether the member was added (false:
    /// it existed).
    #[inline]
    pub fn zset_add_nx(&self, score: f64, member: &Owned) -> Option<bool> {
        let mut flags = raw::REDISMODULE_ZADD_NX as c_int;
        // SAFETY: the key is open; `member` is a live string.
        let status = unsafe { api!(RedisModule_ZsetAdd)(self.raw, score, member.string, &mut flags) };
        (status == raw::REDISMODULE_OK as c_int).then_some(flags & raw::REDISMODULE_ZADD_ADDED as c_int != 0)
    }

    /// `ZREM key member` (no iterator may walk the key meanwhile).
    #[inline]
    pub fn zset_rem(&self, member: &Owned) {
        // SAFETY: the key is open for writing; `member` is a live string.
        unsafe { api!(RedisModule_ZsetRem)(self.raw, member.string, ptr::null_mut()) };
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: `raw` came from OpenKey and is closed exactly once, here.
            unsafe { api!(RedisModule_CloseKey)(self.raw) };
        }
    }
}

/// A RedisModuleString this module created or was handed, freed on drop.
pub struct Owned {
    ctx: *mut raw::RedisModuleCtx,
    string: *mut raw::RedisModuleString,
}

impl Owned {
    pub fn from_bytes(ctx: *mut raw::RedisModuleCtx, bytes: &[u8]) -> Self {
        // SAFETY: `bytes` is valid for its length; the string is freed by `Owned`.
        let string = unsafe { api!(RedisModule_CreateString)(ctx, bytes.as_ptr() as *const c_char, bytes.len()) };
        Owned { ctx, string }
    }

    pub fn from_i64(ctx: *mut raw::RedisModuleCtx, value: i64) -> Self {
        // SAFETY: a new string, freed by `Owned`.
        let string = unsafe { api!(RedisModule_CreateStringFromLongLong)(ctx, value) };
        Owned { ctx, string }
    }

    /// Takes ownership of a string the server handed over.
    pub fn adopt(ctx: *mut raw::RedisModuleCtx, string: *mut raw::RedisModuleString) -> Self {
        Owned { ctx, string }
    }

    /// Whether the server handed over no string.
    pub fn is_null(&self) -> bool {
        self.string.is_null()
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: an owned string is live until it is dropped, so for the
        // borrow of `self`.
        unsafe { self.string.as_ref() }.map_or(&[], bytes_of)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.string.is_null() {
            // SAFETY: created by this module (or handed over by the server,
            // which transfers ownership) and freed exactly once.
            unsafe { api!(RedisModule_FreeString)(self.ctx, self.string) };
        }
    }
}

/// The bytes of a module string, borrowed as long as the string is (a
/// reference to one is made here: [`with_arguments`], `Owned::bytes`,
/// a callback's key).
#[inline]
pub fn bytes_of(string: &raw::RedisModuleString) -> &[u8] {
    let mut len = 0usize;
    // SAFETY: a live string (a reference); StringPtrLen returns a pointer to
    // `len` bytes it owns, which live as long as it does.
    unsafe {
        let data = api!(RedisModule_StringPtrLen)(string, &mut len);
        std::slice::from_raw_parts(data as *const u8, len)
    }
}

/// The raw pointer of a borrowed string, for the module API (which takes
/// `*mut` but, for these calls, only reads the string or counts a reference).
#[inline]
pub fn raw_of(string: &raw::RedisModuleString) -> *mut raw::RedisModuleString {
    std::ptr::from_ref(string).cast_mut()
}
