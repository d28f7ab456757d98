//! The compact form of a window: the module's data type `xcloaklog`, whose
//! value is a [`RunLog`]'s root pointer (one bit-packed block, or an index of
//! blocks: `xcloak_core::log`), and everything that makes it a real data type: RDB
//! save/load with an encoding version (2, and 0.1.0's 1), AOF rewrite,
//! DUMP/RESTORE (and so MIGRATE and resharding), COPY, MEMORY USAGE, lazy
//! free, DEBUG DIGEST-VALUE, active defrag.
//!
//! The value is the log's own allocation, not a box around it: a window of a
//! few entries is one allocation. When a change moves it (a block that grows
//! into the next size class, a window that goes from one block to an index),
//! the key's value is swapped for the new pointer. The raw side of all this
//! (the callbacks' trampolines, the value's pointer, the key's value) is the
//! border's, `ffi/datatype.rs`: this file is the type's safe definition.
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

use std::ffi::CStr;

use xcloak_core::effect::{Effect, MAX_TEXT};
use xcloak_core::log::{RunLog, MAX_ENTRIES};
use xcloak_core::window::Log;

use super::Changes;
use crate::ffi::datatype::{AofWriter, DataType, Digest, ModuleType, RdbReader, RdbWriter, UnlinkHook, ValueKey};
use crate::ffi::{self, Key};

/// The RDB encoding this module writes: 2, bit-packed groups of runs
/// (`RunLog::encode`). It also reads 1, the varint runs 0.1.0 wrote. A payload
/// of a later version (from a newer module) is refused with a log line, never
/// guessed at.
pub const ENCODING_VERSION: i32 = 2;

/// 0.1.0's RDB encoding: the varint runs (`RunLog::encode_runs`), still read.
const ENCODING_VERSION_RUNS: i32 = 1;

/// The server's own wrapper around a module value (its object header and
/// the type/value pair), counted in `MEMORY USAGE` like a core type's header.
const SERVER_WRAPPER_BYTES: usize = 32;

/// The type, once registered.
static TYPE: DataType<RunLog> = DataType::new();

/// Whether the type is registered (the module was loaded with `STORAGE compact`).
pub fn registered() -> bool {
    TYPE.registered()
}

/// Registers `xcloaklog`, with `unlink` (`eviction::compact_unlinked`,
/// passed in by lib.rs so that the store never imports what sits above it)
/// told each key the server deletes. Call from `OnLoad` only.
pub fn register(ctx: *mut redis_module::raw::RedisModuleCtx, unlink: UnlinkHook) -> Result<(), String> {
    // The type's load options (short reads, swapdb loads) are set with the
    // module's others, once: `ffi::set_module_options`.
    TYPE.register(ctx, unlink)
        .map_err(|message| format!("{message} (STORAGE compact)"))
}

/// Whether the open `key` holds this module's type.
pub fn is_ours(key: &Key) -> bool {
    key.holds(&TYPE)
}

/// A window held in the compact type, open for one call.
pub struct CompactLog {
    /// The key and its log, lent by the server (empty while it holds none).
    window: ValueKey<RunLog>,
    pub changes: Changes,
}

impl CompactLog {
    #[inline]
    pub fn new(key: Key) -> CompactLog {
        CompactLog {
            window: ValueKey::open(key),
            changes: Changes::default(),
        }
    }

    #[inline]
    pub fn key(&self) -> &Key {
        self.window.key()
    }

    pub fn into_key(self) -> Key {
        self.window.into_key()
    }

    #[inline]
    fn log(&self) -> Option<&RunLog> {
        self.window.get()
    }

    /// An empty window leaves no key.
    fn delete_if_empty(&mut self) {
        if self.log().is_some_and(RunLog::is_empty) {
            self.window.delete();
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
            replicate_effect(self.key(), &effect, None);
        }
    }
}

/// Replicates `XCLOAK.APPLY key <effect> [<bytes>]`.
#[inline]
fn replicate_effect(key: &Key, effect: &Effect, bytes: Option<&[u8]>) {
    let mut text = [0u8; MAX_TEXT];
    let len = effect.write(&mut text);
    key.replicate_bytes(APPLY, &text[..len], bytes);
}

const APPLY: &CStr = c"XCLOAK.APPLY";

impl Log for CompactLog {
    fn len(&self) -> u64 {
        self.log().map_or(0, RunLog::len)
    }

    fn count_expired(&self, cutoff_ms: i64) -> u64 {
        self.log().map_or(0, |log| log.count_expired(cutoff_ms))
    }

    fn trim(&mut self, cutoff_ms: i64) -> u64 {
        self.changes.cutoff_ms = cutoff_ms;
        let removed = self.window.update(|log| log.trim(cutoff_ms)).unwrap_or(0);
        if removed > 0 {
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
        if self.window.update(|log| log.record(now_ms, cost)).is_none() {
            let mut log = RunLog::default();
            log.record(now_ms, cost);
            self.window.set(log);
        }
        self.changes.added += cost;
        self.changes.added_at_ms = now_ms;
    }

    fn remove_at(&mut self, stamp_ms: i64, count: u64) -> u64 {
        let Some(removed) = self.window.update(|log| log.remove_at(stamp_ms, count)) else {
            return 0;
        };
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
    key.with_value(&TYPE, |log| log.map_or_else(Vec::new, |log| log.runs().collect()))
}

/// Stores `runs` at the empty `key` and replicates `XCLOAK.APPLY key L <bytes>`
/// (the varint runs of encoding 1: the effect every release reads).
pub fn write_runs(key: &mut Key, runs: &[(i64, u64)]) {
    let log = RunLog::from_runs(runs.iter().copied());
    let mut bytes = Vec::new();
    log.encode_runs(&mut bytes);
    key.set_value(&TYPE, log);
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
pub fn from_primary_or_aof(ctx: *mut redis_module::raw::RedisModuleCtx) -> bool {
    ffi::from_primary_or_aof(ctx)
}

/// Applies `XCLOAK.APPLY key <effect> [<bytes>]` to `key`, as the primary
/// did: load, trim, remove, add, expiry; a window left empty is deleted.
pub fn apply(mut key: Key, effect: &Effect, bytes: Option<&[u8]>) -> Result<(), String> {
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
            None => key.with_value(&TYPE, |log| log.map_or(0, RunLog::len)),
        };
        if held + count > MAX_ENTRIES {
            return Err(format!("XCLOAK.APPLY A would hold more than {MAX_ENTRIES} entries"));
        }
    }
    if let Some(log) = loaded {
        key.set_value(&TYPE, log);
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
    super::announce(window.key(), &window.changes);
    if let (Some(expire_at_ms), false) = (effect.expire_at_ms, window.key().is_empty()) {
        window.key().set_expiry(expire_at_ms);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The data type: what the server calls on a value (the border's trampolines
// call these, each under a panic guard).

impl ModuleType for RunLog {
    const NAME: &'static CStr = c"xcloaklog";
    const ENCODING_VERSION: i32 = ENCODING_VERSION;

    fn data_type() -> &'static DataType<RunLog> {
        &TYPE
    }

    fn rdb_save(&self, rdb: &mut RdbWriter<'_>) {
        let mut bytes = Vec::new();
        self.encode(&mut bytes);
        rdb.save_unsigned(self.len());
        rdb.save_bytes(&bytes);
    }

    fn rdb_load(rdb: &mut RdbReader<'_>, encoding_version: i32) -> Option<RunLog> {
        load(rdb, encoding_version)
            .map_err(|reason| {
                rdb.log_warning(&format!(
                    "xcloak: refusing a compact window (xcloaklog) in the data being loaded: {reason}"
                ))
            })
            .ok()
    }

    fn aof_rewrite(&self, aof: &mut AofWriter<'_>) {
        aof.emit(APPLY, c"L", &runs_bytes(self));
    }

    fn digest(&self, digest: &mut Digest<'_>) {
        digest.add_bytes(&runs_bytes(self));
        digest.end_sequence();
    }

    fn copy(&self) -> RunLog {
        RunLog::from_runs(self.runs())
    }

    fn mem_usage(&self, allocated: usize) -> usize {
        SERVER_WRAPPER_BYTES + allocated
    }

    /// Freeing a window is one deallocation per block (and its index): a
    /// window of many blocks (more than 64, some 60,000 entries) is freed by
    /// the server's lazy-free thread; `free` touches nothing but the value.
    fn free_effort(&self) -> usize {
        let mut allocations = 0;
        self.allocations(|_, _| allocations += 1);
        allocations
    }
}

fn load(rdb: &mut RdbReader<'_>, encver: i32) -> Result<RunLog, String> {
    if encver != ENCODING_VERSION && encver != ENCODING_VERSION_RUNS {
        return Err(format!(
            "its encoding version is {encver}, this module reads versions {ENCODING_VERSION_RUNS} and {ENCODING_VERSION} (load it with the module version that wrote it, or newer)"
        ));
    }
    let entries = rdb
        .load_unsigned()
        .ok_or_else(|| "the data ends before the entry count".to_string())?;
    let bytes = rdb
        .load_bytes()
        .ok_or_else(|| "the data ends inside the runs".to_string())?;
    let decoded = if encver == ENCODING_VERSION {
        RunLog::decode(&bytes)
    } else {
        RunLog::decode_runs(&bytes)
    };
    drop(bytes);
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
