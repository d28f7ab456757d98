//! A module data type, behind safe Rust: the value type implements
//! [`ModuleType`] (its RDB, AOF, digest, copy and memory callbacks, over the
//! safe handles [`RdbWriter`], [`RdbReader`], [`AofWriter`], [`Digest`]);
//! [`DataType`] registers it and names it; generic `extern "C"` trampolines
//! turn the server's raw pointers into the value and back, each under
//! [`guarded`] (no panic crosses into C); and a key's value is reached
//! through [`Key::holds`], [`Key::with_value`], [`Key::set_value`] and
//! [`ValueKey`], which lends an open key's value for as long as it is open.
//!
//! The value the server holds is the Rust value's own pointer ([`Stored`]),
//! not a box around it: a small window is one allocation. When a change
//! moves it, the key's value is swapped for the new pointer
//! (`RedisModule_ModuleTypeReplaceValue`, which frees nothing).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};
use std::sync::OnceLock;

use redis_module::raw;
use xcloak_core::log::RunLog;

use super::{api, Key};

/// A value the server can hold for a module type: one owning pointer, null
/// for an empty value that owns nothing.
///
/// # Safety
/// `into_raw` gives up ownership of the pointer, which `from_raw` takes back
/// (exactly once for each value); `from_raw(null)` is an empty value;
/// `as_raw` is the pointer `into_raw` would give now; `allocations` names
/// live allocations of the value with the size it asked for; `relocate`
/// keeps the value whole when `move_to` keeps each allocation's contents.
pub unsafe trait Stored: Sized {
    fn into_raw(self) -> *mut c_void;
    /// # Safety
    /// `ptr` is null or came from `into_raw`, and is owned by nobody else.
    unsafe fn from_raw(ptr: *mut c_void) -> Self;
    fn as_raw(&self) -> *mut c_void;
    fn allocations(&self, each: impl FnMut(*const u8, usize));
    /// # Safety
    /// `move_to` returns null, or a copy of the allocation it was given (same
    /// allocator and size), which it has freed.
    unsafe fn relocate(&mut self, move_to: impl FnMut(*mut u8) -> *mut u8);
}

// SAFETY: a RunLog is one root pointer that owns its allocations (the core's
// `into_raw`/`from_raw` contract), null when empty; `allocations` and
// `relocate` are the core's own walks over them.
unsafe impl Stored for RunLog {
    #[inline]
    fn into_raw(self) -> *mut c_void {
        RunLog::into_raw(self) as *mut c_void
    }

    /// # Safety
    /// As [`Stored::from_raw`].
    #[inline]
    unsafe fn from_raw(ptr: *mut c_void) -> RunLog {
        // SAFETY: the caller's promise, which is the core's: null, or a root
        // `into_raw` gave and nobody else owns.
        unsafe { RunLog::from_raw(ptr as *mut u8) }
    }

    #[inline]
    fn as_raw(&self) -> *mut c_void {
        RunLog::as_raw(self) as *mut c_void
    }

    fn allocations(&self, each: impl FnMut(*const u8, usize)) {
        RunLog::allocations(self, each)
    }

    /// # Safety
    /// As [`Stored::relocate`].
    unsafe fn relocate(&mut self, move_to: impl FnMut(*mut u8) -> *mut u8) {
        // SAFETY: the caller's promise is the core's.
        unsafe { RunLog::relocate(self, move_to) }
    }
}

/// A module data type: what the server calls on its values. Every method is
/// safe; the border's trampolines do the raw work around them.
pub trait ModuleType: Stored + 'static {
    /// `TYPE` replies this; exactly 9 characters.
    const NAME: &'static CStr;
    /// The encoding `rdb_save` writes (`rdb_load` is told the one it reads).
    const ENCODING_VERSION: i32;
    /// The registered type (a `static` of the implementing file).
    fn data_type() -> &'static DataType<Self>;
    fn rdb_save(&self, rdb: &mut RdbWriter<'_>);
    /// The value, or `None` to refuse the data (after `rdb.log_warning`).
    fn rdb_load(rdb: &mut RdbReader<'_>, encoding_version: i32) -> Option<Self>;
    fn aof_rewrite(&self, aof: &mut AofWriter<'_>);
    fn digest(&self, digest: &mut Digest<'_>);
    fn copy(&self) -> Self;
    /// `MEMORY USAGE`, given what the allocator holds for `allocations`.
    fn mem_usage(&self, allocated: usize) -> usize;
    /// Lazy free: the server frees a value of more than 64 in another thread.
    fn free_effort(&self) -> usize;
}

/// The key-name hook of the type's `unlink` callback: the name the server
/// passes (its address is the same object the `evicted` event names next).
pub type UnlinkHook = fn(&raw::RedisModuleString);

/// A data type once registered (a `static`, one per type).
pub struct DataType<T> {
    raw: AtomicPtr<raw::RedisModuleType>,
    unlink: OnceLock<UnlinkHook>,
    value: PhantomData<fn() -> T>,
}

impl<T: ModuleType> DataType<T> {
    pub const fn new() -> DataType<T> {
        DataType {
            raw: AtomicPtr::new(ptr::null_mut()),
            unlink: OnceLock::new(),
            value: PhantomData,
        }
    }

    /// Whether [`register`](DataType::register) succeeded.
    #[inline]
    pub fn registered(&self) -> bool {
        !self.raw.load(Relaxed).is_null()
    }

    #[inline]
    fn raw(&self) -> *mut raw::RedisModuleType {
        self.raw.load(Relaxed)
    }

    /// Registers the type, with `unlink` told each key the server deletes.
    /// From `OnLoad` only (`ctx` its context).
    pub fn register(&'static self, ctx: *mut raw::RedisModuleCtx, unlink_hook: UnlinkHook) -> Result<(), String> {
        let _ = self.unlink.set(unlink_hook);
        // SAFETY: reading the function table the server filled in at load.
        let defrag_api = unsafe { raw::RedisModule_DefragAlloc }.is_some();
        let mut methods = raw::RedisModuleTypeMethods {
            version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
            rdb_load: Some(rdb_load::<T>),
            rdb_save: Some(rdb_save::<T>),
            aof_rewrite: Some(aof_rewrite::<T>),
            mem_usage: Some(mem_usage::<T>),
            digest: Some(digest::<T>),
            free: Some(free::<T>),
            aux_load: None,
            aux_save: None,
            aux_save_triggers: 0,
            free_effort: Some(free_effort::<T>),
            unlink: Some(unlink::<T>),
            copy: Some(copy::<T>),
            defrag: if defrag_api { Some(defrag::<T>) } else { None },
            mem_usage2: None,
            free_effort2: None,
            unlink2: None,
            copy2: None,
            aux_save2: None,
        };
        // SAFETY: the load context, a NUL-terminated static name, and methods
        // the server copies.
        let created =
            unsafe { api!(RedisModule_CreateDataType)(ctx, T::NAME.as_ptr(), T::ENCODING_VERSION, &mut methods) };
        if created.is_null() {
            return Err(format!(
                "could not register the data type {}",
                T::NAME.to_string_lossy()
            ));
        }
        self.raw.store(created, Relaxed);
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// A key's value.

impl Key {
    /// Whether the open key holds a value of `data_type`.
    #[inline]
    pub fn holds<T: ModuleType>(&self, data_type: &DataType<T>) -> bool {
        let ours = data_type.raw();
        // SAFETY: the key is open (or null: GetType answers null).
        !ours.is_null() && unsafe { api!(RedisModule_ModuleTypeGetType)(self.raw) } == ours
    }

    /// The pointer the key holds for `data_type`, or null if it holds none.
    #[inline]
    fn value_ptr<T: ModuleType>(&self, data_type: &DataType<T>) -> *mut c_void {
        if !self.holds(data_type) {
            return ptr::null_mut();
        }
        // SAFETY: the key is open and holds a value of the type.
        unsafe { api!(RedisModule_ModuleTypeGetValue)(self.raw) }
    }

    /// Runs `read` on the value the key holds (`None`: none of `data_type`).
    pub fn with_value<T: ModuleType, R>(&self, data_type: &DataType<T>, read: impl FnOnce(Option<&T>) -> R) -> R {
        let value = self.value_ptr(data_type);
        // SAFETY: a non-null value of the type is one `into_raw` handed to the
        // server; it is borrowed while `&self` is (nothing can replace or
        // delete it then: both take `&mut Key`) and never dropped here.
        let held = ManuallyDrop::new(unsafe { T::from_raw(value) });
        read((!value.is_null()).then_some(&*held))
    }

    /// Stores `value` at the key (open for writing), replacing (and freeing)
    /// what it held.
    pub fn set_value<T: ModuleType>(&mut self, data_type: &DataType<T>, value: T) {
        self.store_value(data_type, value);
    }

    /// As `set_value`; the pointer the key holds now (null if refused).
    #[inline]
    fn store_value<T: ModuleType>(&mut self, data_type: &DataType<T>, value: T) -> *mut c_void {
        let raw = value.into_raw();
        // SAFETY: the key is open; on success the server owns `raw` and frees
        // it through the type's `free`.
        let status = unsafe { api!(RedisModule_ModuleTypeSetValue)(self.raw, data_type.raw(), raw) };
        if status != raw::REDISMODULE_OK as c_int {
            // SAFETY: refused, so `raw` is still this module's, taken back once.
            drop(unsafe { T::from_raw(raw) });
            return ptr::null_mut();
        }
        raw
    }
}

/// An open key and the value of type `T` it holds, lent by the server for as
/// long as the key is open here: read with [`get`](ValueKey::get), changed in
/// place with [`update`](ValueKey::update) (the key then holds the value's
/// pointer again, even if the change panicked), replaced with
/// [`set`](ValueKey::set), removed with [`delete`](ValueKey::delete).
pub struct ValueKey<T: ModuleType> {
    key: Key,
    /// The key's value, borrowed from the server: never dropped here (the
    /// server frees it through `free`); empty while the key holds none.
    value: ManuallyDrop<T>,
    /// The pointer the server holds for the key; null while it holds none.
    stored: *mut c_void,
}

impl<T: ModuleType> ValueKey<T> {
    /// Lends `key`'s value (a key that holds none, or another type's, lends
    /// an empty one).
    #[inline]
    pub fn open(key: Key) -> ValueKey<T> {
        let stored = key.value_ptr(T::data_type());
        // SAFETY: as in `Key::with_value`; the key is owned here, so only this
        // struct changes its value while it is open.
        let value = ManuallyDrop::new(unsafe { T::from_raw(stored) });
        ValueKey { key, value, stored }
    }

    #[inline]
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The key, the value left to the server.
    pub fn into_key(self) -> Key {
        self.key
    }

    /// The value, if the key holds one.
    #[inline]
    pub fn get(&self) -> Option<&T> {
        (!self.stored.is_null()).then_some(&*self.value)
    }

    /// Changes the value in place (`None` if the key holds none). If the
    /// value's pointer moved, the key holds the new one after, also when
    /// `change` panics.
    #[inline]
    pub fn update<R>(&mut self, change: impl FnOnce(&mut T) -> R) -> Option<R> {
        if self.stored.is_null() {
            return None;
        }
        struct Resync<'a, T: ModuleType>(&'a mut ValueKey<T>);
        impl<T: ModuleType> Drop for Resync<'_, T> {
            #[inline]
            fn drop(&mut self) {
                self.0.sync();
            }
        }
        let guard = Resync(self);
        Some(change(&mut guard.0.value))
    }

    /// After a change: the key's value is the value's pointer again.
    #[inline]
    fn sync(&mut self) {
        let now = self.value.as_raw();
        if now != self.stored && !self.stored.is_null() {
            let mut old: *mut c_void = ptr::null_mut();
            // SAFETY: the key is open for writing and holds a value of the
            // type; the old pointer was freed or reused by the value's own
            // change (ReplaceValue frees nothing).
            unsafe { api!(RedisModule_ModuleTypeReplaceValue)(self.key.raw, T::data_type().raw(), now, &mut old) };
            self.stored = now;
        }
    }

    /// Stores `value` at the key, replacing what it held.
    #[inline]
    pub fn set(&mut self, value: T) {
        self.stored = self.key.store_value(T::data_type(), value);
        // SAFETY: the pointer just handed to the server, lent as in `open`.
        self.value = ManuallyDrop::new(unsafe { T::from_raw(self.stored) });
    }

    /// Deletes the key (the server frees the value through `free`).
    pub fn delete(&mut self) {
        self.sync();
        self.key.delete();
        self.stored = ptr::null_mut();
        // SAFETY: null is the empty value, which owns nothing.
        self.value = ManuallyDrop::new(unsafe { T::from_raw(ptr::null_mut()) });
    }
}

// ---------------------------------------------------------------------------
// The handles the callbacks get.

/// The RDB being written, for one value (`rdb_save`).
pub struct RdbWriter<'a> {
    io: *mut raw::RedisModuleIO,
    call: PhantomData<&'a mut ()>,
}

impl RdbWriter<'_> {
    pub fn save_unsigned(&mut self, value: u64) {
        // SAFETY: the live IO of this callback.
        unsafe { api!(RedisModule_SaveUnsigned)(self.io, value) };
    }

    pub fn save_bytes(&mut self, bytes: &[u8]) {
        // SAFETY: the live IO of this callback; `bytes` is valid for its length.
        unsafe { api!(RedisModule_SaveStringBuffer)(self.io, bytes.as_ptr() as *const c_char, bytes.len()) };
    }
}

/// The RDB being read, for one value (`rdb_load`). A read past the end of
/// the data is `None` (the server's IO error, with the type's
/// HANDLE_IO_ERRORS option: `set_module_options`).
pub struct RdbReader<'a> {
    io: *mut raw::RedisModuleIO,
    call: PhantomData<&'a mut ()>,
}

impl RdbReader<'_> {
    fn io_error(&self) -> bool {
        // SAFETY: the live IO of this callback.
        unsafe { api!(RedisModule_IsIOError)(self.io) != 0 }
    }

    pub fn load_unsigned(&mut self) -> Option<u64> {
        // SAFETY: the live IO of this callback.
        let value = unsafe { api!(RedisModule_LoadUnsigned)(self.io) };
        (!self.io_error()).then_some(value)
    }

    /// The next string of the data, freed when the result is dropped.
    pub fn load_bytes(&mut self) -> Option<Loaded> {
        let mut len = 0usize;
        // SAFETY: the live IO of this callback; the buffer is handed over.
        let buffer = unsafe { api!(RedisModule_LoadStringBuffer)(self.io, &mut len) };
        let loaded = (!buffer.is_null()).then_some(Loaded { buffer, len });
        loaded.filter(|_| !self.io_error())
    }

    /// Logs `message` as a warning about the data being loaded.
    pub fn log_warning(&self, message: &str) {
        let text = CString::new(message.replace('\0', "?")).unwrap_or_default();
        // SAFETY: the live IO; "%s" with one NUL-terminated string.
        unsafe { api!(RedisModule_LogIOError)(self.io, c"warning".as_ptr(), c"%s".as_ptr(), text.as_ptr()) };
    }
}

/// A string read from an RDB: the server's allocation, freed on drop.
pub struct Loaded {
    buffer: *mut c_char,
    len: usize,
}

impl std::ops::Deref for Loaded {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: LoadStringBuffer returned `len` bytes it allocated, live
        // until the drop below.
        unsafe { std::slice::from_raw_parts(self.buffer as *const u8, self.len) }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: from LoadStringBuffer, freed once, here.
        unsafe { api!(RedisModule_Free)(self.buffer as *mut c_void) };
    }
}

/// The AOF being rewritten, for one key (`aof_rewrite`).
pub struct AofWriter<'a> {
    io: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    call: PhantomData<&'a mut ()>,
}

impl AofWriter<'_> {
    /// Emits `command <the key> word bytes`.
    pub fn emit(&mut self, command: &CStr, word: &CStr, bytes: &[u8]) {
        // SAFETY: the live IO and key name of this callback; "s" the key,
        // "c" a C string, "b" a buffer and its length.
        unsafe {
            api!(RedisModule_EmitAOF)(
                self.io,
                command.as_ptr(),
                c"scb".as_ptr(),
                self.key,
                word.as_ptr(),
                bytes.as_ptr() as *const c_char,
                bytes.len(),
            )
        };
    }
}

/// `DEBUG DIGEST-VALUE`'s digest, for one value.
pub struct Digest<'a> {
    md: *mut raw::RedisModuleDigest,
    call: PhantomData<&'a mut ()>,
}

impl Digest<'_> {
    pub fn add_bytes(&mut self, bytes: &[u8]) {
        // SAFETY: the live digest of this callback; the server only reads the bytes.
        unsafe { api!(RedisModule_DigestAddStringBuffer)(self.md, bytes.as_ptr() as *mut c_char, bytes.len()) };
    }

    pub fn end_sequence(&mut self) {
        // SAFETY: the live digest of this callback.
        unsafe { api!(RedisModule_DigestEndSequence)(self.md) };
    }
}

// ---------------------------------------------------------------------------
// The trampolines. Each runs its body under `guarded`.

/// Runs a callback's body: a panic (already logged by the hook lib.rs sets)
/// gives `fallback` and goes no further.
pub(super) fn guarded<R>(fallback: R, body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// The value the server passes to a callback, borrowed.
///
/// # Safety
/// `value` must be a value of `T`'s type that the server holds.
unsafe fn lent<T: ModuleType>(value: *const c_void) -> ManuallyDrop<T> {
    // SAFETY: the caller's promise: a pointer this type handed the server;
    // ManuallyDrop leaves it the server's.
    ManuallyDrop::new(unsafe { T::from_raw(value as *mut c_void) })
}

extern "C" fn rdb_save<T: ModuleType>(io: *mut raw::RedisModuleIO, value: *mut c_void) {
    guarded((), || {
        // SAFETY: the server passes a value of this type and a live IO.
        let value = unsafe { lent::<T>(value) };
        value.rdb_save(&mut RdbWriter { io, call: PhantomData });
    })
}

extern "C" fn rdb_load<T: ModuleType>(io: *mut raw::RedisModuleIO, encoding_version: c_int) -> *mut c_void {
    guarded(ptr::null_mut(), || {
        let loaded = T::rdb_load(&mut RdbReader { io, call: PhantomData }, encoding_version);
        loaded.map_or(ptr::null_mut(), T::into_raw)
    })
}

extern "C" fn aof_rewrite<T: ModuleType>(
    io: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guarded((), || {
        // SAFETY: as in rdb_save.
        let value = unsafe { lent::<T>(value) };
        value.aof_rewrite(&mut AofWriter {
            io,
            key,
            call: PhantomData,
        });
    })
}

extern "C" fn mem_usage<T: ModuleType>(value: *const c_void) -> usize {
    guarded(0, || {
        // SAFETY: as in rdb_save.
        let value = unsafe { lent::<T>(value) };
        // SAFETY: reading the function table the server filled in at load.
        let malloc_size = unsafe { raw::RedisModule_MallocSize };
        let mut allocated = 0;
        value.allocations(|ptr, size| {
            allocated += match malloc_size {
                // SAFETY: `Stored::allocations` names live allocations.
                Some(malloc_size) => unsafe { malloc_size(ptr as *mut c_void) },
                None => size,
            }
        });
        value.mem_usage(allocated)
    })
}

extern "C" fn digest<T: ModuleType>(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guarded((), || {
        // SAFETY: as in rdb_save.
        let value = unsafe { lent::<T>(value) };
        value.digest(&mut Digest { md, call: PhantomData });
    })
}

extern "C" fn free<T: ModuleType>(value: *mut c_void) {
    guarded((), || {
        // SAFETY: the server frees each value once; it came from `into_raw`.
        drop(unsafe { T::from_raw(value) });
    })
}

extern "C" fn free_effort<T: ModuleType>(_key: *mut raw::RedisModuleString, value: *const c_void) -> usize {
    // SAFETY: as in rdb_save.
    guarded(1, || unsafe { lent::<T>(value) }.free_effort())
}

extern "C" fn unlink<T: ModuleType>(key: *mut raw::RedisModuleString, _value: *const c_void) {
    guarded((), || {
        // SAFETY: the server passes a live key name (or null) for the callback.
        if let (Some(hook), Some(key)) = (T::data_type().unlink.get(), unsafe { key.as_ref() }) {
            hook(key);
        }
    })
}

extern "C" fn copy<T: ModuleType>(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: as in rdb_save.
    guarded(ptr::null_mut(), || unsafe { lent::<T>(value) }.copy().into_raw())
}

extern "C" fn defrag<T: ModuleType>(
    ctx: *mut raw::RedisModuleDefragCtx,
    _key: *mut raw::RedisModuleString,
    value: *mut *mut c_void,
) -> c_int {
    guarded(0, || {
        let defrag_alloc = api!(RedisModule_DefragAlloc);
        // SAFETY: `*value` is a value of this type; DefragAlloc returns a copy
        // of an allocation (and frees the old one) or null when it left it
        // alone, as `relocate` asks; the value then records where its
        // allocations went, and the server gets its new pointer.
        unsafe {
            let mut moved = lent::<T>(*value);
            moved.relocate(|ptr| defrag_alloc(ctx, ptr as *mut c_void) as *mut u8);
            *value = moved.as_raw();
        }
        0
    })
}
