//! A block in memory: the one allocation that owns it, its header words, its
//! size class, and the re-packing of its slots (see the module docs).

use std::alloc::{alloc_zeroed, dealloc, realloc};
use std::ptr::NonNull;

use super::*;

// Blocks in memory.

/// An allocated block (see the module docs): it owns its allocation, which
/// its `Drop` frees (once: a block is not `Copy`), and is changed only
/// through `&mut self`. Its header's size class always names the size of the
/// allocation: only `alloc` and `resize` choose a class, and every other
/// header write carries the class it read.
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct Block(NonNull<u8>);

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated by `alloc`/`resize` with the layout of the class
        // its header names; `self` is its only owner, dropped once.
        unsafe { dealloc(self.0.as_ptr(), block_layout(self.header().class)) };
    }
}

impl Block {
    /// An empty block of the given class (every byte zero but the class).
    pub(crate) fn alloc(class: u32) -> Block {
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
    pub(crate) fn with_run(stamp_ms: i64, count: u64) -> Block {
        let mut block = Block::alloc(0);
        block.reset_to(stamp_ms, count);
        block
    }

    /// A new newest block of a large window: one run, allocated at the
    /// largest size such a block fills to (as it will: admissions land there),
    /// so that it is not re-allocated as it fills.
    pub(crate) fn newest_of_large(stamp_ms: i64, count: u64) -> Block {
        let mut block = Block::alloc(class_for(INDEXED.bytes).unwrap());
        block.reset_to(stamp_ms, count);
        block
    }

    /// The allocation, given up by the block (its next owner frees it).
    pub(crate) fn into_ptr(self) -> NonNull<u8> {
        let ptr = self.0;
        std::mem::forget(self);
        ptr
    }

    /// Takes back an allocation [`Block::into_ptr`] gave up.
    ///
    /// # Safety
    /// `ptr` must come from `Block::into_ptr`, and be owned by nobody else.
    pub(crate) unsafe fn from_ptr(ptr: NonNull<u8>) -> Block {
        Block(ptr)
    }

    /// Where the allocation is (for MEMORY USAGE and defrag).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }

    /// Lets `move_to` move the allocation (active defrag): it returns the new
    /// pointer, or null to leave it.
    ///
    /// # Safety
    /// As [`RunLog::relocate`]'s `move_to`.
    pub(crate) unsafe fn relocate(&mut self, move_to: &mut dyn FnMut(*mut u8) -> *mut u8) {
        if let Some(moved) = NonNull::new(move_to(self.0.as_ptr())) {
            self.0 = moved;
        }
    }

    #[inline(always)]
    pub(crate) fn size(&self) -> usize {
        // From the header word as the hot paths read it, so that a size they
        // computed and this one are one load.
        SIZE_CLASSES[((self.word1() >> 1) & 31) as usize]
    }

    /// The whole allocation (every byte initialised: allocated zeroed, and
    /// zeroed where it grows).
    #[inline(always)]
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the block is a live allocation of `size` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), self.size()) }
    }

    #[inline(always)]
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` is the only way to the allocation.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), self.size()) }
    }

    #[inline(always)]
    pub(crate) fn head_words(&self) -> &[u8] {
        // SAFETY: every block is at least 16 bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), HEADER_BYTES) }
    }

    #[inline(always)]
    pub(crate) fn header(&self) -> Header {
        Header::read(self.head_words())
    }

    #[inline(always)]
    pub(crate) fn set_header(&mut self, header: &Header) {
        // SAFETY: every block is at least 16 bytes.
        header.write(unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), HEADER_BYTES) })
    }

    pub(crate) fn runs(&self) -> BlockRuns<'_> {
        BlockRuns::new(&self.header(), self.bytes())
    }

    /// The header's first word (first stamp, widths): what the hot paths read first.
    #[inline(always)]
    pub(crate) fn word0(&self) -> u64 {
        // SAFETY: every block is at least 16 bytes, 8-aligned.
        unsafe { std::ptr::read(self.0.as_ptr() as *const u64) }.to_le()
    }

    #[inline(always)]
    pub(crate) fn word1(&self) -> u64 {
        // SAFETY: as in `word0`.
        unsafe { std::ptr::read(self.0.as_ptr().add(8) as *const u64) }.to_le()
    }

    #[inline(always)]
    pub(crate) fn set_words(&mut self, w0: u64, w1: u64) {
        // SAFETY: as in `word0`.
        unsafe {
            std::ptr::write(self.0.as_ptr() as *mut u64, w0.to_le());
            std::ptr::write(self.0.as_ptr().add(8) as *mut u64, w1.to_le());
        }
    }

    #[inline(always)]
    pub(crate) fn first_ms(&self) -> i64 {
        (self.word0() & STAMP_MASK) as i64
    }

    #[inline(always)]
    pub(crate) fn last_ms(&self) -> i64 {
        let (w0, w1) = (self.word0(), self.word1());
        (w0 & STAMP_MASK) as i64 + (w1 >> 24) as i64
    }

    /// Runs not trimmed (0: the block is empty).
    #[inline(always)]
    pub(crate) fn live_runs(&self) -> u32 {
        let w1 = self.word1();
        (((w1 >> 6) & 2047) - ((w1 >> 17) & 127)) as u32
    }

    #[inline(always)]
    pub(crate) fn entries(&self) -> u64 {
        if self.word0() >> 59 == 0 {
            // cw 0: one entry per live run.
            let w1 = self.word1();
            ((w1 >> 6) & 2047) - ((w1 >> 17) & 127)
        } else {
            get_bits(self.bytes(), DATA_BITS, ENTRIES_BITS)
        }
    }

    #[inline(always)]
    pub(crate) fn set_entries(&mut self, header: &Header, entries: u64) {
        if header.cw > 0 {
            set_bits(self.bytes_mut(), DATA_BITS, ENTRIES_BITS, entries);
        }
    }

    /// Makes the allocation the size class `class`, keeping the bytes that fit.
    pub(crate) fn resize(&mut self, class: u32) {
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
    pub(crate) fn reserve(&mut self, bytes: usize) {
        if bytes > self.size() {
            self.resize(class_for(bytes).expect("a block never exceeds BLOCK_BYTES"));
        }
    }

    /// Shifts the dead slots out: the first live run becomes slot 0.
    pub(crate) fn compact(&mut self) {
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
    pub(crate) fn shrink_if_oversized(&mut self) {
        let header = self.header();
        let size = SIZE_CLASSES[header.class as usize];
        let used = header.layout().bytes(header.live());
        if size >= 64 && used * 2 <= size {
            self.compact();
            self.resize(class_for(used.max(32)).unwrap());
        }
    }

    /// Empties the block and gives it the one run `(stamp_ms, count)`.
    pub(crate) fn reset_to(&mut self, stamp_ms: i64, count: u64) {
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
    pub(crate) fn clear(&mut self) {
        let class = self.header().class;
        self.set_header(&Header {
            class,
            ..Header::default()
        });
    }

    /// Re-writes every live slot with wider (or equal) widths, in place, the
    /// dead ones shifted out (the allocation must hold the new layout).
    pub(crate) fn widen(&mut self, to: Slots) {
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
}
