//! The compact form of a window: the module's data type `xcloaklog`, whose
//! value is a [`RunLog`]'s root pointer (one bit-packed block, or an index of
//! blocks: `encoding.rs`), and everything that makes it a real data type: RDB
//! save/load with an encoding version (2, and 0.1.0's 1), AOF rewrite,
//! DUMP/RESTORE (and so MIGRATE and resharding), COPY, MEMORY USAGE, lazy
//! free, DEBUG DIGEST-VALUE, active defrag.
//!
//! The value is the log's own allocation, not a box around it: a window of a
//! few entries is one allocation. When a change moves it (a block that grows
//! into the next size class, a window that goes from one block to an index),
//! the key's value is swapped for the new pointer
//! (`RedisModule_ModuleTypeReplaceValue`, which frees nothing).
//!
//! The type is registered only when the module is loaded with
//! `STORAGE compact`: a server loaded without it has no module type, so
//! `MODULE UNLOAD` works and RDB/AOF hold only core types.
//!
//! Effects, not commands, are replicated: one internal command,
//! `XCLOAK.APPLY key <effect> [<canonical bytes>]` (`effect.rs`), carries
//! exactly what a call did, with explicit values and the expiry (a replica
//! never consults its own clock): one replicated command per call.
//! `XCLOAK.APPLY` runs only from the replication link or while loading the
//! AOF; a client gets an error. The AOF rewrite emits
//! `XCLOAK.APPLY key L <canonical bytes>` (the server adds the expiry).

use std::ffi::{c_char, c_int, c_void, CString};
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};

use redis_module::raw;

use xcloak_core::effect::{Effect, MAX_TEXT};
use xcloak_core::log::{RunLog, MAX_ENTRIES};
use xcloak_core::window::Log;

use super::Changes;
use crate::ffi::{api, Key};

/// `TYPE` replies this; module type names are exactly 9 characters.
pub const TYPE_NAME: &std::ffi::CStr = c"xcloaklog";

/// The RDB encoding this module writes: 2, bit-packed groups of runs
/// (`RunLog::encode`). It also reads 1, the varint runs 0.1.0 wrote. A payload
/// of a later version (from a newer module) is refused with a log line, never
/// guessed at.
pub const ENCODING_VERSION: c_int = 2;

/// 0.1.0's RDB encoding: the varint runs (`RunLog::encode_runs`), still read.
const ENCODING_VERSION_RUNS: c_int = 1;

/// The server's own wrapper around a module value (its object header and
/// the type/value pair), counted in `MEMORY USAGE` like a core type's header.
const SERVER_WRAPPER_BYTES: usize = 32;

static TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// Whether the type is registered (the module was loaded with `STORAGE compact`).
pub fn registered() -> bool {
    !TYPE.load(Relaxed).is_null()
}

/// The type's `unlink` callback: `eviction::compact_unlinked`, passed in by
/// lib.rs so that the store never imports what sits above it.
pub type UnlinkHook = extern "C" fn(*mut raw::RedisModuleString, *const c_void);

/// Registers `xcloaklog`, with `unlink` as its unlink callback (it names the
/// key for the `evicted` event that follows). Call from `OnLoad` only.
pub fn register(ctx: *mut raw::RedisModuleCtx, unlink: UnlinkHook) -> Result<(), String> {
    // SAFETY: reading the function table the server filled in at load.
    let defrag_api = unsafe { raw::RedisModule_DefragAlloc }.is_some();
    let mut methods = raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: Some(free_effort),
        unlink: Some(unlink),
        copy: Some(copy),
        defrag: if defrag_api { Some(defrag) } else { None },
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    };
    // SAFETY: the load context, a NUL-terminated static name, and methods the
    // server copies.
    let created = unsafe { api!(RedisModule_CreateDataType)(ctx, TYPE_NAME.as_ptr(), ENCODING_VERSION, &mut methods) };
    if created.is_null() {
        return Err("could not register the data type xcloaklog (STORAGE compact)".to_string());
    }
    TYPE.store(created, Relaxed);
    // The type's load options (short reads, swapdb loads) are set with the
    // module's others, once: `store::set_module_options`.
    Ok(())
}

/// Whether the open `key` holds this module's type.
pub fn is_ours(key: &Key) -> bool {
    let ours = TYPE.load(Relaxed);
    // SAFETY: the key is open.
    !ours.is_null() && unsafe { api!(RedisModule_ModuleTypeGetType)(key.raw()) } == ours
}

/// The root of the log stored at `key`, or null if the key holds none.
fn value_of(key: &Key) -> *mut u8 {
    if !is_ours(key) {
        return ptr::null_mut();
    }
    // SAFETY: the key holds our type, whose values are RunLog roots.
    unsafe { api!(RedisModule_ModuleTypeGetValue)(key.raw()) as *mut u8 }
}

/// Runs `read` on the log whose root the server holds at `value` (null: none).
fn with_log<T>(value: *mut u8, read: impl FnOnce(Option<&RunLog>) -> T) -> T {
    // SAFETY: a non-null value is a root this module handed to the server; it
    // is borrowed here and never dropped (ManuallyDrop).
    let log = ManuallyDrop::new(unsafe { RunLog::from_raw(value) });
    read((!value.is_null()).then_some(&*log))
}

/// Stores `log` at the (open, writable) `key`, replacing what it held.
fn set_value(key: &Key, log: RunLog) -> *mut u8 {
    let value = log.into_raw();
    // SAFETY: the key is open for writing; the server owns `value` from now
    // on and frees it through `free`.
    unsafe { api!(RedisModule_ModuleTypeSetValue)(key.raw(), TYPE.load(Relaxed), value as *mut c_void) };
    value
}

/// A window held in the compact type, open for one call.
pub struct CompactLog {
    pub key: Key,
    pub changes: Changes,
    /// The key's log, borrowed from the server: never dropped here (the
    /// server frees it through `free`); empty while the key holds none.
    log: ManuallyDrop<RunLog>,
    /// The root the server holds for the key; null while it holds none.
    stored: *mut u8,
}

impl CompactLog {
    pub fn new(key: Key) -> CompactLog {
        let stored = value_of(&key);
        // SAFETY: as in `with_log`; only this struct changes the key's value
        // while it is open.
        let log = ManuallyDrop::new(unsafe { RunLog::from_raw(stored) });
        CompactLog {
            key,
            changes: Changes::default(),
            log,
            stored,
        }
    }

    fn log(&self) -> Option<&RunLog> {
        (!self.stored.is_null()).then_some(&*self.log)
    }

    /// After a change: the key's value is the log's root again.
    fn sync(&mut self) {
        let root = self.log.as_raw();
        if root != self.stored && !self.stored.is_null() {
            let mut old: *mut c_void = ptr::null_mut();
            // SAFETY: the key is open for writing and holds our type; the old
            // root was already freed or reused by the log (nothing is freed here).
            unsafe {
                api!(RedisModule_ModuleTypeReplaceValue)(
                    self.key.raw(),
                    TYPE.load(Relaxed),
                    root as *mut c_void,
                    &mut old,
                )
            };
            self.stored = root;
        }
    }

    /// An empty window leaves no key.
    fn delete_if_empty(&mut self) {
        if self.log().is_some_and(RunLog::is_empty) {
            self.sync();
            // The server frees the root through `free`.
            self.key.delete();
            self.log = ManuallyDrop::new(RunLog::default());
            self.stored = ptr::null_mut();
        }
    }

    /// Replicates the call's changes, and the expiry to set, as one
    /// `XCLOAK.APPLY key <effect>`.
    pub fn replicate_changes(&self, expire_at_ms: Option<i64>) {
        let Changes {
            trimmed,
            cutoff_ms,
            added,
            added_at_ms,
            removed,
            removed_at_ms,
        } = self.changes;
        let effect = Effect {
            trim_cutoff_ms: (trimmed > 0).then_some(cutoff_ms),
            remove: (removed > 0).then_some((removed_at_ms, removed)),
            add: (added > 0).then_some((added_at_ms, added)),
            expire_at_ms,
            ..Effect::default()
        };
        if !effect.is_empty() {
            replicate_effect(&self.key, &effect, None);
        }
    }
}

/// Replicates `XCLOAK.APPLY key <effect> [<bytes>]`.
fn replicate_effect(key: &Key, effect: &Effect, bytes: Option<&[u8]>) {
    let mut text = [0u8; MAX_TEXT];
    let len = effect.write(&mut text);
    let replicate = api!(RedisModule_Replicate);
    // SAFETY: "s" the key name, "b" a buffer and its length (each "b" one).
    unsafe {
        match bytes {
            None => replicate(
                key.ctx(),
                APPLY.as_ptr(),
                c"sb".as_ptr(),
                key.name(),
                text.as_ptr() as *const c_char,
                len,
            ),
            Some(bytes) => replicate(
                key.ctx(),
                APPLY.as_ptr(),
                c"sbb".as_ptr(),
                key.name(),
                text.as_ptr() as *const c_char,
                len,
                bytes.as_ptr() as *const c_char,
                bytes.len(),
            ),
        };
    }
}

const APPLY: &std::ffi::CStr = c"XCLOAK.APPLY";

impl Log for CompactLog {
    fn len(&self) -> u64 {
        self.log().map_or(0, RunLog::len)
    }

    fn count_expired(&self, cutoff_ms: i64) -> u64 {
        self.log().map_or(0, |log| log.count_expired(cutoff_ms))
    }

    fn trim(&mut self, cutoff_ms: i64) -> u64 {
        self.changes.cutoff_ms = cutoff_ms;
        if self.stored.is_null() {
            return 0;
        }
        let removed = self.log.trim(cutoff_ms);
        if removed > 0 {
            self.sync();
            self.changes.trimmed += removed;
            self.delete_if_empty();
        }
        removed
    }

    fn nth_live(&self, cutoff_ms: i64, n: u64) -> Option<i64> {
        self.log().and_then(|log| log.nth_live(cutoff_ms, n))
    }

    fn newest(&self) -> Option<i64> {
        self.log().and_then(RunLog::newest)
    }

    fn record(&mut self, now_ms: i64, cost: u64) {
        if self.stored.is_null() {
            let mut log = RunLog::default();
            log.record(now_ms, cost);
            self.stored = set_value(&self.key, log);
            // SAFETY: the root just handed to the server, borrowed as in `new`.
            self.log = ManuallyDrop::new(unsafe { RunLog::from_raw(self.stored) });
        } else {
            self.log.record(now_ms, cost);
            self.sync();
        }
        self.changes.added += cost;
        self.changes.added_at_ms = now_ms;
    }

    fn remove_at(&mut self, stamp_ms: i64, count: u64) -> u64 {
        if self.stored.is_null() {
            return 0;
        }
        let removed = self.log.remove_at(stamp_ms, count);
        self.sync();
        if removed > 0 {
            self.changes.removed += removed;
            self.changes.removed_at_ms = stamp_ms;
        }
        self.delete_if_empty();
        removed
    }
}

/// Every entry at `key` (which holds this type) as runs, oldest first.
pub fn read_runs(key: &Key) -> Vec<(i64, u64)> {
    with_log(value_of(key), |log| {
        log.map_or_else(Vec::new, |log| log.runs().collect())
    })
}

/// Stores `runs` at the empty `key` and replicates `XCLOAK.APPLY key L <bytes>`
/// (the varint runs of encoding 1: the effect every release reads).
pub fn write_runs(key: &Key, runs: &[(i64, u64)]) {
    let log = RunLog::from_runs(runs.iter().copied());
    let mut bytes = Vec::new();
    log.encode_runs(&mut bytes);
    set_value(key, log);
    replicate_effect(
        key,
        &Effect {
            load: true,
            ..Effect::default()
        },
        Some(&bytes),
    );
}

// ---------------------------------------------------------------------------
// XCLOAK.APPLY: the replicated effect.

/// Whether the call comes from the replication link or the AOF being loaded.
pub fn from_primary_or_aof(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: the live context of this call.
    let flags = unsafe { api!(RedisModule_GetContextFlags)(ctx) } as u32;
    flags & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING) != 0
}

/// Applies `XCLOAK.APPLY key <effect> [<bytes>]` to `key`, as the primary
/// did: load, trim, remove, add, expiry; a window left empty is deleted.
pub fn apply(key: Key, effect: &Effect, bytes: Option<&[u8]>) -> Result<(), String> {
    if !key.is_empty() && !is_ours(&key) {
        return Err(super::WRONGTYPE.to_string());
    }
    let loaded = match (effect.load, bytes) {
        (true, Some(bytes)) => Some(RunLog::decode_runs(bytes).map_err(|e| format!("XCLOAK.APPLY L: {e}"))?),
        (false, None) => None,
        _ => {
            return Err("XCLOAK.APPLY takes the canonical bytes after the effect exactly when it loads (L)".to_string())
        }
    };
    if let Some((_, count)) = effect.add {
        let held = match &loaded {
            Some(log) => log.len(),
            None => with_log(value_of(&key), |log| log.map_or(0, RunLog::len)),
        };
        if held + count > MAX_ENTRIES {
            return Err(format!("XCLOAK.APPLY A would hold more than {MAX_ENTRIES} entries"));
        }
    }
    if let Some(log) = loaded {
        set_value(&key, log);
    }
    let mut window = CompactLog::new(key);
    if let Some(cutoff_ms) = effect.trim_cutoff_ms {
        window.trim(cutoff_ms);
    }
    if let Some((stamp_ms, count)) = effect.remove {
        window.remove_at(stamp_ms, count);
    }
    if let Some((stamp_ms, count)) = effect.add {
        window.record(stamp_ms, count);
    }
    super::announce(&window.key, &window.changes);
    if let (Some(expire_at_ms), false) = (effect.expire_at_ms, window.key.is_empty()) {
        window.key.set_expiry(expire_at_ms);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Data type callbacks. Each runs under `catch_unwind`: no panic crosses into C.

fn guarded<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// The log of a value the server holds, borrowed.
///
/// # Safety
/// `value` must be a value of this type (a RunLog root the server holds).
unsafe fn log_of(value: *const c_void) -> ManuallyDrop<RunLog> {
    // SAFETY: the caller's promise: a root this type handed the server; ManuallyDrop leaves it the server's.
    ManuallyDrop::new(unsafe { RunLog::from_raw(value as *mut u8) })
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guarded((), || {
        // SAFETY: the server passes a value of this type and a live IO.
        let log = unsafe { log_of(value) };
        let mut bytes = Vec::new();
        log.encode(&mut bytes);
        unsafe {
            api!(RedisModule_SaveUnsigned)(rdb, log.len());
            api!(RedisModule_SaveStringBuffer)(rdb, bytes.as_ptr() as *const c_char, bytes.len());
        }
    })
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guarded(ptr::null_mut(), || match load(rdb, encver) {
        Ok(log) => log.into_raw() as *mut c_void,
        Err(reason) => {
            log_io_warning(
                rdb,
                &format!("xcloak: refusing a compact window (xcloaklog) in the data being loaded: {reason}"),
            );
            ptr::null_mut()
        }
    })
}

fn load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> Result<RunLog, String> {
    if encver != ENCODING_VERSION && encver != ENCODING_VERSION_RUNS {
        return Err(format!(
            "its encoding version is {encver}, this module reads versions {ENCODING_VERSION_RUNS} and {ENCODING_VERSION} (load it with the module version that wrote it, or newer)"
        ));
    }
    // SAFETY: `rdb` is the live IO the server passed to this load.
    let io_error = || unsafe { api!(RedisModule_IsIOError)(rdb) } != 0;
    // SAFETY: a live IO of this type's value.
    let entries = unsafe { api!(RedisModule_LoadUnsigned)(rdb) };
    if io_error() {
        return Err("the data ends before the entry count".to_string());
    }
    let mut len = 0usize;
    let buffer = unsafe { api!(RedisModule_LoadStringBuffer)(rdb, &mut len) };
    if io_error() || buffer.is_null() {
        return Err("the data ends inside the runs".to_string());
    }
    // SAFETY: the server returned `len` bytes it allocated; freed below.
    let bytes = unsafe { std::slice::from_raw_parts(buffer as *const u8, len) };
    let decoded = if encver == ENCODING_VERSION {
        RunLog::decode(bytes)
    } else {
        RunLog::decode_runs(bytes)
    };
    // SAFETY: `buffer` came from LoadStringBuffer, is freed once, and `bytes` is not used after.
    unsafe { api!(RedisModule_Free)(buffer as *mut c_void) };
    let log = decoded.map_err(|e| format!("{e} (encoding version {encver})"))?;
    if log.len() != entries {
        return Err(format!("it says {entries} entries and holds {}", log.len()));
    }
    Ok(log)
}

/// The varint runs of encoding 1, which the AOF rewrite and DEBUG DIGEST carry.
fn runs_bytes(log: &RunLog) -> Vec<u8> {
    let mut bytes = Vec::new();
    log.encode_runs(&mut bytes);
    bytes
}

fn log_io_warning(rdb: *mut raw::RedisModuleIO, message: &str) {
    let text = CString::new(message.replace('\0', "?")).unwrap_or_default();
    // SAFETY: "%s" with one NUL-terminated string.
    unsafe { api!(RedisModule_LogIOError)(rdb, c"warning".as_ptr(), c"%s".as_ptr(), text.as_ptr()) };
}

extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, value: *mut c_void) {
    guarded((), || {
        // SAFETY: as in rdb_save.
        let bytes = runs_bytes(&*unsafe { log_of(value) });
        unsafe {
            api!(RedisModule_EmitAOF)(
                aof,
                APPLY.as_ptr(),
                c"scb".as_ptr(),
                key,
                c"L".as_ptr(),
                bytes.as_ptr() as *const c_char,
                bytes.len(),
            )
        };
    })
}

extern "C" fn mem_usage(value: *const c_void) -> usize {
    guarded(0, || {
        // SAFETY: as in rdb_save.
        let log = unsafe { log_of(value) };
        let mut total = SERVER_WRAPPER_BYTES;
        // SAFETY: reading the function table; the pointers are live allocations.
        log.allocations(|ptr, size| {
            total += match unsafe { raw::RedisModule_MallocSize } {
                Some(malloc_size) => unsafe { malloc_size(ptr as *mut c_void) },
                None => size,
            }
        });
        total
    })
}

extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guarded((), || {
        // SAFETY: as in rdb_save.
        let bytes = runs_bytes(&*unsafe { log_of(value) });
        unsafe {
            api!(RedisModule_DigestAddStringBuffer)(md, bytes.as_ptr() as *const c_char as *mut _, bytes.len());
            api!(RedisModule_DigestEndSequence)(md);
        }
    })
}

extern "C" fn free(value: *mut c_void) {
    guarded((), || {
        // SAFETY: the server frees each value once; it came from RunLog::into_raw.
        drop(unsafe { RunLog::from_raw(value as *mut u8) });
    })
}

/// Freeing a window is one deallocation per block (and its index): a window of
/// many blocks (more than 64, some 60,000 entries) is freed by the server's
/// lazy-free thread; `free` touches nothing but the value.
extern "C" fn free_effort(_key: *mut raw::RedisModuleString, value: *const c_void) -> usize {
    guarded(1, || {
        let mut allocations = 0;
        // SAFETY: as in rdb_save.
        unsafe { log_of(value) }.allocations(|_, _| allocations += 1);
        allocations
    })
}

extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guarded(ptr::null_mut(), || {
        // SAFETY: as in rdb_save.
        let copied = RunLog::from_runs(unsafe { log_of(value) }.runs());
        copied.into_raw() as *mut c_void
    })
}

extern "C" fn defrag(
    ctx: *mut raw::RedisModuleDefragCtx,
    _key: *mut raw::RedisModuleString,
    value: *mut *mut c_void,
) -> c_int {
    guarded(0, || {
        let defrag_alloc = api!(RedisModule_DefragAlloc);
        // SAFETY: `*value` is this type's RunLog root; DefragAlloc returns a
        // copy of an allocation (and frees the old one) or null when it left
        // it alone; the log then records where its blocks and root went.
        unsafe {
            let mut log = log_of(*value);
            log.relocate(|ptr| defrag_alloc(ctx, ptr as *mut c_void) as *mut u8);
            *value = log.as_raw() as *mut c_void;
        }
        0
    })
}
