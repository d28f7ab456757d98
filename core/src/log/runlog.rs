//! The log: one root pointer, a block (the inline form) or a large root;
//! its forms, its allocations, and the changes that rewrite a block.

use std::ptr::NonNull;

use super::*;
use crate::window::Log;

// The log.

/// A window's log of entries (see the module docs). One pointer: null when
/// nothing was ever recorded; else a block (inline form) or a large root.
/// Owns its allocations.
#[derive(Debug, Default)]
pub struct RunLog {
    root: Option<NonNull<u8>>,
}

/// The root, owned, by form.
pub(crate) enum Root {
    Inline(Block),
    Large(Large),
}

/// The root, borrowed, by form.
pub(crate) enum RootRef<'a> {
    Inline(&'a Block),
    Large(&'a Large),
}

/// The root, borrowed to change, by form.
pub(crate) enum RootMut<'a> {
    Inline(&'a mut Block),
    Large(&'a mut Large),
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
pub(crate) fn is_large(ptr: NonNull<u8>) -> bool {
    // SAFETY: a root is a live allocation of at least 16 bytes, 8-aligned.
    let word = u64::from_le(unsafe { std::ptr::read(ptr.as_ptr().add(8) as *const u64) });
    word & 3 == TAG_LARGE
}

impl RunLog {
    /// The root, borrowed, by form.
    #[inline(always)]
    pub(crate) fn root(&self) -> Option<RootRef<'_>> {
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
    pub(crate) fn root_mut(&mut self) -> Option<RootMut<'_>> {
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
    pub(crate) fn take_root(&mut self) -> Option<Root> {
        let ptr = self.root.take()?;
        // SAFETY: the log owned the pointer (from `into_ptr`), and gives it
        // up here; the tag says which kind it is.
        Some(unsafe {
            if is_large(ptr) {
                Root::Large(Large::from_ptr(ptr))
            } else {
                Root::Inline(Block::from_ptr(ptr))
            }
        })
    }

    /// Makes `root` the log's; the log must hold nothing (what it held would leak).
    pub(crate) fn set_root(&mut self, root: Root) {
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
            Some(RootRef::Inline(block)) => each(block.as_ptr(), block.size()),
            Some(RootRef::Large(large)) => {
                let (_, _, capacity) = large.range();
                each(large.as_ptr(), Large::layout(capacity).size());
                for r in large.refs() {
                    each(r.block.as_ptr(), r.block.size());
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
        // SAFETY: `move_to` keeps each allocation's size and contents (the
        // caller's promise), so each block and root stays what it was.
        unsafe {
            match self.root_mut() {
                None => {}
                Some(RootMut::Inline(block)) => block.relocate(&mut move_to),
                Some(RootMut::Large(large)) => {
                    for r in large.refs_mut() {
                        r.block.relocate(&mut move_to);
                    }
                    large.relocate(&mut move_to);
                }
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
    pub(crate) fn adopt(&mut self, blocks: Vec<Block>) {
        debug_assert!(self.root.is_none());
        if blocks.len() > 1 {
            self.set_root(Root::Large(Large::new(blocks.into_iter())));
        } else if let Some(block) = blocks.into_iter().next() {
            self.set_root(Root::Inline(block));
        }
    }

    /// A large root left with one block (or none) becomes the inline form
    /// again: a large root always has two blocks or more.
    pub(crate) fn collapse_if_single(&mut self) {
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
    pub(crate) fn rewrite_block(&mut self, at: usize, change: impl FnOnce(&mut Vec<(i64, u64)>)) {
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
    pub(crate) fn insert_older(&mut self, stamp_ms: i64, cost: u64) {
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
    pub(crate) fn trim_slow(&mut self, cutoff_ms: i64) -> u64 {
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

    pub(crate) fn remove_by_rewrite(&mut self, at: usize, stamp_ms: i64, count: u64) -> u64 {
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
