//! The compact form's log: a window's entries as bit-packed *blocks* of
//! runs, no FFI (unit-tested in `tests.rs`, fuzzed by
//! `fuzz/fuzz_targets/decode.rs`, run under Miri).
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
//!
//! # Files
//!
//! `bits` (bit strings), `header` (a block's header, slots and size
//! classes), `block` (a block's allocation and re-packing), `append`, `trim`,
//! `remove` and `pack` (a block's changes), `large` (the index of blocks),
//! `runlog` (the log's root and forms), `ops` (the window's `Log` over it),
//! `v2` and `v1` (the two codecs), `varint`. Only `bits`, `block`, `large` and
//! `runlog` hold `unsafe` code: the raw allocations a window is made of.

mod append;
#[allow(unsafe_code)]
mod bits;
#[allow(unsafe_code)]
mod block;
mod header;
#[allow(unsafe_code)]
mod large;
mod ops;
mod pack;
mod remove;
#[allow(unsafe_code)]
mod runlog;
#[cfg(test)]
mod tests;
mod trim;
mod v1;
mod v2;
mod varint;

use crate::args::MAX_LIMIT_CEILING;

use bits::*;
use block::*;
use header::*;
use large::*;
use pack::*;
use varint::*;

pub use runlog::{Form, RunLog, Runs};
use runlog::{Root, RootMut, RootRef};

/// Most entries one window can hold: an admission never takes a window past
/// its `limit`, and no limit can be configured above `MAX_LIMIT_CEILING`.
pub const MAX_ENTRIES: u64 = MAX_LIMIT_CEILING as u64;

/// Most runs in one block (and in one group of the version 2 encoding), and
/// the largest block in bytes, header included: what an inline window holds.
pub const BLOCK_RUNS: u32 = 1024;
pub const BLOCK_BYTES: usize = 1024;

/// How far a block may grow by admissions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) runs: u32,
    pub(crate) bytes: usize,
}

/// An inline window: as many as a block can hold, so that a window of 1,000
/// requests a minute is one allocation.
pub(crate) const INLINE: Limits = Limits {
    runs: BLOCK_RUNS,
    bytes: BLOCK_BYTES,
};

/// A block of a large window: smaller, so that what a refund or a step back
/// decodes and rewrites (one block) stays about as cheap as a sorted set's
/// O(log n) for the same, and the trim's shift of the first block is short.
pub(crate) const INDEXED: Limits = Limits { runs: 256, bytes: 256 };

/// Allocation sizes a block takes, smallest first: the allocator's size
/// classes (jemalloc's, which Redis uses), so no byte of an allocation is lost
/// to rounding. A block's header names its class, so it knows its size.
pub(crate) const SIZE_CLASSES: [usize; 20] = [
    16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024,
];

pub(crate) const HEADER_BYTES: usize = 16;
/// Bit positions count from the block's first byte: its data starts here.
pub(crate) const DATA_BITS: usize = HEADER_BYTES * 8;
pub(crate) const SPAN_BITS: u32 = 40;
/// Largest span of a block (and largest gap - 1): 2^40 - 1 ms, 34.8 years; a
/// window whose runs lie further apart takes more blocks.
pub(crate) const MAX_SPAN: u64 = (1 << SPAN_BITS) - 1;
/// Most trimmed slots a block keeps before shifting them out.
pub(crate) const MAX_DEAD: u32 = 127;
/// Width of a block's entry count, and the widest count - 1.
pub(crate) const ENTRIES_BITS: u32 = 30;
pub(crate) const STAMP_MASK: u64 = (1 << 53) - 1;

pub(crate) const TAG_BLOCK: u64 = 0;
pub(crate) const TAG_LARGE: u64 = 1;

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
