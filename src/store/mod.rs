//! Where a window lives: the one folder that touches keys.
//!
//! A window is stored in one of two forms, side by side:
//! - [`zset`]: a sorted set, the layout of the article's script and of the
//!   Lua fallback (`src/lua/`), so deployments move between them freely;
//! - [`compact`]: the module's own data type `xcloaklog`, the log as
//!   bit-packed blocks of runs (`xcloak_core::log`, pure Rust), about a byte per request.
//!
//! Both implement [`Log`], so `window.rs` decides the same way over either.
//! The form applies to keys a call *creates* ([`set_creation_form`], the
//! `STORAGE` load argument / `xcloak.storage`): an existing key keeps its form,
//! and a window that empties is recreated in the configured form by its next
//! admission. This file holds what both forms share: what a key holds, the
//! record of what a call changed, and the commit that sets the expiry,
//! replicates the effects and fires the keyspace events (the API calls
//! themselves, and the compact type's callbacks, are the border's: `ffi.rs`).

pub mod compact;
pub mod zset;

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use redis_module::raw;

use crate::ffi::{self, Key};
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

/// What an open key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    Nothing,
    Window(Form),
    OtherType,
}

pub fn holds(key: &Key) -> Holds {
    let key_type = key.key_type();
    if key_type == raw::REDISMODULE_KEYTYPE_EMPTY {
        Holds::Nothing
    } else if key_type == raw::REDISMODULE_KEYTYPE_ZSET {
        Holds::Window(Form::Zset)
    } else if compact::is_ours(key) {
        Holds::Window(Form::Compact)
    } else {
        Holds::OtherType
    }
}

/// Whether the key has no expiry, or one within `ttl_ms - TTL_REFRESH_SLACK_MS` from now.
fn needs_expiry(key: &Key, ttl_ms: i64) -> bool {
    key.ttl_ms()
        .is_none_or(|remaining_ms| remaining_ms <= ttl_ms - TTL_REFRESH_SLACK_MS)
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

/// Opens the window at `name` (an argument of the command `ctx` executes):
/// its key's form, or for a missing key the form keys are created in.
pub fn open(ctx: *mut raw::RedisModuleCtx, name: &raw::RedisModuleString, writable: bool) -> Opened {
    let key = Key::open(ctx, name, writable);
    match holds(&key) {
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
        match self {
            Window::Zset(log) => &log.key,
            Window::Compact(log) => log.key(),
        }
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
        let expire_at_ms = (self.changes().added > 0 && needs_expiry(self.key(), ttl_ms)).then_some(server_ms + ttl_ms);
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
        key.signal_modified();
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
            Window::Compact(log) => log.into_key(),
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
pub fn convert(
    ctx: *mut raw::RedisModuleCtx,
    name: &raw::RedisModuleString,
    to: Form,
    max_entries: u64,
) -> Result<bool, Refusal> {
    let mut key = Key::open(ctx, name, true);
    let from = match holds(&key) {
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
    let expire_at_ms = key.ttl_ms().map(|ttl_ms| ffi::milliseconds() + ttl_ms);
    key.delete();
    key.replicate_del();
    match to {
        Form::Zset => zset::write_runs(&key, &runs),
        Form::Compact => compact::write_runs(&mut key, &runs),
    }
    if let Some(expire_at_ms) = expire_at_ms {
        key.set_expiry(expire_at_ms);
        key.replicate_pexpireat(expire_at_ms);
    }
    key.notify(raw::NotifyEvent::GENERIC, c"xcloak.convert");
    key.signal_modified();
    Ok(true)
}

/// Why a command left a key alone.
pub enum Refusal {
    WrongType,
    Invalid(String),
}
