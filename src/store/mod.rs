//! Where a window lives: the one folder that touches keys.
//!
//! A window is stored in one of two forms, side by side:
//! - [`zset`]: a sorted set, the layout of the article's script and of the
//!   Lua fallback (`src/lua/`), so deployments move between them freely;
//! - [`compact`]: the module's own data type `xcloaklog`, the log as
//!   bit-packed blocks of runs ([`encoding`], pure Rust), about a byte per request.
//!
//! Both implement [`Log`], so `window.rs` decides the same way over either.
//! The form applies to keys a call *creates* ([`set_creation_form`], the
//! `STORAGE` load argument / `xcloak.storage`): an existing key keeps its form,
//! and a window that empties is recreated in the configured form by its next
//! admission. This file holds what both forms share: the checked API calls,
//! the open key, the record of what a call changed, and the commit that sets
//! the expiry, replicates the effects and fires the keyspace events.

pub mod compact;
pub mod zset;

use std::ffi::{c_char, c_int};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use redis_module::raw;

use compact::CompactLog;
use xcloak_core::window::Log;
use zset::ZsetLog;

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// Margin added to the window for the key's TTL (see `docs/design.md`).
pub const TTL_MARGIN_MS: i64 = 1000;

/// An admission leaves the key's expiry alone while it is still more than
/// `window + TTL_MARGIN_MS - TTL_REFRESH_SLACK_MS` away: a busy key re-arms
/// (and replicates `PEXPIREAT`) at most every 500 ms instead of on every
/// admission, and the TTL after an admission stays in (window + 500, window + 1000].
pub const TTL_REFRESH_SLACK_MS: i64 = 500;

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

/// The two forms of a window (named as `STORAGE` and `XCLOAK.CONVERT` name them).
pub use xcloak_core::args::Storage as Form;

static CREATION_FORM: AtomicU8 = AtomicU8::new(0);

/// The form of the keys calls create from now on. `Compact` needs the type
/// registered (`compact::register`); config.rs checks that before calling.
pub fn set_creation_form(form: Form) {
    CREATION_FORM.store(form as u8, Relaxed);
}

pub fn creation_form() -> Form {
    // Never a compact key without its type: it could not be freed.
    if CREATION_FORM.load(Relaxed) == Form::Compact as u8 && compact::registered() {
        Form::Compact
    } else {
        Form::Zset
    }
}

/// An open key, closed on drop (also when unwinding from a panic). Its raw
/// handles are the store's: above it, a key is opened by [`Key::open`] or
/// lent by [`Key::lent`], never built by hand.
pub struct Key {
    pub(in crate::store) ctx: *mut raw::RedisModuleCtx,
    pub(in crate::store) raw: *mut raw::RedisModuleKey,
    pub(in crate::store) name: *mut raw::RedisModuleString,
}

/// What an open key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    Nothing,
    Window(Form),
    OtherType,
}

impl Key {
    /// Opens `name` for reading, or for reading and writing.
    ///
    /// # Safety
    /// `ctx` and `name` must be the live context and a string of the command
    /// being executed.
    pub unsafe fn open(ctx: *mut raw::RedisModuleCtx, name: *mut raw::RedisModuleString, writable: bool) -> Key {
        let mode = if writable {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        // SAFETY: the caller's promise: the live context and a string of this call.
        let raw = unsafe { api!(RedisModule_OpenKey)(ctx, name, mode as c_int) };
        Key { ctx, raw, name }
    }

    /// A key the server opened and lends to a callback (the `Key` event's
    /// key info): usable as a `Key`, never closed by this module.
    ///
    /// # Safety
    /// `raw` must be a key open for reading for as long as the result is
    /// used, within the callback that was given it with `ctx`.
    pub unsafe fn lent(ctx: *mut raw::RedisModuleCtx, raw: *mut raw::RedisModuleKey) -> ManuallyDrop<Key> {
        ManuallyDrop::new(Key {
            ctx,
            raw,
            name: std::ptr::null_mut(),
        })
    }

    /// A stand-in that holds no key (closes nothing).
    fn detached() -> Key {
        Key {
            ctx: std::ptr::null_mut(),
            raw: std::ptr::null_mut(),
            name: std::ptr::null_mut(),
        }
    }

    pub fn holds(&self) -> Holds {
        // SAFETY: the key is open.
        let key_type = unsafe { api!(RedisModule_KeyType)(self.raw) } as isize;
        if key_type == raw::REDISMODULE_KEYTYPE_EMPTY {
            Holds::Nothing
        } else if key_type == raw::REDISMODULE_KEYTYPE_ZSET {
            Holds::Window(Form::Zset)
        } else if compact::is_ours(self) {
            Holds::Window(Form::Compact)
        } else {
            Holds::OtherType
        }
    }

    pub fn is_empty(&self) -> bool {
        // SAFETY: the key is open (or null: KeyType answers EMPTY).
        (unsafe { api!(RedisModule_KeyType)(self.raw) }) as isize == raw::REDISMODULE_KEYTYPE_EMPTY
    }

    pub fn delete(&self) {
        // SAFETY: the key is open for writing.
        unsafe { api!(RedisModule_DeleteKey)(self.raw) };
    }

    /// Milliseconds until the key expires, or `None` without an expiry.
    pub fn ttl_ms(&self) -> Option<i64> {
        // SAFETY: the key is open and holds a value.
        let remaining_ms = unsafe { api!(RedisModule_GetExpire)(self.raw) };
        (remaining_ms != raw::REDISMODULE_NO_EXPIRE as i64).then_some(remaining_ms)
    }

    /// Whether the key has no expiry, or one within `ttl_ms - TTL_REFRESH_SLACK_MS` from now.
    fn needs_expiry(&self, ttl_ms: i64) -> bool {
        self.ttl_ms()
            .is_none_or(|remaining_ms| remaining_ms <= ttl_ms - TTL_REFRESH_SLACK_MS)
    }

    /// Sets the key to expire at `expire_at_ms` (replication is the form's).
    pub fn set_expiry(&self, expire_at_ms: i64) {
        // SAFETY: the key is open for writing and holds a value.
        unsafe {
            match raw::RedisModule_SetAbsExpire {
                Some(set_abs) => set_abs(self.raw, expire_at_ms),
                None => api!(RedisModule_SetExpire)(self.raw, (expire_at_ms - api!(RedisModule_Milliseconds)()).max(1)),
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

    fn notify(&self, class: raw::NotifyEvent, event: &std::ffi::CStr) {
        // SAFETY: the context and the key name belong to this call.
        unsafe { api!(RedisModule_NotifyKeyspaceEvent)(self.ctx, class.bits(), event.as_ptr(), self.name) };
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

/// What a write call did to a log, for replication and keyspace events.
#[derive(Clone, Copy, Debug, Default)]
pub struct Changes {
    /// Entries removed by `trim`, and the cutoff it used.
    pub trimmed: u64,
    pub cutoff_ms: i64,
    /// Entries added by `record`, and their stamp.
    pub added: u64,
    pub added_at_ms: i64,
    /// Entries removed by `remove_at` (a refund), and their stamp.
    pub removed: u64,
    pub removed_at_ms: i64,
}

/// A window opened by a command, in whichever form its key holds.
pub enum Window {
    Zset(ZsetLog),
    Compact(CompactLog),
}

/// How a key was found when opened.
pub enum Opened {
    Ready(Window),
    WrongType,
}

/// Opens the window at `name`: its key's form, or for a missing key the
/// form keys are created in.
///
/// # Safety
/// `ctx` and `name` must be the live context and an argument of the command
/// being executed.
pub unsafe fn open(ctx: *mut raw::RedisModuleCtx, name: *mut raw::RedisModuleString, writable: bool) -> Opened {
    // SAFETY: the caller's promise (this fn's own contract).
    let key = unsafe { Key::open(ctx, name, writable) };
    match key.holds() {
        Holds::Window(form) => Opened::Ready(Window::new(key, form)),
        Holds::Nothing => Opened::Ready(Window::new(key, creation_form())),
        Holds::OtherType => Opened::WrongType,
    }
}

/// Fires the keyspace events of what a call did to a log, the same for both
/// forms (and on a replica applying the compact form's effects).
pub fn announce(key: &Key, changes: &Changes) {
    if changes.removed > 0 {
        key.notify(raw::NotifyEvent::ZSET, c"zrem");
        if key.is_empty() && changes.added == 0 {
            key.notify(raw::NotifyEvent::GENERIC, c"del");
        }
    }
    if changes.trimmed > 0 {
        key.notify(raw::NotifyEvent::ZSET, c"zremrangebyscore");
        if key.is_empty() && changes.added == 0 {
            key.notify(raw::NotifyEvent::GENERIC, c"del");
        }
    }
    if changes.added > 0 {
        key.notify(raw::NotifyEvent::ZSET, c"zadd");
    }
}

/// Dispatches a call to the open form.
macro_rules! each_form {
    ($window:expr, $log:ident => $body:expr) => {
        match $window {
            Window::Zset($log) => $body,
            Window::Compact($log) => $body,
        }
    };
}

impl Window {
    fn new(key: Key, form: Form) -> Window {
        match form {
            Form::Zset => Window::Zset(ZsetLog::new(key)),
            Form::Compact => Window::Compact(CompactLog::new(key)),
        }
    }

    fn form(&self) -> Form {
        match self {
            Window::Zset(_) => Form::Zset,
            Window::Compact(_) => Form::Compact,
        }
    }

    fn key(&self) -> &Key {
        each_form!(self, log => &log.key)
    }

    fn changes(&self) -> &Changes {
        each_form!(self, log => &log.changes)
    }

    /// Ends a write call: replicates and announces what changed; after an
    /// admission, sets the key to expire `ttl_ms` after `server_ms`, unless it
    /// already expires more than `ttl_ms - TTL_REFRESH_SLACK_MS` from now (so
    /// an expiry is never shortened: a server clock that stepped back must not
    /// cut short entries stamped before the step).
    pub fn commit(&self, server_ms: i64, ttl_ms: i64) {
        let expire_at_ms = (self.changes().added > 0 && self.key().needs_expiry(ttl_ms)).then_some(server_ms + ttl_ms);
        self.publish_changes(expire_at_ms);
        if let Some(expire_at_ms) = expire_at_ms {
            self.key().set_expiry(expire_at_ms);
        }
    }

    /// Ends a call that only removed entries (a refund): replicates and
    /// announces it; the expiry is left as it is.
    pub fn commit_removal(&self) {
        self.publish_changes(None);
    }

    /// Replicates the changes (as this form's effects, with the expiry to
    /// set, if any) and fires the keyspace events, the same for both forms.
    fn publish_changes(&self, expire_at_ms: Option<i64>) {
        let (key, changes) = (self.key(), self.changes());
        if changes.trimmed == 0 && changes.added == 0 && changes.removed == 0 {
            return;
        }
        each_form!(self, log => log.replicate_changes(expire_at_ms));
        announce(key, changes);
        signal_modified(key.ctx, key.name);
    }

    /// Before the first entry goes into a key that this call emptied (or
    /// found missing), makes it the configured form: the changes so far are
    /// published in the old form's terms, and the new form starts clean.
    fn recreate_in_configured_form(&mut self) {
        let wanted = creation_form();
        if wanted == self.form() || !self.key().is_empty() {
            return;
        }
        let old = std::mem::replace(self, Window::Zset(ZsetLog::new(Key::detached())));
        old.publish_changes(None);
        let key = match old {
            Window::Zset(log) => log.key,
            Window::Compact(log) => log.key,
        };
        *self = Window::new(key, wanted);
    }
}

impl Log for Window {
    fn len(&self) -> u64 {
        each_form!(self, log => log.len())
    }
    fn count_expired(&self, cutoff_ms: i64) -> u64 {
        each_form!(self, log => log.count_expired(cutoff_ms))
    }
    fn trim(&mut self, cutoff_ms: i64) -> u64 {
        each_form!(self, log => log.trim(cutoff_ms))
    }
    fn nth_live(&self, cutoff_ms: i64, n: u64) -> Option<i64> {
        each_form!(self, log => log.nth_live(cutoff_ms, n))
    }
    fn newest(&self) -> Option<i64> {
        each_form!(self, log => log.newest())
    }
    fn record(&mut self, now_ms: i64, cost: u64) {
        self.recreate_in_configured_form();
        each_form!(self, log => log.record(now_ms, cost))
    }
    fn remove_at(&mut self, stamp_ms: i64, count: u64) -> u64 {
        each_form!(self, log => log.remove_at(stamp_ms, count))
    }
}

/// `XCLOAK.CONVERT`: rewrites the window at `name` in `to`, keeping every
/// entry and the expiry; replicated as effects (`DEL`, the new form's load,
/// `PEXPIREAT`). `Ok(false)` when the key is missing or already in `to`.
/// A sorted set gets one member per entry, so a window of more than
/// `max_entries` (the configured `MAX-LIMIT`) is refused: a restored compact
/// window can claim up to 10^9 entries in a few bytes.
///
/// # Safety
/// As for [`open`].
pub unsafe fn convert(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    to: Form,
    max_entries: u64,
) -> Result<bool, Refusal> {
    // SAFETY: the caller's promise (this fn's own contract).
    let key = unsafe { Key::open(ctx, name, true) };
    let from = match key.holds() {
        Holds::Nothing => return Ok(false),
        Holds::OtherType => return Err(Refusal::WrongType),
        Holds::Window(form) if form == to => return Ok(false),
        Holds::Window(form) => form,
    };
    let runs = match from {
        Form::Zset => zset::read_runs(&key).map_err(Refusal::Invalid)?,
        Form::Compact => compact::read_runs(&key),
    };
    let entries: u64 = runs.iter().map(|&(_, count)| count).sum();
    if to == Form::Zset && entries > max_entries {
        return Err(Refusal::Invalid(format!(
            "the window holds {entries} entries, more than xcloak.max-limit ({max_entries}); raise it to convert into a sorted set"
        )));
    }
    let expire_at_ms = key
        .ttl_ms()
        // SAFETY: a plain read of the server clock.
        .map(|ttl_ms| unsafe { api!(RedisModule_Milliseconds)() } + ttl_ms);
    key.delete();
    // SAFETY: "s" the key name.
    unsafe { api!(RedisModule_Replicate)(ctx, c"DEL".as_ptr(), c"s".as_ptr(), name) };
    match to {
        Form::Zset => zset::write_runs(&key, &runs),
        Form::Compact => compact::write_runs(&key, &runs),
    }
    if let Some(expire_at_ms) = expire_at_ms {
        key.set_expiry(expire_at_ms);
        key.replicate_pexpireat(expire_at_ms);
    }
    key.notify(raw::NotifyEvent::GENERIC, c"xcloak.convert");
    signal_modified(ctx, name);
    Ok(true)
}

/// Why a command left a key alone.
pub enum Refusal {
    WrongType,
    Invalid(String),
}

/// A RedisModuleString this module created or was handed, freed on drop.
pub struct Owned {
    ctx: *mut raw::RedisModuleCtx,
    pub string: *mut raw::RedisModuleString,
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
/// reference to one is made at the border: [`arguments`], `Owned::bytes`,
/// a callback's key).
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
pub fn raw_of(string: &raw::RedisModuleString) -> *mut raw::RedisModuleString {
    std::ptr::from_ref(string).cast_mut()
}

/// The arguments of the executing command, borrowed for the call.
///
/// # Safety
/// `argv` and `argc` must be what the server passed to the handler that is
/// executing, and the slice must not be kept past its return.
pub unsafe fn arguments<'a>(argv: *mut *mut raw::RedisModuleString, argc: c_int) -> &'a [&'a raw::RedisModuleString] {
    // SAFETY: the server hands `argc` valid, non-null strings in `argv` for
    // this call (the caller's promise), so each is a live `&RedisModuleString`.
    unsafe { std::slice::from_raw_parts(argv as *const &raw::RedisModuleString, argc.max(0) as usize) }
}
