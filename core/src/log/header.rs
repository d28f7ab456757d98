//! A block's header (unpacked), where its slots lie, its size classes, and
//! the runs read from its bits (in memory or in a serialized group).

use std::alloc::Layout;

use super::*;

// Block headers and layouts.

/// A block's header, unpacked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) first_ms: i64,
    /// Width of a slot's gap - 1 and count - 1.
    pub(crate) dw: u32,
    pub(crate) cw: u32,
    pub(crate) tag: u64,
    /// Index into `SIZE_CLASSES` (0 in serialized groups).
    pub(crate) class: u32,
    /// Slots written, the dead ones included.
    pub(crate) runs: u32,
    /// Leading slots already trimmed (0 in serialized groups).
    pub(crate) dead: u32,
    /// Last stamp minus the first live one.
    pub(crate) span: u64,
}

impl Header {
    pub(crate) fn read(bytes: &[u8]) -> Header {
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

    pub(crate) fn write(&self, bytes: &mut [u8]) {
        let w0 = self.first_ms as u64 | u64::from(self.dw) << 53 | u64::from(self.cw) << 59;
        let w1 = self.tag
            | u64::from(self.class) << 1
            | u64::from(self.runs) << 6
            | u64::from(self.dead) << 17
            | self.span << 24;
        bytes[0..8].copy_from_slice(&w0.to_le_bytes());
        bytes[8..16].copy_from_slice(&w1.to_le_bytes());
    }

    pub(crate) fn last_ms(&self) -> i64 {
        self.first_ms + self.span as i64
    }

    pub(crate) fn layout(&self) -> Slots {
        Slots {
            dw: self.dw,
            cw: self.cw,
        }
    }

    /// Runs not trimmed.
    pub(crate) fn live(&self) -> u32 {
        self.runs - self.dead
    }
}

/// Where a block's fields lie, for given widths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slots {
    pub(crate) dw: u32,
    pub(crate) cw: u32,
}

impl Slots {
    /// Where slot 0 starts: after the header, and the entry count when
    /// counts are stored at all.
    pub(crate) fn base(self) -> usize {
        if self.cw > 0 {
            DATA_BITS + ENTRIES_BITS as usize
        } else {
            DATA_BITS
        }
    }
    pub(crate) fn slot_bits(self) -> usize {
        (self.dw + self.cw) as usize
    }
    /// Bit position of run `i`'s count - 1.
    pub(crate) fn count_pos(self, i: u32) -> usize {
        if i == 0 {
            self.base()
        } else {
            self.gap_pos(i) + self.dw as usize
        }
    }
    /// Bit position of run `i`'s (>= 1) gap - 1.
    pub(crate) fn gap_pos(self, i: u32) -> usize {
        self.base() + self.cw as usize + (i as usize - 1) * self.slot_bits()
    }
    /// Where the bits of `runs` runs end.
    pub(crate) fn bits(self, runs: u32) -> usize {
        if runs == 0 {
            DATA_BITS
        } else {
            self.gap_pos(runs)
        }
    }
    /// Bytes of a block of `runs` runs, header included.
    pub(crate) fn bytes(self, runs: u32) -> usize {
        self.bits(runs).div_ceil(8)
    }
}

/// The smallest size class that holds `bytes`, if any.
pub(crate) fn class_for(bytes: usize) -> Option<u32> {
    SIZE_CLASSES.iter().position(|&size| size >= bytes).map(|i| i as u32)
}

pub(crate) fn block_layout(class: u32) -> Layout {
    Layout::from_size_align(SIZE_CLASSES[class as usize], 8).unwrap()
}

// Reading runs from a block's bits (in memory or in a serialized group).

/// The runs of a block (its bytes from the header on), oldest first;
/// allocates nothing.
#[derive(Clone)]
pub(crate) struct BlockRuns<'a> {
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
    pub(crate) fn new(header: &Header, data: &'a [u8]) -> BlockRuns<'a> {
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
