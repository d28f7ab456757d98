//! The large form's root: the index of blocks.

use std::alloc::{alloc_zeroed, dealloc, realloc, Layout};
use std::ptr::NonNull;

use super::*;

// The large form's root: the index of blocks.

/// One block of a large window, as the index knows it.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct BlockRef {
    pub(crate) first_ms: i64,
    pub(crate) entries: u32,
    pub(crate) _unused: u32,
    pub(crate) block: Block,
}

impl BlockRef {
    pub(crate) fn of(block: Block) -> BlockRef {
        BlockRef {
            first_ms: block.first_ms(),
            entries: block.entries() as u32,
            _unused: 0,
            block,
        }
    }

    /// Reads the first stamp and the entry count again from the block.
    pub(crate) fn refresh(&mut self) {
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
pub(crate) struct Large(NonNull<u8>);

pub(crate) const LARGE_HEADER: usize = 32;

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
    pub(crate) fn layout(capacity: u32) -> Layout {
        Layout::from_size_align(LARGE_HEADER + capacity as usize * std::mem::size_of::<BlockRef>(), 8).unwrap()
    }

    /// A root indexing `blocks`, in order.
    pub(crate) fn new(blocks: impl ExactSizeIterator<Item = Block>) -> Large {
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
    pub(crate) fn into_ptr(self) -> NonNull<u8> {
        let ptr = self.0;
        std::mem::forget(self);
        ptr
    }

    /// Takes back an allocation [`Large::into_ptr`] gave up.
    ///
    /// # Safety
    /// `ptr` must come from `Large::into_ptr`, and be owned by nobody else.
    pub(crate) unsafe fn from_ptr(ptr: NonNull<u8>) -> Large {
        Large(ptr)
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
    pub(crate) fn words(&self) -> [u64; 4] {
        // SAFETY: the root is a live allocation of at least 32 bytes, 8-aligned.
        std::array::from_fn(|i| u64::from_le(unsafe { std::ptr::read((self.0.as_ptr() as *const u64).add(i)) }))
    }

    #[inline(always)]
    pub(crate) fn set_head(&mut self, entries: u64, head: u32, len: u32, capacity: u32) {
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

    #[inline(always)]
    pub(crate) fn entries(&self) -> u64 {
        // SAFETY: as in `words`.
        u64::from_le(unsafe { std::ptr::read(self.0.as_ptr() as *const u64) })
    }

    #[inline(always)]
    pub(crate) fn range(&self) -> (u32, u32, u32) {
        let words = self.words();
        (words[2] as u32, (words[2] >> 32) as u32, words[3] as u32)
    }

    #[inline(always)]
    pub(crate) fn set_entries(&mut self, entries: u64) {
        // SAFETY: the root's first word, 8-aligned; `&mut self` as in `set_head`.
        unsafe { std::ptr::write(self.0.as_ptr() as *mut u64, entries.to_le()) };
    }

    /// The first slot of the index (a raw pointer: whoever writes through
    /// it holds `&mut self`).
    #[inline(always)]
    pub(crate) fn refs_ptr(&self) -> *mut BlockRef {
        // SAFETY: the index starts right after the 32-byte header, 8-aligned,
        // within the allocation.
        unsafe { self.0.as_ptr().add(LARGE_HEADER) as *mut BlockRef }
    }

    /// The live blocks, oldest first.
    #[inline(always)]
    pub(crate) fn refs(&self) -> &[BlockRef] {
        let (head, len, _) = self.range();
        // SAFETY: the refs in `[head, len)` are initialised (see the type),
        // BlockRef is repr(C) with 8-byte alignment; borrowed with `self`.
        unsafe { std::slice::from_raw_parts(self.refs_ptr().add(head as usize), (len - head) as usize) }
    }

    /// The live blocks, oldest first, to change.
    #[inline(always)]
    pub(crate) fn refs_mut(&mut self) -> &mut [BlockRef] {
        let (head, len, _) = self.range();
        // SAFETY: as in `refs`; `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.refs_ptr().add(head as usize), (len - head) as usize) }
    }

    /// Makes room for `needed` refs in all: the dead prefix is dropped first,
    /// then the index doubles.
    pub(crate) fn reserve(&mut self, needed: u32) {
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
    pub(crate) fn move_to_front(&mut self) {
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
    pub(crate) fn try_append_in_place(&mut self, stamp_ms: i64, cost: u64) -> bool {
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
    pub(crate) fn push(&mut self, block: Block) {
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
    pub(crate) fn splice(&mut self, at: usize, blocks: Vec<Block>) -> Block {
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
    pub(crate) fn drop_front(&mut self, k: u32, entries_removed: u64) {
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
    pub(crate) fn trim(&mut self, cutoff_ms: i64) -> u64 {
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
    pub(crate) fn into_single(mut self) -> Block {
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
    pub(crate) fn find(&self, stamp_ms: i64) -> usize {
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
