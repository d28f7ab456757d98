//! The compact form's log, in plain Rust: a window's entries as bit-packed
//! *blocks* of runs, no FFI (unit-tested here, fuzzed by
//! `fuzz/fuzz_targets/decode.rs`).
//!
//! A *run* is every entry of one millisecond: `(stamp, count)`. Runs are kept
//! oldest first, stamps strictly increasing.
//!
//! # Blocks
//!
//! A block is one allocation: a 16-byte header and a bit string of *slots*,
//! one per run, all of the same width within the block:
//!
//! ```text
//! word 0   first stamp (53 bits) | dw (6 bits) | cw (5 bits)
//! word 1   tag (1 bit) | size class (5 bits) | slots (11 bits) | dead (7 bits) | span (40 bits)
//! data     [entries: 30 bits, if cw > 0]
//!          slot 0: count - 1 (cw bits)
//!          slot i: gap - 1 (dw bits), count - 1 (cw bits)     for i in 1..slots
//! ```
//!
//! `gap` is the distance in ms from the previous run (at least 1), `span` the
//! distance from the first live run to the last, so the newest stamp is in the
//! header too. The first `dead` slots are runs already trimmed: a trim only
//! moves this mark and the first stamp, and the bits are shifted out once
//! the mark reaches 127 or the block needs the room (O(1) amortised per
//! trimmed run). A block of lone entries has `cw = 0`: no count bits at all, and
//! its entry count is its run count. So a window of ten requests 6 s apart is
//! 16 + 15 bytes, a 32-byte allocation; requests 1 ms apart cost no bits.
//!
//! A window is one block while it fits in [`BLOCK_BYTES`] and [`BLOCK_RUNS`]
//! (the *inline* form: one allocation, the value itself). A window that grows
//! past that moves to the *large* form: a root allocation holding an index of
//! blocks (each block's first stamp, entry count and pointer, in the spirit of
//! Redis' quicklist) and the blocks themselves; one that shrinks back to one
//! block is inline again. Both moves are O(1): the block stays where it is.
//!
//! # Costs
//!
//! - admission at the newest millisecond or later: O(1) (bits written at the
//!   end of the newest block; a width that grows re-packs that block, which is
//!   bounded by [`BLOCK_RUNS`]);
//! - trim: O(expired): whole blocks freed, the first one's trimmed slots
//!   marked dead (shifted out once per 127 of them, a bounded shift); a trim
//!   that finds nothing expired reads one header word;
//! - `len`, `newest`: the header; PEEK and DETAILS walk at most one block per
//!   tier (and sum the index's counts), allocating nothing;
//! - refund of the newest entry: O(1); of any other stamp: a binary search of
//!   the index, a walk of one block from its nearer end and one bounded change
//!   in it (a re-pack of that block when the merged gap is wider than its
//!   gaps), as a sorted set pays about O(log n) for it;
//! - a stamp older than the newest (a caller's clock stepping back): one
//!   block rewritten, and rarely split.
//!
//! # Canonical forms
//!
//! What RDB and DUMP carry is *canonical*: equal windows give equal bytes,
//! whatever their history (trims, refunds, block boundaries), and the decoders
//! accept exactly the canonical form, so a crafted payload is refused with a
//! reason, never loaded half-valid.
//!
//! - **Version 2** (RDB encoding version 2, written by this module): the runs
//!   cut into groups of [`BLOCK_RUNS`] (a new group also where a span would
//!   reach 2^40 ms), each group written as a block (its 16-byte header with
//!   tag, size class and dead slots 0, then its slots with the smallest
//!   widths, padded with zero bits to a byte). [`RunLog::decode`] rebuilds
//!   the window and accepts the bytes only if they are exactly its canonical
//!   encoding.
//! - **Version 1** (0.1.0's RDB encoding, and the run encoding of
//!   `XCLOAK.APPLY key L`, AOF rewrites and DEBUG DIGEST, unchanged so that
//!   every release reads the others' effects): one varint run after another,
//!   `varint(delta << 1 | multi) [varint(count) if multi]`, the first delta
//!   from 0 ([`RunLog::encode_runs`], [`RunLog::decode_runs`]).

use std::alloc::{alloc_zeroed, dealloc, realloc, Layout};
use std::ptr::NonNull;

use crate::args::{MAX_EXACT_MS, MAX_LIMIT_CEILING};
use crate::window::Log;

/// Most entries one window can hold: an admission never takes a window past
/// its `limit`, and no limit can be configured above `MAX_LIMIT_CEILING`.
pub const MAX_ENTRIES: u64 = MAX_LIMIT_CEILING as u64;

/// Most runs in one block (and in one group of the version 2 encoding), and
/// the largest block in bytes, header included: what an inline window holds.
pub const BLOCK_RUNS: u32 = 1024;
pub const BLOCK_BYTES: usize = 1024;

/// How far a block may grow by admissions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Limits {
    runs: u32,
    bytes: usize,
}

/// An inline window: as many as a block can hold, so that a window of 1,000
/// requests a minute is one allocation.
const INLINE: Limits = Limits {
    runs: BLOCK_RUNS,
    bytes: BLOCK_BYTES,
};

/// A block of a large window: smaller, so that what a refund or a step back
/// decodes and rewrites (one block) stays about as cheap as a sorted set's
/// O(log n) for the same, and the trim's shift of the first block is short.
const INDEXED: Limits = Limits { runs: 256, bytes: 256 };

/// Allocation sizes a block takes, smallest first: the allocator's size
/// classes (jemalloc's, which Redis uses), so no byte of an allocation is lost
/// to rounding. A block's header names its class, so it knows its size.
const SIZE_CLASSES: [usize; 20] = [
    16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024,
];

const HEADER_BYTES: usize = 16;
/// Bit positions count from the block's first byte: its data starts here.
const DATA_BITS: usize = HEADER_BYTES * 8;
const SPAN_BITS: u32 = 40;
/// Largest span of a block (and largest gap - 1): 2^40 - 1 ms, 34.8 years; a
/// window whose runs lie further apart takes more blocks.
const MAX_SPAN: u64 = (1 << SPAN_BITS) - 1;
/// Most trimmed slots a block keeps before shifting them out.
const MAX_DEAD: u32 = 127;
/// Width of a block's entry count, and the widest count - 1.
const ENTRIES_BITS: u32 = 30;
const STAMP_MASK: u64 = (1 << 53) - 1;

const TAG_BLOCK: u64 = 0;
const TAG_LARGE: u64 = 1;

// ---------------------------------------------------------------------------
// Bits: little-endian bit strings (bit i of the string is bit i % 8 of byte i / 8).

/// The 8-byte window of `data` that holds bit `pos` and the `width` bits
/// after it: starting at the byte of `pos`, or at the last 8 bytes of `data`
/// near its end. Returns the window's first byte and the field's shift in it.
/// `data` holds at least 8 bytes (a block's header does) and the field.
#[inline(always)]
fn window_of(data: &[u8], pos: usize) -> (usize, usize) {
    let byte = pos / 8;
    if byte + 8 <= data.len() {
        (byte, pos % 8)
    } else {
        let start = data.len() - 8;
        (start, pos - start * 8)
    }
}

/// The `width` (<= 57) bits at bit `pos` of `data` (see `window_of`).
#[inline(always)]
fn get_bits(data: &[u8], pos: usize, width: u32) -> u64 {
    if width == 0 {
        return 0;
    }
    assert!(data.len() >= 8);
    let (start, shift) = window_of(data, pos);
    // SAFETY: `window_of` keeps `start + 8 <= data.len()`.
    let word = u64::from_le(unsafe { std::ptr::read_unaligned(data.as_ptr().add(start) as *const u64) });
    (word >> shift) & mask(width)
}

/// Writes `value` (< 2^width, width <= 57) at bit `pos`, keeping every other bit.
#[inline(always)]
fn set_bits(data: &mut [u8], pos: usize, width: u32, value: u64) {
    if width == 0 {
        return;
    }
    debug_assert!(value <= mask(width));
    assert!(data.len() >= 8);
    let (start, shift) = window_of(data, pos);
    let field = mask(width) << shift;
    // SAFETY: `window_of` keeps `start + 8 <= data.len()`.
    unsafe {
        let at = data.as_mut_ptr().add(start) as *mut u64;
        let word = u64::from_le(std::ptr::read_unaligned(at));
        std::ptr::write_unaligned(at, ((word & !field) | (value << shift)).to_le());
    }
}

#[inline(always)]
fn mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << (width & 63)) - 1
    }
}

/// Bits needed for `value` (0 for 0).
#[inline(always)]
fn width_of(value: u64) -> u32 {
    64 - value.leading_zeros()
}

/// Moves the bits `[from, end)` down to start at `to` (< from); the bits
/// after the moved ones are left as they were.
fn shift_bits_down(data: &mut [u8], from: usize, to: usize, end: usize) {
    debug_assert!(to <= from && from <= end);
    if to == from {
        return;
    }
    let mut out = to;
    let mut at = from;
    // Up to the next byte boundary of the destination, a few bits at a time.
    while out % 8 != 0 && at < end {
        let width = ((8 - out % 8).min(end - at)) as u32;
        let value = get_bits(data, at, width);
        set_bits(data, out, width, value);
        out += width as usize;
        at += width as usize;
    }
    if at >= end {
        return;
    }
    let (dst, bits) = (out / 8, end - at);
    let shift = (at % 8) as u32;
    let src = at / 8;
    let bytes = bits.div_ceil(8);
    if shift == 0 {
        data.copy_within(src..src + bytes, dst);
        return;
    }
    // Whole bytes of the destination from two bytes of the source each, eight
    // at a time where the source has a ninth byte to read.
    let mut i = 0;
    while i + 8 <= bytes && src + i + 9 <= data.len() {
        let low = u64::from_le_bytes(data[src + i..src + i + 8].try_into().unwrap());
        let high = u64::from(data[src + i + 8]);
        let word = (low >> shift) | (high << (64 - shift));
        data[dst + i..dst + i + 8].copy_from_slice(&word.to_le_bytes());
        i += 8;
    }
    while i < bytes {
        let low = u16::from(data[src + i]);
        let high = u16::from(data.get(src + i + 1).copied().unwrap_or(0));
        data[dst + i] = ((low | high << 8) >> shift) as u8;
        i += 1;
    }
}

/// Fields appended to a bit string of up to a block's data, a word at a time
/// (`Block::widen`).
struct BitWriter {
    words: [u64; BLOCK_BYTES / 8 + 1],
    len: usize,
    acc: u64,
    bits: u32,
}

impl Default for BitWriter {
    fn default() -> BitWriter {
        BitWriter {
            words: [0; BLOCK_BYTES / 8 + 1],
            len: 0,
            acc: 0,
            bits: 0,
        }
    }
}

impl BitWriter {
    /// Appends `value` (< 2^width, width <= 57).
    #[inline(always)]
    fn push(&mut self, value: u64, width: u32) {
        if width == 0 {
            return;
        }
        self.acc |= value << self.bits;
        self.bits += width;
        if self.bits >= 64 {
            self.words[self.len] = self.acc;
            self.len += 1;
            self.bits -= 64;
            self.acc = if self.bits > 0 { value >> (width - self.bits) } else { 0 };
        }
    }

    /// The bytes written (the last one zero-padded).
    fn finish(&mut self) -> &[u8] {
        let bytes = self.len * 8 + (self.bits as usize).div_ceil(8);
        if self.bits > 0 {
            self.words[self.len] = self.acc;
        }
        for word in &mut self.words[..self.len + 1] {
            *word = word.to_le();
        }
        // SAFETY: the words are plain bytes, `bytes` of them within the array.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, bytes) }
    }
}

// ---------------------------------------------------------------------------
// Block headers and layouts.

/// A block's header, unpacked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Header {
    first_ms: i64,
    /// Width of a slot's gap - 1 and count - 1.
    dw: u32,
    cw: u32,
    tag: u64,
    /// Index into `SIZE_CLASSES` (0 in serialized groups).
    class: u32,
    /// Slots written, the dead ones included.
    runs: u32,
    /// Leading slots already trimmed (0 in serialized groups).
    dead: u32,
    /// Last stamp minus the first live one.
    span: u64,
}

impl Header {
    fn read(bytes: &[u8]) -> Header {
        let w0 = u64::from_le_bytes(bytes[0..8].try_into().unwrap());
        let w1 = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        Header {
            first_ms: (w0 & STAMP_MASK) as i64,
            dw: ((w0 >> 53) & 63) as u32,
            cw: (w0 >> 59) as u32,
            tag: w1 & 1,
            class: ((w1 >> 1) & 31) as u32,
            runs: ((w1 >> 6) & 2047) as u32,
            dead: ((w1 >> 17) & 127) as u32,
            span: w1 >> 24,
        }
    }

    fn write(&self, bytes: &mut [u8]) {
        let w0 = self.first_ms as u64 | u64::from(self.dw) << 53 | u64::from(self.cw) << 59;
        let w1 = self.tag
            | u64::from(self.class) << 1
            | u64::from(self.runs) << 6
            | u64::from(self.dead) << 17
            | self.span << 24;
        bytes[0..8].copy_from_slice(&w0.to_le_bytes());
        bytes[8..16].copy_from_slice(&w1.to_le_bytes());
    }

    fn last_ms(&self) -> i64 {
        self.first_ms + self.span as i64
    }

    fn layout(&self) -> Slots {
        Slots {
            dw: self.dw,
            cw: self.cw,
        }
    }

    /// Runs not trimmed.
    fn live(&self) -> u32 {
        self.runs - self.dead
    }
}

/// Where a block's fields lie, for given widths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slots {
    dw: u32,
    cw: u32,
}

impl Slots {
    /// Where slot 0 starts: after the header, and the entry count when
    /// counts are stored at all.
    fn base(self) -> usize {
        if self.cw > 0 {
            DATA_BITS + ENTRIES_BITS as usize
        } else {
            DATA_BITS
        }
    }
    fn slot_bits(self) -> usize {
        (self.dw + self.cw) as usize
    }
    /// Bit position of run `i`'s count - 1.
    fn count_pos(self, i: u32) -> usize {
        if i == 0 {
            self.base()
        } else {
            self.gap_pos(i) + self.dw as usize
        }
    }
    /// Bit position of run `i`'s (>= 1) gap - 1.
    fn gap_pos(self, i: u32) -> usize {
        self.base() + self.cw as usize + (i as usize - 1) * self.slot_bits()
    }
    /// Where the bits of `runs` runs end.
    fn bits(self, runs: u32) -> usize {
        if runs == 0 {
            DATA_BITS
        } else {
            self.gap_pos(runs)
        }
    }
    /// Bytes of a block of `runs` runs, header included.
    fn bytes(self, runs: u32) -> usize {
        self.bits(runs).div_ceil(8)
    }
}

/// The smallest size class that holds `bytes`, if any.
fn class_for(bytes: usize) -> Option<u32> {
    SIZE_CLASSES.iter().position(|&size| size >= bytes).map(|i| i as u32)
}

fn block_layout(class: u32) -> Layout {
    Layout::from_size_align(SIZE_CLASSES[class as usize], 8).unwrap()
}

// ---------------------------------------------------------------------------
// Reading runs from a block's bits (in memory or in a serialized group).

/// The runs of a block (its bytes from the header on), oldest first;
/// allocates nothing.
#[derive(Clone)]
struct BlockRuns<'a> {
    data: &'a [u8],
    slots: Slots,
    runs: u32,
    /// The first live slot.
    first: u32,
    next: u32,
    stamp_ms: i64,
    /// Bit position of the next slot's gap (or of slot 0's count).
    pos: usize,
}

impl<'a> BlockRuns<'a> {
    /// From the first live slot (its stamp is the header's first).
    fn new(header: &Header, data: &'a [u8]) -> BlockRuns<'a> {
        let slots = header.layout();
        let pos = slots.count_pos(header.dead);
        BlockRuns {
            data,
            slots,
            runs: header.runs,
            first: header.dead,
            next: header.dead,
            stamp_ms: header.first_ms,
            pos,
        }
    }
}

impl Iterator for BlockRuns<'_> {
    type Item = (i64, u64);

    #[inline]
    fn next(&mut self) -> Option<(i64, u64)> {
        if self.next == self.runs {
            return None;
        }
        if self.next > self.first {
            let gap = get_bits(self.data, self.pos, self.slots.dw);
            self.pos += self.slots.dw as usize;
            self.stamp_ms += gap as i64 + 1;
        }
        let count = get_bits(self.data, self.pos, self.slots.cw) + 1;
        self.pos += self.slots.cw as usize;
        self.next += 1;
        Some((self.stamp_ms, count))
    }
}

// ---------------------------------------------------------------------------
// Blocks in memory.

/// An allocated block (see the module docs): it owns its allocation, which
/// its `Drop` frees (once: a block is not `Copy`), and is changed only
/// through `&mut self`. Its header's size class always names the size of the
/// allocation: only `alloc` and `resize` choose a class, and every other
/// header write carries the class it read.
#[derive(Debug)]
#[repr(transparent)]
struct Block(NonNull<u8>);

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated by `alloc`/`resize` with the layout of the class
        // its header names; `self` is its only owner, dropped once.
        unsafe { dealloc(self.0.as_ptr(), block_layout(self.header().class)) };
    }
}

impl Block {
    /// An empty block of the given class (every byte zero but the class).
    fn alloc(class: u32) -> Block {
        let layout = block_layout(class);
        // SAFETY: a layout of non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        let mut block = Block(ptr);
        block.set_header(&Header {
            class,
            ..Header::default()
        });
        block
    }

    /// A block of one run.
    fn with_run(stamp_ms: i64, count: u64) -> Block {
        let mut block = Block::alloc(0);
        block.reset_to(stamp_ms, count);
        block
    }

    /// A new newest block of a large window: one run, allocated at the
    /// largest size such a block fills to (as it will: admissions land there),
    /// so that it is not re-allocated as it fills.
    fn newest_of_large(stamp_ms: i64, count: u64) -> Block {
        let mut block = Block::alloc(class_for(INDEXED.bytes).unwrap());
        block.reset_to(stamp_ms, count);
        block
    }

    /// The allocation, given up by the block (its next owner frees it).
    fn into_ptr(self) -> NonNull<u8> {
        let ptr = self.0;
        std::mem::forget(self);
        ptr
    }

    fn size(&self) -> usize {
        SIZE_CLASSES[self.header().class as usize]
    }

    /// The whole allocation (every byte initialised: allocated zeroed, and
    /// zeroed where it grows).
    fn bytes(&self) -> &[u8] {
        // SAFETY: the block is a live allocation of `size` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), self.size()) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` is the only way to the allocation.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), self.size()) }
    }

    fn head_words(&self) -> &[u8] {
        // SAFETY: every block is at least 16 bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), HEADER_BYTES) }
    }

    fn header(&self) -> Header {
        Header::read(self.head_words())
    }

    fn set_header(&mut self, header: &Header) {
        // SAFETY: every block is at least 16 bytes.
        header.write(unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), HEADER_BYTES) })
    }

    fn runs(&self) -> BlockRuns<'_> {
        BlockRuns::new(&self.header(), self.bytes())
    }

    /// The header's first word (first stamp, widths): what the hot paths read first.
    fn word0(&self) -> u64 {
        // SAFETY: every block is at least 16 bytes, 8-aligned.
        unsafe { std::ptr::read(self.0.as_ptr() as *const u64) }.to_le()
    }

    fn word1(&self) -> u64 {
        // SAFETY: as in `word0`.
        unsafe { std::ptr::read(self.0.as_ptr().add(8) as *const u64) }.to_le()
    }

    fn set_words(&mut self, w0: u64, w1: u64) {
        // SAFETY: as in `word0`.
        unsafe {
            std::ptr::write(self.0.as_ptr() as *mut u64, w0.to_le());
            std::ptr::write(self.0.as_ptr().add(8) as *mut u64, w1.to_le());
        }
    }

    fn first_ms(&self) -> i64 {
        (self.word0() & STAMP_MASK) as i64
    }

    fn last_ms(&self) -> i64 {
        let (w0, w1) = (self.word0(), self.word1());
        (w0 & STAMP_MASK) as i64 + (w1 >> 24) as i64
    }

    /// Runs not trimmed (0: the block is empty).
    fn live_runs(&self) -> u32 {
        let w1 = self.word1();
        (((w1 >> 6) & 2047) - ((w1 >> 17) & 127)) as u32
    }

    fn entries(&self) -> u64 {
        if self.word0() >> 59 == 0 {
            // cw 0: one entry per live run.
            let w1 = self.word1();
            ((w1 >> 6) & 2047) - ((w1 >> 17) & 127)
        } else {
            get_bits(self.bytes(), DATA_BITS, ENTRIES_BITS)
        }
    }

    fn set_entries(&mut self, header: &Header, entries: u64) {
        if header.cw > 0 {
            set_bits(self.bytes_mut(), DATA_BITS, ENTRIES_BITS, entries);
        }
    }

    /// Makes the allocation the size class `class`, keeping the bytes that fit.
    fn resize(&mut self, class: u32) {
        let header = self.header();
        if header.class == class {
            return;
        }
        let (old_size, new_size) = (SIZE_CLASSES[header.class as usize], SIZE_CLASSES[class as usize]);
        // SAFETY: the block's allocation and layout; the new size is non-zero.
        let ptr = unsafe { realloc(self.0.as_ptr(), block_layout(header.class), new_size) };
        let Some(ptr) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(block_layout(class))
        };
        if new_size > old_size {
            // SAFETY: the grown part of the new allocation.
            unsafe { std::ptr::write_bytes(ptr.as_ptr().add(old_size), 0, new_size - old_size) };
        }
        self.0 = ptr;
        self.set_header(&Header { class, ..header });
    }

    /// Makes room for `bytes` (<= BLOCK_BYTES) bytes.
    fn reserve(&mut self, bytes: usize) {
        if bytes > self.size() {
            self.resize(class_for(bytes).expect("a block never exceeds BLOCK_BYTES"));
        }
    }

    /// Shifts the dead slots out: the first live run becomes slot 0.
    fn compact(&mut self) {
        let header = self.header();
        if header.dead == 0 {
            return;
        }
        let slots = header.layout();
        shift_bits_down(
            self.bytes_mut(),
            slots.count_pos(header.dead),
            slots.count_pos(0),
            slots.bits(header.runs),
        );
        self.set_header(&Header {
            runs: header.live(),
            dead: 0,
            ..header
        });
    }

    /// Gives back an allocation twice as large as what the live runs need
    /// (never below 64 B, so that a window hovering at a size class boundary
    /// never re-allocates).
    fn shrink_if_oversized(&mut self) {
        let header = self.header();
        let size = SIZE_CLASSES[header.class as usize];
        let used = header.layout().bytes(header.live());
        if size >= 64 && used * 2 <= size {
            self.compact();
            self.resize(class_for(used.max(32)).unwrap());
        }
    }

    /// Empties the block and gives it the one run `(stamp_ms, count)`.
    fn reset_to(&mut self, stamp_ms: i64, count: u64) {
        let cw = width_of(count - 1);
        let slots = Slots { dw: 0, cw };
        self.reserve(slots.bytes(1));
        let header = Header {
            first_ms: stamp_ms,
            dw: 0,
            cw,
            tag: TAG_BLOCK,
            class: self.header().class,
            runs: 1,
            dead: 0,
            span: 0,
        };
        self.set_header(&header);
        self.set_entries(&header, count);
        set_bits(self.bytes_mut(), slots.count_pos(0), cw, count - 1);
    }

    /// Empties the block (keeping its allocation).
    fn clear(&mut self) {
        let class = self.header().class;
        self.set_header(&Header {
            class,
            ..Header::default()
        });
    }

    /// Re-writes every live slot with wider (or equal) widths, in place, the
    /// dead ones shifted out (the allocation must hold the new layout).
    fn widen(&mut self, to: Slots) {
        if to == self.header().layout() {
            return;
        }
        self.compact();
        let header = self.header();
        let from = header.layout();
        debug_assert!(to.dw >= from.dw && to.cw >= from.cw);
        let entries = self.entries();
        let data = self.bytes_mut();
        if from == (Slots { dw: 0, cw: 0 }) {
            // Lone entries 1 ms apart: every field was 0 bits, so every one is 0.
            data[DATA_BITS / 8..to.bits(header.runs).div_ceil(8)].fill(0);
        } else {
            // One pass, oldest slot first, into a word buffer (each field
            // read once, written by shifts), copied back over the data.
            // The old bits are read from a copy padded with a zero word, so
            // that every field is one unaligned load away.
            let mut copy = [0u8; BLOCK_BYTES + 8];
            copy[..data.len()].copy_from_slice(data);
            let read = |pos: usize, width: u32| -> u64 {
                // SAFETY: pos / 8 + 8 <= data.len() + 8 for every field of the block.
                let word = u64::from_le(unsafe { std::ptr::read_unaligned(copy.as_ptr().add(pos / 8) as *const u64) });
                (word >> (pos % 8)) & mask(width)
            };
            let mut out = BitWriter::default();
            if to.cw > 0 {
                out.push(0, ENTRIES_BITS); // the entry count, set below
            }
            let mut pos = from.base();
            out.push(read(pos, from.cw), to.cw);
            pos += from.cw as usize;
            if from.cw == 0 && to.cw == 0 {
                // Lone entries: gaps only.
                for _ in 1..header.runs {
                    out.push(read(pos, from.dw), to.dw);
                    pos += from.dw as usize;
                }
            } else {
                for _ in 1..header.runs {
                    out.push(read(pos, from.dw), to.dw);
                    out.push(read(pos + from.dw as usize, from.cw), to.cw);
                    pos += from.slot_bits();
                }
            }
            let bytes = out.finish();
            debug_assert_eq!(
                DATA_BITS + bytes.len() * 8 - to.bits(header.runs),
                (8 - to.bits(header.runs) % 8) % 8
            );
            data[DATA_BITS / 8..DATA_BITS / 8 + bytes.len()].copy_from_slice(bytes);
        }
        let header = Header {
            dw: to.dw,
            cw: to.cw,
            ..header
        };
        self.set_header(&header);
        self.set_entries(&header, entries);
    }

    /// The common admission, read and written as header words: a run later
    /// than the block's last whose gap and count fit the block's widths, into
    /// a block with room (no dead slot to shift out, no allocation). False,
    /// with nothing changed, when any of that does not hold.
    #[inline(always)]
    fn try_append_in_place(&mut self, stamp_ms: i64, count: u64, limits: Limits) -> bool {
        let (w0, w1) = (self.word0(), self.word1());
        let (runs, dead) = (((w1 >> 6) & 2047) as u32, ((w1 >> 17) & 127) as u32);
        let (dw, cw, span) = (((w0 >> 53) & 63) as u32, (w0 >> 59) as u32, w1 >> 24);
        let gap = stamp_ms - (w0 & STAMP_MASK) as i64 - span as i64;
        if gap <= 0 || runs == dead {
            return false;
        }
        let gap = gap as u64;
        if (gap - 1) >> dw != 0 || (count - 1) >> cw != 0 || span + gap > MAX_SPAN {
            return false;
        }
        let size = SIZE_CLASSES[((w1 >> 1) & 31) as usize];
        let slots = Slots { dw, cw };
        let mut pos = slots.gap_pos(runs);
        let mut w1 = w1;
        if runs >= limits.runs || slots.bytes(runs + 1) > size {
            // Full, but for the room of trimmed runs: shifted out first (a
            // window at its limit that trims one run and adds one).
            let live = runs - dead;
            if dead == 0 || live >= limits.runs || slots.bytes(live + 1) > size {
                return false;
            }
            pos = slots.gap_pos(live);
            self.compact();
            w1 = self.word1();
        }
        let data = self.bytes_mut();
        set_bits(data, pos, dw, gap - 1);
        if cw > 0 {
            set_bits(data, pos + dw as usize, cw, count - 1);
            let entries = get_bits(data, DATA_BITS, ENTRIES_BITS) + count;
            set_bits(data, DATA_BITS, ENTRIES_BITS, entries);
        }
        self.set_words(w0, w1 + (1 << 6) + (gap << 24));
        true
    }

    /// Appends a run later than the block's last; false (nothing changed but
    /// dead slots shifted out) if the block is full: runs, bytes or span.
    fn try_append(&mut self, stamp_ms: i64, count: u64, limits: Limits) -> bool {
        if self.try_append_in_place(stamp_ms, count, limits) {
            return true;
        }
        let mut header = self.header();
        if header.live() == 0 {
            self.reset_to(stamp_ms, count);
            return true;
        }
        debug_assert!(stamp_ms > header.last_ms());
        let gap = (stamp_ms - header.last_ms()) as u64;
        if header.span + gap > MAX_SPAN {
            return false;
        }
        let to = Slots {
            dw: header.dw.max(width_of(gap - 1)),
            cw: header.cw.max(width_of(count - 1)),
        };
        if header.dead > 0
            && (header.runs >= limits.runs || to.bytes(header.runs + 1) > SIZE_CLASSES[header.class as usize])
        {
            // The room of trimmed runs, before any more.
            self.compact();
            header = self.header();
        }
        let bytes = to.bytes(header.runs + 1);
        if header.runs >= limits.runs || bytes > limits.bytes {
            return false;
        }
        if to != header.layout() {
            // Rare: a wider gap or count than any before re-packs the block.
            self.reserve(bytes);
            self.widen(to);
            header = self.header();
        } else if bytes > SIZE_CLASSES[header.class as usize] {
            // An inline window takes the smallest class that holds it (its
            // memory is the claim); a block of a large window, which fills,
            // grows by half at least, in fewer moves. Under 2x, so that the
            // block is never oversized (`shrink_if_oversized`) right after.
            let size = SIZE_CLASSES[header.class as usize];
            let want = if limits == INDEXED {
                bytes.max(size * 3 / 2).min(limits.bytes)
            } else {
                bytes
            };
            self.resize(class_for(want).expect("a block never exceeds BLOCK_BYTES"));
            header.class = self.header().class;
        }
        // The common case from here: one header read, two fields and one header written.
        let data = self.bytes_mut();
        set_bits(data, to.gap_pos(header.runs), to.dw, gap - 1);
        set_bits(data, to.count_pos(header.runs), to.cw, count - 1);
        if to.cw > 0 {
            let entries = get_bits(data, DATA_BITS, ENTRIES_BITS) + count;
            set_bits(data, DATA_BITS, ENTRIES_BITS, entries);
        }
        header.runs += 1;
        header.span += gap;
        self.set_header(&header);
        true
    }

    /// Adds `count` to the last run; false (nothing changed but dead slots
    /// shifted out) if its wider count would not fit in BLOCK_BYTES (a block
    /// of a large window may outgrow its admission limit here: it stays bounded).
    fn try_add_to_last(&mut self, count: u64) -> bool {
        let header = self.header();
        let slots = header.layout();
        let held = get_bits(self.bytes(), slots.count_pos(header.runs - 1), slots.cw) + 1;
        let to = Slots {
            dw: header.dw,
            cw: header.cw.max(width_of(held + count - 1)),
        };
        if to != slots {
            self.compact();
        }
        let header = self.header();
        let last = header.runs - 1;
        let bytes = to.bytes(header.runs);
        if bytes > BLOCK_BYTES {
            return false;
        }
        self.reserve(bytes);
        self.widen(to);
        let entries = self.entries() + count;
        set_bits(self.bytes_mut(), to.count_pos(last), to.cw, held + count - 1);
        self.set_entries(&self.header(), entries);
        true
    }

    /// Trims the first `k` (< live) live runs, `entries_removed` entries in
    /// all, the first run left being stamped `first_ms`: they become dead
    /// slots, shifted out once there are more than MAX_DEAD.
    fn drop_front(&mut self, k: u32, entries_removed: u64, first_ms: i64) {
        if k > 0 {
            self.drop_front_of(self.header(), k, entries_removed, first_ms, true);
        }
    }

    /// `drop_front` with the block's header at hand; `shrink`: whether the
    /// block may give back room once the dead slots are shifted out (not the
    /// oldest block of a large window, which trims empty and frees soon).
    fn drop_front_of(&mut self, header: Header, k: u32, entries_removed: u64, first_ms: i64, shrink: bool) {
        let entries = if header.cw == 0 {
            u64::from(header.live())
        } else {
            get_bits(self.bytes(), DATA_BITS, ENTRIES_BITS)
        } - entries_removed;
        if header.dead + k <= MAX_DEAD {
            // The common case, as header words: the first stamp, the dead
            // mark and the span change; tag, class and slots stay.
            let w0 = (self.word0() & !STAMP_MASK) | first_ms as u64;
            let w1 = (self.word1() & ((1 << 17) - 1))
                | u64::from(header.dead + k) << 17
                | ((header.last_ms() - first_ms) as u64) << 24;
            self.set_words(w0, w1);
            if header.cw > 0 {
                set_bits(self.bytes_mut(), DATA_BITS, ENTRIES_BITS, entries);
            }
            return;
        }
        let header = Header {
            first_ms,
            dead: header.dead + k,
            span: (header.last_ms() - first_ms) as u64,
            ..header
        };
        if header.dead > MAX_DEAD {
            // More dead slots than the header counts: shifted out now, and
            // only then can the block shrink (dead slots free no byte).
            let slots = header.layout();
            shift_bits_down(
                self.bytes_mut(),
                slots.count_pos(header.dead),
                slots.count_pos(0),
                slots.bits(header.runs),
            );
            let header = Header {
                runs: header.live(),
                dead: 0,
                ..header
            };
            self.set_header(&header);
            self.set_entries(&header, entries);
            if shrink {
                self.shrink_if_oversized();
            }
        } else {
            self.set_header(&header);
            self.set_entries(&header, entries);
        }
    }

    /// The common trim, read and written as header words: nothing expired, or
    /// some runs of lone entries (no count bits) that become dead slots, the
    /// block keeping a live run and at most MAX_DEAD dead ones. Returns how
    /// many entries went, or None, with nothing changed, for any other case.
    #[inline(always)]
    fn trim_in_place(&mut self, cutoff_ms: i64) -> Option<u64> {
        let w0 = self.word0();
        let first_ms = (w0 & STAMP_MASK) as i64;
        if first_ms > cutoff_ms {
            return Some(0);
        }
        let w1 = self.word1();
        let (runs, dead, span) = (((w1 >> 6) & 2047) as u32, ((w1 >> 17) & 127) as u32, w1 >> 24);
        let last_ms = first_ms + span as i64;
        if w0 >> 59 != 0 || runs == dead || last_ms <= cutoff_ms {
            return None;
        }
        // The expired runs, from the first live one; the last run is live.
        let dw = ((w0 >> 53) & 63) as u32;
        let data = self.bytes();
        let (mut slot, mut stamp_ms) = (dead, first_ms);
        let mut pos = DATA_BITS + dead as usize * dw as usize;
        loop {
            slot += 1;
            stamp_ms += get_bits(data, pos, dw) as i64 + 1;
            pos += dw as usize;
            if stamp_ms > cutoff_ms {
                break;
            }
        }
        if slot > MAX_DEAD {
            return None;
        }
        // The first stamp, the dead mark and the span change; tag, class and slots stay.
        let w0 = (w0 & !STAMP_MASK) | stamp_ms as u64;
        let w1 = (w1 & ((1 << 17) - 1)) | u64::from(slot) << 17 | ((last_ms - stamp_ms) as u64) << 24;
        self.set_words(w0, w1);
        Some(u64::from(slot - dead))
    }

    /// Removes every entry stamped `<= cutoff_ms`; returns how many went. The
    /// block may be left empty (no live runs).
    /// `shrink` as in `drop_front_of`.
    #[inline(always)]
    fn trim(&mut self, cutoff_ms: i64, shrink: bool) -> u64 {
        match self.trim_in_place(cutoff_ms) {
            Some(removed) => removed,
            None => self.trim_slow(cutoff_ms, shrink),
        }
    }

    /// `trim` for every case.
    #[inline(never)]
    fn trim_slow(&mut self, cutoff_ms: i64, shrink: bool) -> u64 {
        if self.first_ms() > cutoff_ms {
            return 0;
        }
        let header = self.header();
        if header.live() == 0 {
            return 0;
        }
        if header.last_ms() <= cutoff_ms {
            let removed = self.entries();
            self.clear();
            self.shrink_if_oversized();
            return removed;
        }
        // The expired runs, from the first live one; the last run is live.
        let slots = header.layout();
        let data = self.bytes();
        let (mut slot, mut stamp_ms, mut removed) = (header.dead, header.first_ms, 0u64);
        loop {
            removed += get_bits(data, slots.count_pos(slot), slots.cw) + 1;
            slot += 1;
            stamp_ms += get_bits(data, slots.gap_pos(slot), slots.dw) as i64 + 1;
            if stamp_ms > cutoff_ms {
                break;
            }
        }
        self.drop_front_of(header, slot - header.dead, removed, stamp_ms, shrink);
        removed
    }

    /// Entries stamped `<= cutoff_ms`.
    fn count_le(&self, cutoff_ms: i64) -> u64 {
        let header = self.header();
        if header.live() == 0 || header.first_ms > cutoff_ms {
            return 0;
        }
        if header.last_ms() <= cutoff_ms {
            return self.entries();
        }
        self.runs()
            .take_while(|&(stamp, _)| stamp <= cutoff_ms)
            .map(|(_, count)| count)
            .sum()
    }

    /// Stamp of the `n`-th (1-based, <= entries) entry.
    fn nth(&self, n: u64) -> Option<i64> {
        let mut seen = 0;
        self.runs().find_map(|(stamp, count)| {
            seen += count;
            (seen >= n).then_some(stamp)
        })
    }

    /// The live run stamped `stamp_ms` (within the block's first and last
    /// stamps), as (its slot, its count, the gap from the previous live run,
    /// 0 for the first): found from the header for the newest, else by a walk
    /// of the slots from whichever end of the block is nearer in time.
    fn find_run(&self, header: &Header, stamp_ms: i64) -> Option<(u32, u64, u64)> {
        let slots = header.layout();
        let data = self.bytes();
        let (first, last) = (header.dead, header.runs - 1);
        let gap_of = |i: u32| {
            if i > first {
                get_bits(data, slots.gap_pos(i), slots.dw) + 1
            } else {
                0
            }
        };
        let count_of = |i: u32| get_bits(data, slots.count_pos(i), slots.cw) + 1;
        if header.last_ms() - stamp_ms <= stamp_ms - header.first_ms {
            // Newest first: slot i's stamp is the next one's minus its gap.
            let (mut i, mut at) = (last, header.last_ms());
            loop {
                if at == stamp_ms {
                    return Some((i, count_of(i), gap_of(i)));
                }
                if at < stamp_ms || i == first {
                    return None;
                }
                at -= gap_of(i) as i64;
                i -= 1;
            }
        }
        let (mut i, mut at) = (first, header.first_ms);
        loop {
            if at == stamp_ms {
                return Some((i, count_of(i), gap_of(i)));
            }
            if at > stamp_ms || i == last {
                return None;
            }
            i += 1;
            at += gap_of(i) as i64;
        }
    }

    /// Removes up to `count` entries stamped exactly `stamp_ms`; returns how
    /// many went, or `Err(())` when the run must go and its neighbours' gap no
    /// longer fits this block (the caller rewrites it).
    fn remove_at(&mut self, stamp_ms: i64, count: u64) -> Result<u64, ()> {
        let header = self.header();
        if header.live() == 0 || stamp_ms < header.first_ms || stamp_ms > header.last_ms() {
            return Ok(0);
        }
        let slots = header.layout();
        let last = header.runs - 1;
        // The newest run is found from the header: O(1); any other by a walk
        // from the nearer end of the block. `index` is a slot.
        let Some((index, held, gap)) = self.find_run(&header, stamp_ms) else {
            return Ok(0);
        };
        let removed = held.min(count);
        let entries = self.entries() - removed;
        if removed < held {
            set_bits(self.bytes_mut(), slots.count_pos(index), slots.cw, held - removed - 1);
            self.set_entries(&header, entries);
            return Ok(removed);
        }
        // The whole run goes.
        if header.live() == 1 {
            self.clear();
            self.shrink_if_oversized();
            return Ok(removed);
        }
        if index == last {
            let header = Header {
                runs: last,
                span: header.span - gap,
                ..header
            };
            self.set_header(&header);
            self.set_entries(&header, entries);
            self.shrink_if_oversized();
            return Ok(removed);
        }
        if index == header.dead {
            let next_gap = get_bits(self.bytes(), slots.gap_pos(index + 1), slots.dw) + 1;
            self.drop_front(1, removed, header.first_ms + next_gap as i64);
            return Ok(removed);
        }
        // A middle run: the next run's gap absorbs this one's, the block
        // widening its gaps first if it must (and can).
        let next_gap = get_bits(self.bytes(), slots.gap_pos(index + 1), slots.dw) + 1;
        let merged = gap + next_gap - 1;
        let (slots, index) = if width_of(merged) > slots.dw {
            let wider = Slots {
                dw: width_of(merged),
                cw: slots.cw,
            };
            let bytes = wider.bytes(header.live());
            if bytes > BLOCK_BYTES {
                return Err(());
            }
            self.reserve(bytes);
            self.widen(wider); // shifts the dead slots out
            (wider, index - header.dead)
        } else {
            (slots, index)
        };
        let header = self.header();
        let data = self.bytes_mut();
        set_bits(data, slots.gap_pos(index + 1), slots.dw, merged);
        shift_bits_down(
            data,
            slots.gap_pos(index + 1),
            slots.gap_pos(index),
            slots.bits(header.runs),
        );
        let header = Header {
            runs: header.runs - 1,
            ..header
        };
        self.set_header(&header);
        self.set_entries(&header, entries);
        self.shrink_if_oversized();
        Ok(removed)
    }

    /// A block of as many of `runs` (at least one) as fit, allocated at its
    /// final size and written once; returns it and how many runs it took.
    fn pack(runs: &[(i64, u64)], limits: Limits) -> (Block, usize) {
        let first_ms = runs[0].0;
        let mut slots = Slots {
            dw: 0,
            cw: width_of(runs[0].1 - 1),
        };
        let mut taken = 1;
        while taken < runs.len() && taken < limits.runs as usize {
            let (stamp_ms, count) = runs[taken];
            if (stamp_ms - first_ms) as u64 > MAX_SPAN {
                break;
            }
            let gap = (stamp_ms - runs[taken - 1].0) as u64;
            let wider = Slots {
                dw: slots.dw.max(width_of(gap - 1)),
                cw: slots.cw.max(width_of(count - 1)),
            };
            if wider.bytes(taken as u32 + 1) > limits.bytes {
                break;
            }
            slots = wider;
            taken += 1;
        }
        let runs = &runs[..taken];
        let mut block = Block::alloc(class_for(slots.bytes(taken as u32)).unwrap());
        let header = Header {
            first_ms,
            dw: slots.dw,
            cw: slots.cw,
            tag: TAG_BLOCK,
            class: block.header().class,
            runs: taken as u32,
            dead: 0,
            span: (runs[taken - 1].0 - first_ms) as u64,
        };
        block.set_header(&header);
        let data = block.bytes_mut();
        let mut entries = 0;
        for (i, &(stamp_ms, count)) in runs.iter().enumerate() {
            if i > 0 {
                set_bits(
                    data,
                    slots.gap_pos(i as u32),
                    slots.dw,
                    (stamp_ms - runs[i - 1].0) as u64 - 1,
                );
            }
            set_bits(data, slots.count_pos(i as u32), slots.cw, count - 1);
            entries += count;
        }
        block.set_entries(&header, entries);
        (block, taken)
    }

    /// A copy of this block in a fresh allocation of the same size.
    fn duplicate(&self) -> Block {
        let mut copy = Block::alloc(self.header().class);
        copy.bytes_mut().copy_from_slice(self.bytes());
        copy
    }
}

/// Blocks holding `runs` (stamps increasing, counts >= 1), filled as
/// admissions fill them.
/// Blocks holding `runs` (stamps increasing, counts >= 1): with
/// `inline_if_it_fits`, one inline block if they fit in one; else blocks of a
/// large window.
fn build_blocks(runs: impl IntoIterator<Item = (i64, u64)>, inline_if_it_fits: bool) -> Vec<Block> {
    let runs: Vec<(i64, u64)> = runs.into_iter().collect();
    if runs.is_empty() {
        return Vec::new();
    }
    if inline_if_it_fits {
        let (block, taken) = Block::pack(&runs, INLINE);
        if taken == runs.len() {
            return vec![block];
        }
        drop(block);
    }
    let mut blocks = Vec::with_capacity(runs.len() / 128 + 1);
    let mut rest = &runs[..];
    while !rest.is_empty() {
        let (block, taken) = Block::pack(rest, INDEXED);
        blocks.push(block);
        rest = &rest[taken..];
    }
    blocks
}

// ---------------------------------------------------------------------------
// The large form's root: the index of blocks.

/// One block of a large window, as the index knows it.
#[repr(C)]
#[derive(Debug)]
struct BlockRef {
    first_ms: i64,
    entries: u32,
    _unused: u32,
    block: Block,
}

impl BlockRef {
    fn of(block: Block) -> BlockRef {
        BlockRef {
            first_ms: block.first_ms(),
            entries: block.entries() as u32,
            _unused: 0,
            block,
        }
    }

    /// Reads the first stamp and the entry count again from the block.
    fn refresh(&mut self) {
        self.first_ms = self.block.first_ms();
        self.entries = self.block.entries() as u32;
    }
}

/// The root of a large window: a 32-byte header (entries, the tag word, the
/// live range `[head, len)` of the index, its capacity), then the index. It
/// owns its allocation and the blocks of the live range: its `Drop` frees
/// them all, once (it is not `Copy`). Only this type writes the range and the
/// capacity, so the refs in `[head, len)` are always initialised and within
/// the allocation.
#[derive(Debug)]
#[repr(transparent)]
struct Large(NonNull<u8>);

const LARGE_HEADER: usize = 32;

impl Drop for Large {
    fn drop(&mut self) {
        let (head, len, capacity) = self.range();
        // SAFETY: the refs in `[head, len)` are initialised and owned by the
        // root (each dropped once, here); then the root's own allocation,
        // with the layout of its capacity.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.refs_ptr().add(head as usize),
                (len - head) as usize,
            ));
            dealloc(self.0.as_ptr(), Large::layout(capacity));
        }
    }
}

impl Large {
    fn layout(capacity: u32) -> Layout {
        Layout::from_size_align(LARGE_HEADER + capacity as usize * std::mem::size_of::<BlockRef>(), 8).unwrap()
    }

    /// A root indexing `blocks`, in order.
    fn new(blocks: impl ExactSizeIterator<Item = Block>) -> Large {
        let capacity = (blocks.len() as u32).next_power_of_two().max(4);
        let layout = Large::layout(capacity);
        // SAFETY: a layout of non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        let mut large = Large(ptr);
        large.set_head(0, 0, 0, capacity);
        let mut entries = 0;
        for block in blocks {
            entries += block.entries();
            large.push(block);
        }
        large.set_entries(entries);
        debug_assert_eq!(large.range().2, capacity);
        large
    }

    /// The allocation, given up by the root (its next owner frees it).
    fn into_ptr(self) -> NonNull<u8> {
        let ptr = self.0;
        std::mem::forget(self);
        ptr
    }

    fn words(&self) -> [u64; 4] {
        // SAFETY: the root is a live allocation of at least 32 bytes, 8-aligned.
        std::array::from_fn(|i| u64::from_le(unsafe { std::ptr::read((self.0.as_ptr() as *const u64).add(i)) }))
    }

    fn set_head(&mut self, entries: u64, head: u32, len: u32, capacity: u32) {
        let words = [
            entries,
            TAG_LARGE,
            u64::from(head) | u64::from(len) << 32,
            u64::from(capacity),
        ];
        for (i, word) in words.into_iter().enumerate() {
            // SAFETY: as in `words`; `&mut self` is the only way to the root.
            unsafe { std::ptr::write((self.0.as_ptr() as *mut u64).add(i), word.to_le()) };
        }
    }

    fn entries(&self) -> u64 {
        // SAFETY: as in `words`.
        u64::from_le(unsafe { std::ptr::read(self.0.as_ptr() as *const u64) })
    }

    fn range(&self) -> (u32, u32, u32) {
        let words = self.words();
        (words[2] as u32, (words[2] >> 32) as u32, words[3] as u32)
    }

    fn set_entries(&mut self, entries: u64) {
        // SAFETY: the root's first word, 8-aligned; `&mut self` as in `set_head`.
        unsafe { std::ptr::write(self.0.as_ptr() as *mut u64, entries.to_le()) };
    }

    /// The first slot of the index (a raw pointer: whoever writes through
    /// it holds `&mut self`).
    fn refs_ptr(&self) -> *mut BlockRef {
        // SAFETY: the index starts right after the 32-byte header, 8-aligned,
        // within the allocation.
        unsafe { self.0.as_ptr().add(LARGE_HEADER) as *mut BlockRef }
    }

    /// The live blocks, oldest first.
    fn refs(&self) -> &[BlockRef] {
        let (head, len, _) = self.range();
        // SAFETY: the refs in `[head, len)` are initialised (see the type),
        // BlockRef is repr(C) with 8-byte alignment; borrowed with `self`.
        unsafe { std::slice::from_raw_parts(self.refs_ptr().add(head as usize), (len - head) as usize) }
    }

    /// The live blocks, oldest first, to change.
    fn refs_mut(&mut self) -> &mut [BlockRef] {
        let (head, len, _) = self.range();
        // SAFETY: as in `refs`; `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.refs_ptr().add(head as usize), (len - head) as usize) }
    }

    /// Makes room for `needed` refs in all: the dead prefix is dropped first,
    /// then the index doubles.
    fn reserve(&mut self, needed: u32) {
        let (head, len, capacity) = self.range();
        let entries = self.entries();
        if head > 0 && len == capacity {
            self.move_to_front();
        }
        let (head, len, capacity) = self.range();
        let needed = needed + head;
        if needed > capacity {
            let grown = needed.next_power_of_two();
            // SAFETY: the root's allocation and layout; the new size is larger.
            let ptr = unsafe { realloc(self.0.as_ptr(), Large::layout(capacity), Large::layout(grown).size()) };
            let Some(ptr) = NonNull::new(ptr) else {
                std::alloc::handle_alloc_error(Large::layout(grown))
            };
            self.0 = ptr;
            self.set_head(entries, head, len, grown);
        }
    }

    /// Moves the live refs to the start of the index (head 0).
    fn move_to_front(&mut self) {
        let (head, len, capacity) = self.range();
        // SAFETY: the live refs move (bitwise, as a whole) to the slots from
        // 0, within the capacity; the range then names them there, so each
        // is still owned once.
        unsafe {
            std::ptr::copy(
                self.refs_ptr().add(head as usize),
                self.refs_ptr(),
                (len - head) as usize,
            )
        };
        self.set_head(self.entries(), 0, len - head, capacity);
    }

    /// `Block::try_append_in_place` on the newest block, counted in the index.
    #[inline(always)]
    fn try_append_in_place(&mut self, stamp_ms: i64, cost: u64) -> bool {
        let Some(r) = self.refs_mut().last_mut() else {
            return false;
        };
        if !r.block.try_append_in_place(stamp_ms, cost, INDEXED) {
            return false;
        }
        r.entries += cost as u32;
        self.set_entries(self.entries() + cost);
        true
    }

    /// Appends a block (its entries are added by the caller).
    fn push(&mut self, block: Block) {
        let (head, len, _) = self.range();
        self.reserve(len - head + 1);
        let (head, len, capacity) = self.range();
        // SAFETY: `len < capacity` after `reserve`: a free slot, which the
        // range then names.
        unsafe { std::ptr::write(self.refs_ptr().add(len as usize), BlockRef::of(block)) };
        self.set_head(self.entries(), head, len + 1, capacity);
    }

    /// Puts `blocks` in place of the live block at `at`, counts their entries
    /// instead of its own, and returns that block (freed when dropped).
    fn splice(&mut self, at: usize, blocks: Vec<Block>) -> Block {
        let (head, len, _) = self.range();
        let old_entries = u64::from(self.refs()[at].entries);
        let added: u64 = blocks.iter().map(Block::entries).sum();
        let n = blocks.len();
        self.reserve(len - head - 1 + n as u32);
        let (head, len, capacity) = self.range();
        let at = head as usize + at;
        let tail = len as usize - at - 1;
        // SAFETY: `at` is a live slot (`refs()[at]` above checked it): its
        // block moves out to the caller; the tail moves as a whole and the new
        // refs fill the gap, all within the capacity reserved; the range then
        // names exactly the initialised slots.
        let old = unsafe {
            let old = std::ptr::read(self.refs_ptr().add(at)).block;
            std::ptr::copy(self.refs_ptr().add(at + 1), self.refs_ptr().add(at + n), tail);
            for (i, block) in blocks.into_iter().enumerate() {
                std::ptr::write(self.refs_ptr().add(at + i), BlockRef::of(block));
            }
            old
        };
        let entries = self.entries() - old_entries + added;
        self.set_head(entries, head, (at + n + tail) as u32, capacity);
        old
    }

    /// Drops (frees) the first `k` live blocks, holding `entries_removed`.
    fn drop_front(&mut self, k: u32, entries_removed: u64) {
        let (head, len, capacity) = self.range();
        assert!(k <= len - head);
        let entries = self.entries() - entries_removed;
        // SAFETY: the first `k` live refs, initialised; the range stops
        // naming them right after, so each is dropped once.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.refs_ptr().add(head as usize),
                k as usize,
            ))
        };
        let head = head + k;
        self.set_head(entries, head, len, capacity);
        // The dead prefix is reused by `push`, or dropped here once it is
        // half the index: O(1) amortised per block.
        if head >= 16 && head * 2 >= len {
            self.move_to_front();
        }
    }

    /// `trim` of a large window, for every case; the root may be left with
    /// one block (the caller collapses it).
    fn trim(&mut self, cutoff_ms: i64) -> u64 {
        let refs = self.refs();
        // Whole blocks whose successor starts at or before the cutoff
        // are all expired; the last block is always kept (maybe emptied).
        let mut gone = 0;
        let mut removed = 0u64;
        while gone + 1 < refs.len() && refs[gone + 1].first_ms <= cutoff_ms {
            removed += u64::from(refs[gone].entries);
            gone += 1;
        }
        if gone > 0 {
            self.drop_front(gone as u32, removed);
        }
        let r = &mut self.refs_mut()[0];
        let trimmed = r.block.trim(cutoff_ms, false);
        if trimmed == 0 && gone == 0 {
            return 0;
        }
        let emptied = r.block.live_runs() == 0;
        if trimmed > 0 {
            r.first_ms = r.block.first_ms();
            r.entries -= trimmed as u32;
            self.set_entries(self.entries() - trimmed);
        }
        if emptied && self.refs().len() > 1 {
            self.drop_front(1, 0);
        }
        removed + trimmed
    }

    /// The one live block, out of a root that holds exactly one (the root's
    /// allocation is freed).
    fn into_single(mut self) -> Block {
        let (head, len, capacity) = self.range();
        assert_eq!(len - head, 1);
        // SAFETY: the one live ref; the range then names none, so the root's
        // `Drop` frees only its own allocation and the block has one owner.
        let block = unsafe { std::ptr::read(self.refs_ptr().add(head as usize)) }.block;
        self.set_head(self.entries(), len, len, capacity);
        block
    }

    /// Index of the last live block whose first stamp is `<= stamp_ms`, or 0:
    /// the newest block without a search (where admissions and refunds of the
    /// newest land), else a binary search of the index.
    fn find(&self, stamp_ms: i64) -> usize {
        let refs = self.refs();
        let last = refs.len() - 1;
        if refs[last].first_ms <= stamp_ms {
            return last;
        }
        refs[..last]
            .partition_point(|r| r.first_ms <= stamp_ms)
            .saturating_sub(1)
    }
}

// ---------------------------------------------------------------------------
// The log.

/// A window's log of entries (see the module docs). One pointer: null when
/// nothing was ever recorded; else a block (inline form) or a large root.
/// Owns its allocations.
#[derive(Debug, Default)]
pub struct RunLog {
    root: Option<NonNull<u8>>,
}

/// The root, owned, by form.
enum Root {
    Inline(Block),
    Large(Large),
}

/// The root, borrowed, by form.
enum RootRef<'a> {
    Inline(&'a Block),
    Large(&'a Large),
}

/// The root, borrowed to change, by form.
enum RootMut<'a> {
    Inline(&'a mut Block),
    Large(&'a mut Large),
}

/// Why a canonical byte string is not a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Empty,
    /// The bytes end inside a run (version 1) or a group (version 2).
    Truncated,
    /// A varint longer than needed or above 2^64 - 1.
    BadVarint,
    /// A run flagged as holding several entries holds fewer than 2.
    BadCount,
    /// A run's stamp is not above the previous one's.
    Unsorted,
    /// A stamp above 2^53 - 1.
    StampRange,
    /// More entries than any window can hold.
    TooMany,
    /// A group header out of range (version 2).
    BadGroup,
    /// A well-formed window, but not its canonical bytes (version 2).
    NotCanonical,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecodeError::Empty => "no entries (an empty window is never stored)",
            DecodeError::Truncated => "the bytes end inside a run or group",
            DecodeError::BadVarint => "a varint is overlong or overflows 64 bits",
            DecodeError::BadCount => "a run marked as several entries holds fewer than 2",
            DecodeError::Unsorted => "run stamps are not strictly increasing",
            DecodeError::StampRange => "a stamp is above 2^53 - 1",
            DecodeError::TooMany => "more entries than a window can hold (1000000000)",
            DecodeError::BadGroup => "a group header is out of range (tag, size class, runs, widths or span)",
            DecodeError::NotCanonical => "the runs are valid but not in their canonical encoding",
        })
    }
}

impl Drop for RunLog {
    fn drop(&mut self) {
        // The block, or the root and its blocks, are freed by their own `Drop`.
        drop(self.take_root());
    }
}

impl Clone for RunLog {
    fn clone(&self) -> RunLog {
        let mut copy = RunLog::default();
        match self.root() {
            None => {}
            Some(RootRef::Inline(block)) => copy.set_root(Root::Inline(block.duplicate())),
            Some(RootRef::Large(large)) => copy.set_root(Root::Large(Large::new(
                large.refs().iter().map(|r| r.block.duplicate()),
            ))),
        }
        copy
    }
}

/// Which form a log is in (for the tests).
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    Empty,
    /// One block: the value is one allocation.
    Inline,
    /// This many blocks under an index.
    Large(usize),
}

/// Whether a root pointer is a large root (else a block): both start with
/// two words, the tag in the low bits of the second.
fn is_large(ptr: NonNull<u8>) -> bool {
    // SAFETY: a root is a live allocation of at least 16 bytes, 8-aligned.
    let word = u64::from_le(unsafe { std::ptr::read(ptr.as_ptr().add(8) as *const u64) });
    word & 3 == TAG_LARGE
}

impl RunLog {
    /// The root, borrowed, by form.
    #[inline(always)]
    fn root(&self) -> Option<RootRef<'_>> {
        let slot: &NonNull<u8> = self.root.as_ref()?;
        Some(if is_large(*slot) {
            // SAFETY: `Large` is a repr(transparent) NonNull<u8>, and the
            // tag says the pointer is a large root; borrowed with `self`.
            RootRef::Large(unsafe { &*(slot as *const NonNull<u8> as *const Large) })
        } else {
            // SAFETY: as above, for a block.
            RootRef::Inline(unsafe { &*(slot as *const NonNull<u8> as *const Block) })
        })
    }

    /// The root, borrowed to change, by form.
    #[inline(always)]
    fn root_mut(&mut self) -> Option<RootMut<'_>> {
        let slot: &mut NonNull<u8> = self.root.as_mut()?;
        Some(if is_large(*slot) {
            // SAFETY: as in `root`; `&mut self` makes this the only borrow.
            RootMut::Large(unsafe { &mut *(slot as *mut NonNull<u8> as *mut Large) })
        } else {
            // SAFETY: as above, for a block.
            RootMut::Inline(unsafe { &mut *(slot as *mut NonNull<u8> as *mut Block) })
        })
    }

    /// The root, taken out of the log (which holds nothing then).
    fn take_root(&mut self) -> Option<Root> {
        let ptr = self.root.take()?;
        Some(if is_large(ptr) {
            Root::Large(Large(ptr))
        } else {
            Root::Inline(Block(ptr))
        })
    }

    /// Makes `root` the log's; the log must hold nothing (what it held would leak).
    fn set_root(&mut self, root: Root) {
        debug_assert!(self.root.is_none());
        self.root = Some(match root {
            Root::Inline(block) => block.into_ptr(),
            Root::Large(large) => large.into_ptr(),
        });
    }

    /// The log's root pointer, to store as a module value; the log is kept.
    pub fn as_raw(&self) -> *mut u8 {
        self.root.map_or(std::ptr::null_mut(), NonNull::as_ptr)
    }

    /// The log's root pointer, given up to the caller (who owns it then).
    pub fn into_raw(self) -> *mut u8 {
        let ptr = self.as_raw();
        std::mem::forget(self);
        ptr
    }

    /// Takes back a pointer from [`RunLog::into_raw`] (or `as_raw` of a log
    /// that is then forgotten).
    ///
    /// # Safety
    /// `ptr` must be null or a root this module handed out, owned by nobody else.
    pub unsafe fn from_raw(ptr: *mut u8) -> RunLog {
        RunLog {
            root: NonNull::new(ptr),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[cfg_attr(not(test), allow(dead_code))]
    pub fn form(&self) -> Form {
        match self.root() {
            _ if self.is_empty() => Form::Empty,
            None => Form::Empty,
            Some(RootRef::Inline(_)) => Form::Inline,
            Some(RootRef::Large(large)) => Form::Large(large.refs().len()),
        }
    }

    /// Every allocation of the log, as (pointer, size): for MEMORY USAGE,
    /// `free_effort` and active defrag.
    pub fn allocations(&self, mut each: impl FnMut(*const u8, usize)) {
        match self.root() {
            None => {}
            Some(RootRef::Inline(block)) => each(block.0.as_ptr(), block.size()),
            Some(RootRef::Large(large)) => {
                let (_, _, capacity) = large.range();
                each(large.0.as_ptr(), Large::layout(capacity).size());
                for r in large.refs() {
                    each(r.block.0.as_ptr(), r.block.size());
                }
            }
        }
    }

    /// Lets `move_to` move every allocation elsewhere (active defrag): it gets
    /// each pointer and returns the new one, or null to leave it.
    ///
    /// # Safety
    /// `move_to` must return null or a pointer to an allocation of the same
    /// allocator and size holding a copy of the old one, which it has freed.
    pub unsafe fn relocate(&mut self, mut move_to: impl FnMut(*mut u8) -> *mut u8) {
        let mut moved = |ptr: &mut NonNull<u8>| {
            if let Some(new) = NonNull::new(move_to(ptr.as_ptr())) {
                *ptr = new;
            }
        };
        match self.root_mut() {
            None => {}
            Some(RootMut::Inline(block)) => moved(&mut block.0),
            Some(RootMut::Large(large)) => {
                for r in large.refs_mut() {
                    moved(&mut r.block.0);
                }
                moved(&mut large.0);
            }
        }
    }

    /// Every run, oldest first, as `(stamp_ms, count)`; allocates nothing.
    pub fn runs(&self) -> Runs<'_> {
        let (blocks, single): (&[BlockRef], Option<&Block>) = match self.root() {
            None => (&[], None),
            Some(RootRef::Inline(block)) => (&[], Some(block)),
            Some(RootRef::Large(large)) => (large.refs(), None),
        };
        Runs {
            blocks,
            single,
            current: None,
        }
    }

    /// A log of these runs (stamps strictly increasing, counts >= 1), laid out
    /// as admissions lay them out.
    pub fn from_runs(runs: impl IntoIterator<Item = (i64, u64)>) -> RunLog {
        let mut log = RunLog::default();
        log.adopt(build_blocks(runs, true));
        log
    }

    /// Makes `blocks` the log's blocks; the log must hold nothing.
    fn adopt(&mut self, blocks: Vec<Block>) {
        debug_assert!(self.root.is_none());
        if blocks.len() > 1 {
            self.set_root(Root::Large(Large::new(blocks.into_iter())));
        } else if let Some(block) = blocks.into_iter().next() {
            self.set_root(Root::Inline(block));
        }
    }

    /// A large root left with one block (or none) becomes the inline form
    /// again: a large root always has two blocks or more.
    fn collapse_if_single(&mut self) {
        let Some(RootRef::Large(large)) = self.root() else {
            return;
        };
        if large.refs().len() > 1 {
            return;
        }
        let Some(Root::Large(large)) = self.take_root() else {
            unreachable!("the root is large")
        };
        let block = if large.refs().is_empty() {
            drop(large);
            Block::alloc(0)
        } else {
            // The newest block of a large window was allocated at its full
            // size (`newest_of_large`): an inline window takes no more than
            // it needs.
            let mut block = large.into_single();
            block.shrink_if_oversized();
            block
        };
        self.set_root(Root::Inline(block));
    }

    /// Decodes block `at` (of the inline form: 0), lets `change` edit its
    /// runs, and puts the blocks they make in its place: a step back, a count
    /// that no longer fits, a refund whose merged gap does not fit. O(BLOCK_RUNS).
    fn rewrite_block(&mut self, at: usize, change: impl FnOnce(&mut Vec<(i64, u64)>)) {
        match self.root_mut() {
            None => {
                let mut runs = Vec::new();
                change(&mut runs);
                self.adopt(build_blocks(runs, true));
            }
            Some(RootMut::Inline(block)) => {
                let mut runs: Vec<(i64, u64)> = block.runs().collect();
                change(&mut runs);
                if runs.is_empty() {
                    // The allocation stays the (empty) root.
                    block.clear();
                    block.shrink_if_oversized();
                    return;
                }
                let blocks = build_blocks(runs, true);
                drop(self.take_root());
                self.adopt(blocks);
            }
            Some(RootMut::Large(large)) => {
                let mut runs: Vec<(i64, u64)> = large.refs()[at].block.runs().collect();
                change(&mut runs);
                drop(large.splice(at, build_blocks(runs, false)));
                self.collapse_if_single();
            }
        }
    }

    /// An entry older than the newest: into the block it belongs to.
    fn insert_older(&mut self, stamp_ms: i64, cost: u64) {
        let at = match self.root() {
            Some(RootRef::Large(large)) => large.find(stamp_ms),
            _ => 0,
        };
        self.rewrite_block(at, |runs| {
            match runs.binary_search_by_key(&stamp_ms, |&(stamp, _)| stamp) {
                Ok(i) => runs[i].1 += cost,
                Err(i) => runs.insert(i, (stamp_ms, cost)),
            }
        });
    }

    /// Removes up to `count` entries stamped exactly `stamp_ms`; returns how
    /// many went. O(1) for the newest stamp; else one block.
    pub fn remove_at(&mut self, stamp_ms: i64, count: u64) -> u64 {
        if count == 0 {
            return 0;
        }
        match self.root_mut() {
            None => 0,
            Some(RootMut::Inline(block)) => match block.remove_at(stamp_ms, count) {
                Ok(removed) => removed,
                Err(()) => self.remove_by_rewrite(0, stamp_ms, count),
            },
            Some(RootMut::Large(large)) => {
                let at = large.find(stamp_ms);
                let r = &mut large.refs_mut()[at];
                let Ok(removed) = r.block.remove_at(stamp_ms, count) else {
                    return self.remove_by_rewrite(at, stamp_ms, count);
                };
                if removed == 0 {
                    return 0;
                }
                if r.block.live_runs() == 0 {
                    // `splice` counts the block's entries out; dropped, it is freed.
                    drop(large.splice(at, Vec::new()));
                    self.collapse_if_single();
                } else {
                    r.refresh();
                    large.set_entries(large.entries() - removed);
                }
                removed
            }
        }
    }

    /// `trim` for every case.
    #[inline(never)]
    fn trim_slow(&mut self, cutoff_ms: i64) -> u64 {
        match self.root_mut() {
            None => 0,
            Some(RootMut::Inline(block)) => block.trim(cutoff_ms, true),
            Some(RootMut::Large(large)) => {
                let removed = large.trim(cutoff_ms);
                self.collapse_if_single();
                removed
            }
        }
    }

    fn remove_by_rewrite(&mut self, at: usize, stamp_ms: i64, count: u64) -> u64 {
        let mut removed = 0;
        self.rewrite_block(at, |runs| {
            if let Ok(i) = runs.binary_search_by_key(&stamp_ms, |&(stamp, _)| stamp) {
                removed = runs[i].1.min(count);
                runs[i].1 -= removed;
                if runs[i].1 == 0 {
                    runs.remove(i);
                }
            }
        });
        removed
    }

    // -- Version 2: groups of runs, each written as a block.

    /// The canonical bytes of this window in encoding version 2.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut group: Vec<(i64, u64)> = Vec::with_capacity(BLOCK_RUNS as usize);
        let mut runs = self.runs().peekable();
        while let Some(first) = runs.next() {
            group.clear();
            group.push(first);
            while group.len() < BLOCK_RUNS as usize {
                match runs.peek() {
                    Some(&(stamp, _)) if (stamp - first.0) as u64 <= MAX_SPAN => group.push(runs.next().unwrap()),
                    _ => break,
                }
            }
            put_group(out, &group);
        }
    }

    /// The window whose version 2 canonical bytes these are, or why they are none.
    pub fn decode(bytes: &[u8]) -> Result<RunLog, DecodeError> {
        let mut runs: Vec<(i64, u64)> = Vec::new();
        let mut total: u64 = 0;
        let mut pos = 0;
        while pos < bytes.len() {
            let header_bytes = bytes.get(pos..pos + HEADER_BYTES).ok_or(DecodeError::Truncated)?;
            let header = Header::read(header_bytes);
            if header.tag != 0
                || header.class != 0
                || header.dead != 0
                || header.runs == 0
                || header.runs > BLOCK_RUNS
                || header.dw > SPAN_BITS
                || header.cw > ENTRIES_BITS
            {
                return Err(DecodeError::BadGroup);
            }
            let slots = header.layout();
            let end = pos + slots.bytes(header.runs);
            let data = bytes.get(pos..end).ok_or(DecodeError::Truncated)?;
            if header.last_ms() > MAX_EXACT_MS {
                return Err(DecodeError::StampRange);
            }
            if runs.last().is_some_and(|&(last, _)| last >= header.first_ms) {
                return Err(DecodeError::Unsorted);
            }
            let mut entries = 0u64;
            let mut last_ms = header.first_ms;
            for (stamp_ms, count) in BlockRuns::new(&header, data) {
                if stamp_ms > header.last_ms() {
                    return Err(DecodeError::BadGroup);
                }
                entries += count;
                total = total
                    .checked_add(count)
                    .filter(|&t| t <= MAX_ENTRIES)
                    .ok_or(DecodeError::TooMany)?;
                runs.push((stamp_ms, count));
                last_ms = stamp_ms;
            }
            if last_ms != header.last_ms() || (header.cw > 0 && get_bits(data, DATA_BITS, ENTRIES_BITS) != entries) {
                return Err(DecodeError::BadGroup);
            }
            pos = end;
        }
        if runs.is_empty() {
            return Err(DecodeError::Empty);
        }
        let log = RunLog::from_runs(runs);
        let mut canonical = Vec::with_capacity(bytes.len());
        log.encode(&mut canonical);
        if canonical != bytes {
            return Err(DecodeError::NotCanonical);
        }
        Ok(log)
    }

    // -- Version 1: varint runs.

    /// The window's runs in encoding version 1 (what `XCLOAK.APPLY key L`,
    /// the AOF rewrite and DEBUG DIGEST carry).
    pub fn encode_runs(&self, out: &mut Vec<u8>) {
        let mut previous_ms = 0;
        for (stamp_ms, count) in self.runs() {
            put_run(out, (stamp_ms - previous_ms) as u64, count);
            previous_ms = stamp_ms;
        }
    }

    /// The window whose version 1 bytes these are, or why they are none.
    pub fn decode_runs(bytes: &[u8]) -> Result<RunLog, DecodeError> {
        let mut pos = 0;
        let mut stamp_ms: i64 = 0;
        let mut total: u64 = 0;
        let mut runs: Vec<(i64, u64)> = Vec::new();
        while pos < bytes.len() {
            let start = pos;
            let (delta, count) = read_run(bytes, &mut pos)?;
            if start > 0 && delta == 0 {
                return Err(DecodeError::Unsorted);
            }
            stamp_ms = i64::try_from(delta)
                .ok()
                .and_then(|delta| stamp_ms.checked_add(delta))
                .filter(|&stamp| stamp <= MAX_EXACT_MS)
                .ok_or(DecodeError::StampRange)?;
            total = total
                .checked_add(count)
                .filter(|&t| t <= MAX_ENTRIES)
                .ok_or(DecodeError::TooMany)?;
            runs.push((stamp_ms, count));
        }
        if total == 0 {
            return Err(DecodeError::Empty);
        }
        Ok(RunLog::from_runs(runs))
    }
}

/// Writes one group (at most BLOCK_RUNS runs, span <= MAX_SPAN) as a block
/// with the smallest widths: the canonical layout of version 2.
fn put_group(out: &mut Vec<u8>, group: &[(i64, u64)]) {
    let first_ms = group[0].0;
    let mut slots = Slots { dw: 0, cw: 0 };
    let mut entries = 0;
    for (i, &(stamp, count)) in group.iter().enumerate() {
        if i > 0 {
            slots.dw = slots.dw.max(width_of((stamp - group[i - 1].0) as u64 - 1));
        }
        slots.cw = slots.cw.max(width_of(count - 1));
        entries += count;
    }
    let runs = group.len() as u32;
    let header = Header {
        first_ms,
        dw: slots.dw,
        cw: slots.cw,
        tag: 0,
        class: 0,
        runs,
        dead: 0,
        span: (group[runs as usize - 1].0 - first_ms) as u64,
    };
    let start = out.len();
    out.resize(start + slots.bytes(runs), 0);
    header.write(&mut out[start..start + HEADER_BYTES]);
    let data = &mut out[start..];
    if slots.cw > 0 {
        set_bits(data, DATA_BITS, ENTRIES_BITS, entries);
    }
    for (i, &(stamp, count)) in group.iter().enumerate() {
        if i > 0 {
            set_bits(
                data,
                slots.gap_pos(i as u32),
                slots.dw,
                (stamp - group[i - 1].0) as u64 - 1,
            );
        }
        set_bits(data, slots.count_pos(i as u32), slots.cw, count - 1);
    }
}

impl Log for RunLog {
    fn len(&self) -> u64 {
        match self.root() {
            None => 0,
            Some(RootRef::Inline(block)) => block.entries(),
            Some(RootRef::Large(large)) => large.entries(),
        }
    }

    fn count_expired(&self, cutoff_ms: i64) -> u64 {
        match self.root() {
            None => 0,
            Some(RootRef::Inline(block)) => block.count_le(cutoff_ms),
            Some(RootRef::Large(large)) => {
                let refs = large.refs();
                if refs[0].first_ms > cutoff_ms {
                    return 0;
                }
                let at = large.find(cutoff_ms);
                let within = refs[at].block.count_le(cutoff_ms);
                // Whole blocks before `at`, counted from the nearer end.
                if at <= refs.len() / 2 {
                    refs[..at].iter().map(|r| u64::from(r.entries)).sum::<u64>() + within
                } else {
                    large.entries()
                        - refs[at + 1..].iter().map(|r| u64::from(r.entries)).sum::<u64>()
                        - u64::from(refs[at].entries)
                        + within
                }
            }
        }
    }

    fn trim(&mut self, cutoff_ms: i64) -> u64 {
        // The common cases: nothing expired, or the oldest block trimmed in place.
        match self.root_mut() {
            None => return 0,
            Some(RootMut::Inline(block)) => {
                if let Some(removed) = block.trim_in_place(cutoff_ms) {
                    return removed;
                }
            }
            Some(RootMut::Large(large)) => {
                let refs = large.refs_mut();
                if refs[0].first_ms > cutoff_ms {
                    return 0;
                }
                if refs[1].first_ms > cutoff_ms {
                    let r = &mut refs[0];
                    if let Some(trimmed) = r.block.trim_in_place(cutoff_ms) {
                        r.first_ms = r.block.first_ms();
                        r.entries -= trimmed as u32;
                        large.set_entries(large.entries() - trimmed);
                        return trimmed;
                    }
                }
            }
        }
        self.trim_slow(cutoff_ms)
    }

    fn nth_live(&self, cutoff_ms: i64, n: u64) -> Option<i64> {
        if n == 0 {
            return None;
        }
        match self.root() {
            None => None,
            Some(RootRef::Inline(block)) => {
                let target = block.count_le(cutoff_ms) + n;
                (target <= block.entries()).then(|| block.nth(target)).flatten()
            }
            Some(RootRef::Large(large)) => {
                let refs = large.refs();
                let at = if refs[0].first_ms > cutoff_ms {
                    0
                } else {
                    large.find(cutoff_ms)
                };
                let mut target = refs[at].block.count_le(cutoff_ms) + n;
                for r in &refs[at..] {
                    let entries = u64::from(r.entries);
                    if target <= entries {
                        return r.block.nth(target);
                    }
                    target -= entries;
                }
                None
            }
        }
    }

    fn newest(&self) -> Option<i64> {
        match self.root() {
            _ if self.is_empty() => None,
            None => None,
            Some(RootRef::Inline(block)) => Some(block.last_ms()),
            Some(RootRef::Large(large)) => large.refs().last().map(|r| r.block.last_ms()),
        }
    }

    fn remove_at(&mut self, stamp_ms: i64, count: u64) -> u64 {
        RunLog::remove_at(self, stamp_ms, count)
    }

    fn record(&mut self, now_ms: i64, cost: u64) {
        if cost == 0 {
            return;
        }
        // The common case: appended where the newest run is, in place.
        let done = match self.root_mut() {
            Some(RootMut::Inline(block)) => block.try_append_in_place(now_ms, cost, INLINE),
            Some(RootMut::Large(large)) => large.try_append_in_place(now_ms, cost),
            None => false,
        };
        if !done {
            self.record_slow(now_ms, cost);
        }
    }
}

impl RunLog {
    /// `record` for every case.
    #[inline(never)]
    fn record_slow(&mut self, now_ms: i64, cost: u64) {
        match self.root_mut() {
            None => self.set_root(Root::Inline(Block::with_run(now_ms, cost))),
            Some(RootMut::Inline(block)) => {
                let header = block.header();
                if header.runs == 0 {
                    block.reset_to(now_ms, cost);
                } else if now_ms > header.last_ms() {
                    if !block.try_append(now_ms, cost, INLINE) {
                        let Some(Root::Inline(block)) = self.take_root() else {
                            unreachable!("the root is inline")
                        };
                        let blocks = [block, Block::newest_of_large(now_ms, cost)];
                        self.set_root(Root::Large(Large::new(blocks.into_iter())));
                    }
                } else if now_ms == header.last_ms() {
                    if !block.try_add_to_last(cost) {
                        self.insert_older(now_ms, cost);
                    }
                } else {
                    self.insert_older(now_ms, cost);
                }
            }
            Some(RootMut::Large(large)) => {
                let Some(r) = large.refs_mut().last_mut() else {
                    unreachable!("a large root holds blocks")
                };
                let last_ms = r.block.last_ms();
                let done = (now_ms > last_ms && r.block.try_append(now_ms, cost, INDEXED))
                    || (now_ms == last_ms && r.block.try_add_to_last(cost));
                if done {
                    r.entries += cost as u32;
                    large.set_entries(large.entries() + cost);
                } else if now_ms > last_ms {
                    r.refresh();
                    large.push(Block::newest_of_large(now_ms, cost));
                    large.set_entries(large.entries() + cost);
                } else {
                    self.insert_older(now_ms, cost);
                }
            }
        }
    }
}

/// Iterator over a log's runs, oldest first.
pub struct Runs<'a> {
    blocks: &'a [BlockRef],
    single: Option<&'a Block>,
    current: Option<BlockRuns<'a>>,
}

impl<'a> Iterator for Runs<'a> {
    type Item = (i64, u64);

    fn next(&mut self) -> Option<(i64, u64)> {
        loop {
            if let Some(run) = self.current.as_mut().and_then(Iterator::next) {
                return Some(run);
            }
            let block: &'a Block = match self.single.take() {
                Some(block) => block,
                None => {
                    let (first, rest) = self.blocks.split_first()?;
                    self.blocks = rest;
                    &first.block
                }
            };
            self.current = Some(BlockRuns::new(&block.header(), block.bytes()));
        }
    }
}

// ---------------------------------------------------------------------------
// Version 1's varints.

fn put_run(out: &mut Vec<u8>, delta: u64, count: u64) {
    put_varint(out, delta << 1 | u64::from(count > 1));
    if count > 1 {
        put_varint(out, count);
    }
}

fn read_run(bytes: &[u8], pos: &mut usize) -> Result<(u64, u64), DecodeError> {
    let head = read_varint(bytes, pos)?;
    let count = if head & 1 == 1 {
        let count = read_varint(bytes, pos)?;
        if count < 2 {
            return Err(DecodeError::BadCount);
        }
        count
    } else {
        1
    };
    Ok((head >> 1, count))
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A minimal LEB128 varint of at most 64 bits.
fn read_varint(bytes: &[u8], pos: &mut usize) -> Result<u64, DecodeError> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *bytes.get(*pos).ok_or(DecodeError::Truncated)?;
        *pos += 1;
        if shift == 63 && byte > 1 {
            return Err(DecodeError::BadVarint);
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            if byte == 0 && shift > 0 {
                return Err(DecodeError::BadVarint);
            }
            return Ok(value);
        }
        shift += 7;
        if shift > 63 {
            return Err(DecodeError::BadVarint);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::tests::VecLog;

    fn stamps(log: &RunLog) -> Vec<i64> {
        log.runs()
            .flat_map(|(stamp, count)| std::iter::repeat_n(stamp, count as usize))
            .collect()
    }

    fn canonical(log: &RunLog) -> Vec<u8> {
        let mut out = Vec::new();
        log.encode(&mut out);
        out
    }

    fn runs_bytes(log: &RunLog) -> Vec<u8> {
        let mut out = Vec::new();
        log.encode_runs(&mut out);
        out
    }

    /// Bytes the log's allocations take.
    fn allocated(log: &RunLog) -> usize {
        let mut total = 0;
        log.allocations(|_, size| total += size);
        total
    }

    fn block_pointers(log: &RunLog) -> Vec<*const u8> {
        let mut out = Vec::new();
        log.allocations(|ptr, _| out.push(ptr));
        out
    }

    /// A small deterministic generator (no dependency): xorshift64*.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    const T: i64 = 1_732_941_234_567;

    #[test]
    fn a_window_of_ten_requests_six_seconds_apart_is_one_32_byte_allocation() {
        let evenly = |limit: i64| {
            let mut log = RunLog::default();
            for j in 0..limit {
                log.record(T + j * 60_000 / limit, 1);
            }
            assert_eq!(log.len(), limit as u64);
            log
        };
        // 16 bytes of header, 9 gaps of 13 bits (5999 < 2^13).
        let ten = evenly(10);
        assert_eq!((ten.form(), allocated(&ten)), (Form::Inline, 32));
        // 99 gaps of 10 bits: 124 bytes + 16, the 160-byte class.
        let hundred = evenly(100);
        assert_eq!((hundred.form(), allocated(&hundred)), (Form::Inline, 160));
        // 999 gaps of 6 bits: 750 bytes + 16, the 768-byte class.
        let thousand = evenly(1000);
        assert_eq!((thousand.form(), allocated(&thousand)), (Form::Inline, 768));
        // Lone requests 1 ms apart take no bits at all: 1,024 of them in 16 bytes.
        let mut dense = RunLog::default();
        for i in 0..1024 {
            dense.record(T + i, 1);
        }
        assert_eq!((dense.form(), allocated(&dense)), (Form::Inline, 16));
        assert_eq!(std::mem::size_of::<RunLog>(), 8);
        assert_eq!(std::mem::size_of::<BlockRef>(), 24);
    }

    #[test]
    fn header_fields_round_trip_at_their_limits() {
        let header = Header {
            first_ms: MAX_EXACT_MS,
            dw: SPAN_BITS,
            cw: ENTRIES_BITS,
            tag: TAG_LARGE,
            class: 19,
            runs: BLOCK_RUNS,
            dead: MAX_DEAD,
            span: MAX_SPAN,
        };
        let mut bytes = [0u8; 16];
        header.write(&mut bytes);
        assert_eq!(Header::read(&bytes), header);
        let zero = Header::default();
        zero.write(&mut bytes);
        assert_eq!(bytes, [0; 16]);
    }

    #[test]
    fn bits_read_and_write_anywhere_and_shift_down() {
        let mut data = vec![0u8; 40];
        let mut rng = Rng(7);
        let mut fields = Vec::new();
        let mut pos = 0;
        while pos < 300 {
            let width = 1 + rng.below(46) as u32;
            let value = rng.next() & mask(width);
            set_bits(&mut data, pos, width, value);
            fields.push((pos, width, value));
            pos += width as usize;
        }
        for &(pos, width, value) in &fields {
            assert_eq!(get_bits(&data, pos, width), value, "at {pos}");
        }
        // The last bytes are read and written without reading past the end.
        set_bits(&mut data, 40 * 8 - 5, 5, 0b10110);
        assert_eq!(get_bits(&data, 40 * 8 - 5, 5), 0b10110);
        // Shifting removes exactly the bits in between.
        for cut in [1usize, 7, 8, 9, 63, 64, 65, 130] {
            let mut copy = data.clone();
            let end = 310;
            shift_bits_down(&mut copy, 13 + cut, 13, end);
            for i in 0..13 {
                assert_eq!(get_bits(&copy, i, 1), get_bits(&data, i, 1));
            }
            for i in 13..end - cut {
                assert_eq!(get_bits(&copy, i, 1), get_bits(&data, i + cut, 1), "cut {cut} bit {i}");
            }
        }
    }

    #[test]
    fn runs_group_equal_stamps_and_count_bits_only_when_several() {
        let mut log = RunLog::default();
        log.record(100, 1);
        log.record(100, 2);
        log.record(105, 1);
        log.record(300, 4);
        assert_eq!(log.runs().collect::<Vec<_>>(), [(100, 3), (105, 1), (300, 4)]);
        assert_eq!(log.len(), 8);
        // Version 1: 100<<1|1, 3 | 5<<1 | 195<<1|1 (two bytes), 4
        assert_eq!(runs_bytes(&log), [201, 1, 3, 10, 135, 3, 4]);
        let mut lone = RunLog::default();
        for stamp in [10, 20, 25] {
            lone.record(stamp, 1);
        }
        // Version 2, one group: first 10, dw = bits(9) = 4, cw = 0, runs 3,
        // span 15; slots: gaps - 1 = 9, 4.
        let bytes = canonical(&lone);
        assert_eq!(bytes.len(), 16 + 1);
        assert_eq!(
            Header::read(&bytes),
            Header {
                first_ms: 10,
                dw: 4,
                cw: 0,
                tag: 0,
                class: 0,
                runs: 3,
                dead: 0,
                span: 15
            }
        );
        assert_eq!(bytes[16], 9 | 4 << 4);
    }

    #[test]
    fn canonical_bytes_round_trip_and_do_not_depend_on_history() {
        let mut a = RunLog::default();
        for stamp in [10, 20, 20, 30, 45, 46, 47, 47, 47] {
            a.record(stamp, 1);
        }
        a.trim(20); // leaves 30, 45, 46, 47 x3
        a.remove_at(46, 1);
        a.record(46, 1); // a step back
        let mut b = RunLog::default();
        for (stamp, count) in [(30, 1), (45, 1), (46, 1), (47, 3)] {
            b.record(stamp, count);
        }
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(runs_bytes(&a), runs_bytes(&b));
        for decoded in [
            RunLog::decode(&canonical(&a)).unwrap(),
            RunLog::decode_runs(&runs_bytes(&a)).unwrap(),
        ] {
            assert_eq!(stamps(&decoded), [30, 45, 46, 47, 47, 47]);
            assert_eq!(canonical(&decoded), canonical(&a));
            assert_eq!(decoded.len(), 6);
        }
        // A window of many blocks, built two ways.
        let mut grown = RunLog::default();
        let mut rng = Rng(11);
        let mut stamp = T;
        let mut runs = Vec::new();
        for _ in 0..5000 {
            stamp += 1 + rng.below(3000) as i64;
            let count = if rng.below(10) == 0 { 2 + rng.below(5) } else { 1 };
            grown.record(stamp, count);
            runs.push((stamp, count));
        }
        grown.trim(runs[1999].0);
        for &(stamp, count) in runs[2000..].iter().step_by(7) {
            grown.remove_at(stamp, count);
        }
        let kept: Vec<(i64, u64)> = runs[2000..]
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 7 != 0)
            .map(|(_, &r)| r)
            .collect();
        let fresh = RunLog::from_runs(kept.iter().copied());
        assert!(matches!(grown.form(), Form::Large(_)));
        assert_eq!(grown.runs().collect::<Vec<_>>(), kept);
        assert_eq!(canonical(&grown), canonical(&fresh));
        assert_eq!(
            RunLog::decode(&canonical(&grown)).unwrap().runs().collect::<Vec<_>>(),
            kept
        );
    }

    #[test]
    fn decode_runs_refuses_every_non_canonical_form() {
        let cases: [(&[u8], DecodeError); 10] = [
            (&[], DecodeError::Empty),
            (&[0x80], DecodeError::Truncated),
            (&[3], DecodeError::Truncated),   // multi without its count
            (&[3, 1], DecodeError::BadCount), // "several" = 1
            (&[3, 0], DecodeError::BadCount),
            (&[2, 0], DecodeError::Unsorted),        // second run, delta 0
            (&[0x82, 0x00], DecodeError::BadVarint), // overlong 2
            (
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
                DecodeError::BadVarint,
            ),
            (
                &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40],
                DecodeError::StampRange,
            ), // 2^55 >> 1
            (&[1, 0xff, 0xff, 0xff, 0xff, 0x0f], DecodeError::TooMany), // 2^32-1 entries
        ];
        for (bytes, expected) in cases {
            assert_eq!(RunLog::decode_runs(bytes).unwrap_err(), expected, "{bytes:?}");
        }
        let mut log = RunLog::default();
        log.record(MAX_EXACT_MS, MAX_ENTRIES);
        assert_eq!(
            RunLog::decode_runs(&runs_bytes(&log))
                .unwrap()
                .runs()
                .collect::<Vec<_>>(),
            [(MAX_EXACT_MS, MAX_ENTRIES)]
        );
        let mut over = Vec::new();
        put_run(&mut over, MAX_EXACT_MS as u64 + 1, 1);
        assert_eq!(RunLog::decode_runs(&over).unwrap_err(), DecodeError::StampRange);
        let mut over = Vec::new();
        put_run(&mut over, 5, MAX_ENTRIES + 1);
        assert_eq!(RunLog::decode_runs(&over).unwrap_err(), DecodeError::TooMany);
        let mut trailing = runs_bytes(&log);
        trailing.push(0x80);
        assert_eq!(RunLog::decode_runs(&trailing).unwrap_err(), DecodeError::Truncated);
    }

    /// A version 2 group with the given header fields and slot bits, written by hand.
    fn group(header: Header, data: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; 16];
        header.write(&mut out);
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn decode_refuses_every_non_canonical_form() {
        let h = Header {
            first_ms: 10,
            dw: 4,
            cw: 0,
            tag: 0,
            class: 0,
            runs: 3,
            dead: 0,
            span: 15,
        };
        let good = group(h, &[9 | 4 << 4]);
        assert_eq!(
            RunLog::decode(&good).unwrap().runs().collect::<Vec<_>>(),
            [(10, 1), (20, 1), (25, 1)]
        );
        let cases: Vec<(&str, Vec<u8>, DecodeError)> = vec![
            ("empty", vec![], DecodeError::Empty),
            ("a header cut short", good[..15].to_vec(), DecodeError::Truncated),
            ("slots cut short", good[..16].to_vec(), DecodeError::Truncated),
            ("a trailing byte", [&good[..], &[0]].concat(), DecodeError::Truncated),
            ("tag 1", group(Header { tag: 1, ..h }, &[0x49]), DecodeError::BadGroup),
            (
                "size class 3",
                group(Header { class: 3, ..h }, &[0x49]),
                DecodeError::BadGroup,
            ),
            (
                "no runs",
                group(
                    Header {
                        runs: 0,
                        span: 0,
                        dw: 0,
                        ..h
                    },
                    &[],
                ),
                DecodeError::BadGroup,
            ),
            (
                "1,025 runs",
                group(
                    Header {
                        runs: 1025,
                        dw: 0,
                        span: 1024,
                        ..h
                    },
                    &[],
                ),
                DecodeError::BadGroup,
            ),
            ("dw 41", group(Header { dw: 41, ..h }, &[0; 12]), DecodeError::BadGroup),
            (
                "dead slots",
                group(Header { dead: 1, ..h }, &[0x49]),
                DecodeError::BadGroup,
            ),
            (
                "cw 31",
                group(
                    Header {
                        cw: 31,
                        dw: 0,
                        runs: 1,
                        span: 0,
                        ..h
                    },
                    &[0; 8],
                ),
                DecodeError::BadGroup,
            ),
            (
                "a span the gaps do not reach",
                group(Header { span: 16, ..h }, &[0x49]),
                DecodeError::BadGroup,
            ),
            (
                "a gap past the span",
                group(Header { span: 14, ..h }, &[0x49]),
                DecodeError::BadGroup,
            ),
            (
                "a wider gap than needed",
                group(Header { dw: 5, ..h }, &[9 | 4 << 5, 0]),
                DecodeError::NotCanonical,
            ),
            (
                "count bits that are all zero",
                {
                    // cw 1 where 0 would do: entries (30 bits) 3, counts - 1 all 0.
                    let wide = Header { cw: 1, ..h };
                    let slots = wide.layout();
                    let mut bytes = vec![0u8; slots.bytes(3)];
                    wide.write(&mut bytes[..16]);
                    set_bits(&mut bytes, DATA_BITS, ENTRIES_BITS, 3);
                    set_bits(&mut bytes, slots.gap_pos(1), 4, 9);
                    set_bits(&mut bytes, slots.gap_pos(2), 4, 4);
                    bytes
                },
                DecodeError::NotCanonical,
            ),
            (
                "padding bits set",
                group(Header { runs: 2, span: 10, ..h }, &[9 | 1 << 7]),
                DecodeError::NotCanonical,
            ),
            (
                "stamp 2^53",
                group(
                    Header {
                        first_ms: MAX_EXACT_MS,
                        runs: 2,
                        span: 1,
                        dw: 0,
                        ..h
                    },
                    &[],
                ),
                DecodeError::StampRange,
            ),
            (
                "groups out of order",
                [
                    &good[..],
                    &group(
                        Header {
                            first_ms: 25,
                            runs: 1,
                            span: 0,
                            dw: 0,
                            ..h
                        },
                        &[],
                    )[..],
                ]
                .concat(),
                DecodeError::Unsorted,
            ),
            (
                "a group split early",
                [
                    &group(
                        Header {
                            runs: 1,
                            span: 0,
                            dw: 0,
                            ..h
                        },
                        &[],
                    )[..],
                    &group(
                        Header {
                            first_ms: 20,
                            runs: 1,
                            span: 0,
                            dw: 0,
                            ..h
                        },
                        &[],
                    )[..],
                ]
                .concat(),
                DecodeError::NotCanonical,
            ),
            (
                "an entry count that lies",
                group(
                    Header {
                        cw: 1,
                        runs: 1,
                        span: 0,
                        dw: 0,
                        ..h
                    },
                    &[3, 0, 0, 0, 1],
                ),
                DecodeError::BadGroup,
            ),
            (
                "1e9 + 1 entries",
                {
                    let mut log = RunLog::default();
                    log.record(5, MAX_ENTRIES);
                    let mut bytes = canonical(&log);
                    bytes.extend(group(
                        Header {
                            first_ms: 6,
                            runs: 1,
                            span: 0,
                            dw: 0,
                            cw: 0,
                            tag: 0,
                            class: 0,
                            dead: 0,
                        },
                        &[],
                    ));
                    bytes
                },
                DecodeError::TooMany,
            ),
        ];
        for (case, bytes, expected) in cases {
            assert_eq!(
                RunLog::decode(&bytes).map(|l| l.len()),
                Err(expected),
                "{case}: {bytes:?}"
            );
        }
        // The largest stamp and count, and 1,025 runs (two groups), are accepted.
        let mut log = RunLog::default();
        log.record(MAX_EXACT_MS, MAX_ENTRIES);
        assert_eq!(
            RunLog::decode(&canonical(&log)).unwrap().runs().collect::<Vec<_>>(),
            [(MAX_EXACT_MS, MAX_ENTRIES)]
        );
        let many = RunLog::from_runs((0..1025).map(|i| (T + 3 * i, 1)));
        let bytes = canonical(&many);
        assert_eq!(Header::read(&bytes).runs, 1024);
        assert_eq!(RunLog::decode(&bytes).unwrap().len(), 1025);
        // A span of 2^40 ms or more starts a new group.
        let far = RunLog::from_runs([(0, 1), (MAX_SPAN as i64, 1), (MAX_SPAN as i64 + 1, 1)]);
        let bytes = canonical(&far);
        assert_eq!(Header::read(&bytes).runs, 2);
        assert_eq!(RunLog::decode(&bytes).unwrap().runs().count(), 3);
    }

    #[test]
    fn trim_frees_expired_blocks_and_reads_nothing_when_nothing_expired() {
        let mut log = RunLog::default();
        for i in 0..10_000 {
            log.record(T + i * 1000, 1);
        }
        let Form::Large(blocks) = log.form() else {
            panic!("{:?}", log.form())
        };
        assert!(blocks > 10, "{blocks} blocks");
        let before = block_pointers(&log);
        assert_eq!(log.trim(T - 1), 0);
        assert_eq!(
            block_pointers(&log),
            before,
            "a trim with nothing expired changes nothing"
        );
        assert_eq!(log.trim(T + 4_999_000), 5000);
        assert_eq!(log.len(), 5000);
        assert_eq!(log.runs().next(), Some((T + 5_000_000, 1)));
        let Form::Large(left) = log.form() else { panic!() };
        // The first block (the inline one that overflowed) held 807 entries,
        // the others about 190: some 23 blocks are gone.
        assert!(left <= blocks - 22, "{left} of {blocks} blocks left");
        assert_eq!(log.trim(T + 9_998_000), 4999);
        assert_eq!(log.form(), Form::Inline, "one block left: inline again");
        assert_eq!(log.trim(T + 10_000_000), 1);
        assert!(log.is_empty());
        assert_eq!(log.runs().count(), 0);
        assert_eq!(log.newest(), None);
    }

    /// A trim marks slots dead and shifts nothing until 127 are dead or the
    /// block needs their room; a window in a steady state (trim one, add
    /// one) keeps its allocation.
    #[test]
    fn trims_shift_bits_out_once_per_127_runs_and_the_room_is_reused() {
        let mut log = RunLog::default();
        for i in 0..600 {
            log.record(T + i * 1000, 1);
        }
        let Some(RootRef::Inline(block)) = log.root() else {
            panic!()
        };
        let (size, before) = (block.size(), block.0);
        for i in 0..127 {
            assert_eq!(log.trim(T + i * 1000), 1);
            let Some(RootRef::Inline(block)) = log.root() else {
                panic!()
            };
            assert_eq!(block.header().dead, i as u32 + 1);
            assert_eq!(block.0, before, "a trim moves nothing");
        }
        assert_eq!(log.trim(T + 127 * 1000), 1);
        let Some(RootRef::Inline(block)) = log.root() else {
            panic!()
        };
        assert_eq!(
            (block.header().dead, block.header().runs),
            (0, 600 - 128),
            "shifted out at 128"
        );
        assert_eq!(log.runs().next(), Some((T + 128 * 1000, 1)));
        // Steady state: one trimmed, one added, 10,000 times: no growth.
        for i in 600..10_600 {
            log.record(T + i * 1000, 1);
            assert_eq!(log.trim(T + (i - 600 + 128) * 1000), 1);
            assert_eq!(log.len(), 600 - 128);
        }
        let Some(RootRef::Inline(block)) = log.root() else {
            panic!()
        };
        assert!(block.size() <= size, "{} B, {size} B before", block.size());
        assert_eq!(
            canonical(&log),
            canonical(&RunLog::from_runs(log.runs().collect::<Vec<_>>()))
        );
    }

    /// Every index entry agrees with its block, and the root's count with
    /// the index; every block has a live run, and its size class holds it.
    fn assert_consistent(log: &RunLog) {
        let check = |block: &Block| {
            let header = block.header();
            assert!(header.dead <= MAX_DEAD && header.dead <= header.runs, "{header:?}");
            assert!(header.layout().bytes(header.runs) <= block.size(), "{header:?}");
            let runs: Vec<(i64, u64)> = block.runs().collect();
            assert_eq!(runs.len() as u32, header.live());
            if let (Some(first), Some(last)) = (runs.first(), runs.last()) {
                assert_eq!((first.0, last.0), (header.first_ms, header.last_ms()));
            }
            assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), block.entries());
        };
        match log.root() {
            None => {}
            Some(RootRef::Inline(block)) => check(block),
            Some(RootRef::Large(large)) => {
                assert!(large.refs().len() >= 2);
                for r in large.refs() {
                    check(&r.block);
                    assert!(r.block.live_runs() > 0);
                    assert_eq!(
                        (r.first_ms, u64::from(r.entries)),
                        (r.block.first_ms(), r.block.entries())
                    );
                }
                assert_eq!(
                    large.entries(),
                    large.refs().iter().map(|r| u64::from(r.entries)).sum::<u64>()
                );
            }
        }
    }

    /// What `XCLOAK.ALLOW` does to a window at its limit, call after call:
    /// one run trimmed, one added (in place, the hot path), at sizes around
    /// every boundary (a class, MAX_DEAD, the inline capacity, a block of a
    /// large window), with lone entries and with runs of several; the log
    /// stays exactly the reference's and consistent throughout.
    #[test]
    fn a_window_at_its_limit_trims_one_and_adds_one() {
        for size in [1i64, 2, 10, 12, 127, 128, 129, 300, 1023, 1024, 1025, 3000] {
            for (step_ms, cost) in [(1000, 1), (1, 1), (7, 3), (70_000, 1)] {
                let mut ours = RunLog::default();
                let mut reference = VecLog::default();
                let window = size * step_ms;
                for i in 0..size + 600 {
                    let now = T + i * step_ms;
                    let cutoff = now - window;
                    assert_eq!(
                        ours.trim(cutoff),
                        reference.trim(cutoff),
                        "size {size} step {step_ms} call {i}"
                    );
                    ours.record(now, cost as u64);
                    reference.record(now, cost as u64);
                    assert_eq!(ours.len(), reference.len());
                    assert_eq!(ours.newest(), reference.newest());
                    if i % 37 == 0 || i >= size + 590 {
                        assert_eq!(stamps(&ours), reference.0, "size {size} step {step_ms} call {i}");
                        assert_consistent(&ours);
                    }
                }
                assert_eq!(
                    canonical(&ours),
                    canonical(&RunLog::from_runs(ours.runs().collect::<Vec<_>>()))
                );
            }
        }
    }

    /// `widen` re-packs every run at wider widths, from every layout to every
    /// wider one, with dead slots to shift out, and keeps the runs and count.
    #[test]
    fn widen_keeps_every_run_at_any_wider_layout() {
        let mut rng = Rng(0x5EED);
        for (dw, cw) in [(0u32, 0u32), (0, 3), (5, 0), (10, 0), (7, 2), (12, 9), (33, 0), (3, 20)] {
            for runs in [1usize, 2, 9, 64, 100] {
                let mut stamp = T;
                let mut list = Vec::new();
                for i in 0..runs {
                    if i > 0 {
                        stamp += 1 + (rng.next() & mask(dw)) as i64;
                    }
                    list.push((stamp, 1 + (rng.next() & mask(cw))));
                }
                let Some(slots) = (0..runs).try_fold(Slots { dw: 0, cw: 0 }, |slots, i| {
                    let gap = if i > 0 { (list[i].0 - list[i - 1].0) as u64 } else { 1 };
                    Some(Slots {
                        dw: slots.dw.max(width_of(gap - 1)),
                        cw: slots.cw.max(width_of(list[i].1 - 1)),
                    })
                }) else {
                    unreachable!()
                };
                if slots.bytes(runs as u32) + 64 > BLOCK_BYTES {
                    continue;
                }
                for (extra_dw, extra_cw) in [(0, 1), (1, 0), (3, 2), (9, 0)] {
                    let (mut block, taken) = Block::pack(&list, INLINE);
                    assert_eq!(taken, runs);
                    let dead = (runs as u32 - 1).min(2);
                    let expired = block.runs().take(dead as usize).map(|r| r.1).sum::<u64>();
                    if dead > 0 {
                        block.drop_front(dead, expired, list[dead as usize].0);
                    }
                    let to = Slots {
                        dw: (slots.dw + extra_dw).min(40),
                        cw: (slots.cw + extra_cw).min(30),
                    };
                    if to.bytes(runs as u32) > BLOCK_BYTES {
                        continue;
                    }
                    block.reserve(to.bytes(runs as u32));
                    block.widen(to);
                    let header = block.header();
                    assert_eq!(
                        (header.dw, header.cw, header.dead),
                        (to.dw, to.cw, 0),
                        "{dw}/{cw} -> {to:?}"
                    );
                    assert_eq!(
                        block.runs().collect::<Vec<_>>(),
                        list[dead as usize..],
                        "{dw}/{cw} -> {to:?}, {runs} runs"
                    );
                    assert_eq!(block.entries(), list[dead as usize..].iter().map(|r| r.1).sum::<u64>());
                }
            }
        }
    }

    #[test]
    fn remove_at_takes_only_that_stamp_and_at_most_count() {
        let mut log = RunLog::default();
        for (stamp, cost) in [(10, 2), (20, 3), (30, 2)] {
            log.record(stamp, cost);
        }
        assert_eq!(log.remove_at(30, 1), 1, "the newest run, in place");
        assert_eq!(log.remove_at(20, 5), 3, "never more than the run holds");
        assert_eq!(log.remove_at(15, 1), 0);
        assert_eq!(log.remove_at(31, 1), 0);
        assert_eq!(log.remove_at(30, 1), 1, "empties the newest run");
        assert_eq!(stamps(&log), [10, 10]);
        assert_eq!(log.newest(), Some(10));
        assert_eq!(log.remove_at(10, 2), 2);
        assert!(log.is_empty());
        // A middle run whose neighbours' gap is wider than the block's width.
        let mut log = RunLog::default();
        for stamp in [0, 1, 2, 3] {
            log.record(stamp, 1);
        }
        assert_eq!(log.remove_at(1, 1), 1);
        assert_eq!(log.remove_at(2, 1), 1);
        assert_eq!(stamps(&log), [0, 3]);
        assert_eq!(canonical(&log), canonical(&RunLog::from_runs([(0, 1), (3, 1)])));
    }

    /// Refunds change one block: the newest in O(1), any other by a binary
    /// search of the index and a rewrite of its block only.
    #[test]
    fn a_refund_changes_one_block_and_the_newest_is_found_from_the_header() {
        let mut log = RunLog::default();
        for i in 0..100_000 {
            log.record(T + i * 1000, 1 + (i % 3 == 0) as u64);
        }
        let before = block_pointers(&log);
        let entries = log.len();
        // The newest: only the last block (and the root, if it moved) may change.
        assert_eq!(log.remove_at(T + 99_999 * 1000, 1), 1);
        let after = block_pointers(&log);
        assert_eq!(after.len(), before.len());
        assert_eq!(after[1..after.len() - 1], before[1..before.len() - 1]);
        // A middle stamp: one block changes.
        assert_eq!(log.remove_at(T + 50_001 * 1000, 1), 1);
        let after = block_pointers(&log);
        let changed = after.iter().zip(&before).skip(1).filter(|(a, b)| a != b).count();
        assert!(changed <= 2, "{changed} blocks moved");
        assert_eq!(log.len(), entries - 2);
        assert_eq!(log.count_expired(T + 50_001 * 1000), 50_002 + 16_668 - 1);
    }

    /// A window at the inline capacity, one below and one above it, under
    /// admissions, trims and refunds: the form moves at exactly the capacity,
    /// both ways, and every answer is the reference's.
    #[test]
    fn the_inline_capacity_boundary() {
        // (gap between lone entries, runs one block holds): 1 ms apart, slots
        // of 0 bits, BLOCK_RUNS runs; 1,000 ms apart, 10 bits, (1008 * 8) / 10 + 1.
        for (gap, capacity) in [(1i64, BLOCK_RUNS as i64), (1000, 807)] {
            for size in [capacity - 1, capacity, capacity + 1] {
                let fill = |log: &mut RunLog, reference: &mut VecLog| {
                    for i in 0..size {
                        log.record(T + i * gap, 1);
                        reference.record(T + i * gap, 1);
                    }
                };
                let inline_at = |n: i64| if n <= capacity { Form::Inline } else { Form::Large(2) };
                let check = |log: &RunLog, reference: &VecLog, what: &str| {
                    assert_eq!(stamps(log), reference.0, "{what}");
                    assert_eq!(log.len(), reference.len(), "{what}");
                    assert_eq!(log.newest(), reference.newest(), "{what}");
                    for cutoff in [T - 1, T, T + gap * size / 2, T + gap * (size - 1)] {
                        assert_eq!(
                            log.count_expired(cutoff),
                            reference.count_expired(cutoff),
                            "{what} {cutoff}"
                        );
                        assert_eq!(
                            log.nth_live(cutoff, 1),
                            reference.nth_live(cutoff, 1),
                            "{what} {cutoff}"
                        );
                    }
                    assert_eq!(
                        RunLog::decode(&canonical(log)).unwrap().runs().collect::<Vec<_>>(),
                        log.runs().collect::<Vec<_>>()
                    );
                };
                let what = format!("gap {gap}, {size} entries (capacity {capacity})");
                // Admissions.
                let (mut log, mut reference) = (RunLog::default(), VecLog::default());
                fill(&mut log, &mut reference);
                assert_eq!(log.form(), inline_at(size), "{what}");
                check(&log, &reference, &what);
                // One more admission, then its refund: across the boundary and back.
                log.record(T + size * gap, 1);
                reference.record(T + size * gap, 1);
                assert_eq!(log.form(), inline_at(size + 1), "{what}, one more");
                check(&log, &reference, &what);
                assert_eq!(log.remove_at(T + size * gap, 1), 1);
                reference.remove_at(T + size * gap, 1);
                assert_eq!(log.form(), inline_at(size), "{what}, refunded");
                check(&log, &reference, &what);
                // A refund of the oldest and one in the middle.
                for stamp in [T, T + gap * (size / 2)] {
                    assert_eq!(log.remove_at(stamp, 1), reference.remove_at(stamp, 1));
                    check(&log, &reference, &format!("{what}, refund of {stamp}"));
                }
                // Trims: the oldest one, then all but the newest.
                let (mut log, mut reference) = (RunLog::default(), VecLog::default());
                fill(&mut log, &mut reference);
                assert_eq!(log.trim(T), reference.trim(T));
                check(&log, &reference, &format!("{what}, trimmed 1"));
                assert_eq!(log.trim(T + gap * (size - 2)), reference.trim(T + gap * (size - 2)));
                assert_eq!(log.form(), Form::Inline, "{what}: one entry left");
                check(&log, &reference, &format!("{what}, trimmed to 1"));
                // A step back into the full window.
                let (mut log, mut reference) = (RunLog::default(), VecLog::default());
                fill(&mut log, &mut reference);
                if gap > 1 {
                    log.record(T + gap / 2, 1);
                    reference.record(T + gap / 2, 1);
                    check(&log, &reference, &format!("{what}, a step back"));
                }
            }
        }
    }

    /// The compact log answers every `Log` question exactly as the sorted
    /// reference does, over random operations, older stamps and refunds
    /// included, in windows from one entry to many blocks; its canonical bytes
    /// (both versions) decode back to the same entries.
    #[test]
    fn behaves_like_the_reference_log() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for round in 0..300 {
            let mut ours = RunLog::default();
            let mut reference = VecLog::default();
            let mut now: i64 = 1_000_000 + rng.below(1000) as i64;
            let big = round % 10 == 0;
            let steps = if big { 3000 } else { 20 + round % 200 };
            for step in 0..steps {
                now = match rng.below(10) {
                    0 => now,
                    1 => now - rng.below(50) as i64,          // a clock step back
                    2 => now + 1000 + rng.below(5000) as i64, // a long pause
                    3 if round % 7 == 0 => now + (1 << 40),   // a gap wider than a block's span
                    _ => now + rng.below(70) as i64,
                }
                .clamp(0, MAX_EXACT_MS);
                let cutoff = if big {
                    now - 1 - rng.below(200_000) as i64
                } else {
                    now - 1 - rng.below(2000) as i64
                };
                match rng.below(if big { 12 } else { 6 }) {
                    0 => assert_eq!(ours.trim(cutoff), reference.trim(cutoff)),
                    1 => {
                        let stamp = reference
                            .0
                            .get(rng.below(reference.0.len() as u64 + 1) as usize)
                            .copied()
                            .unwrap_or(now);
                        let count = 1 + rng.below(3);
                        assert_eq!(
                            ours.remove_at(stamp, count),
                            reference.remove_at(stamp, count),
                            "remove_at({stamp}, {count})"
                        );
                    }
                    _ => {
                        let cost = if !big && rng.below(50) == 0 {
                            1 + rng.below(10_000)
                        } else {
                            1 + rng.below(3)
                        };
                        ours.record(now, cost);
                        reference.record(now, cost);
                    }
                }
                if big && step % 50 != 0 {
                    continue;
                }
                assert_eq!(ours.len(), reference.len());
                assert_eq!(ours.count_expired(cutoff), reference.count_expired(cutoff));
                assert_eq!(ours.newest(), reference.newest());
                for n in [1, 2, 3, 7, 500] {
                    assert_eq!(ours.nth_live(cutoff, n), reference.nth_live(cutoff, n), "n={n}");
                }
                assert_eq!(stamps(&ours), reference.0);
                assert_consistent(&ours);
                if !ours.is_empty() {
                    assert_eq!(stamps(&RunLog::decode(&canonical(&ours)).unwrap()), reference.0);
                    assert_eq!(stamps(&RunLog::decode_runs(&runs_bytes(&ours)).unwrap()), reference.0);
                    assert_eq!(canonical(&ours.clone()), canonical(&ours));
                }
            }
        }
    }
}
