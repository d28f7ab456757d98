//! A block's trim: its oldest runs marked dead, shifted out once per MAX_DEAD;
//! and the counts a trim or a PEEK reads.

use super::*;

impl Block {
    /// Trims the first `k` (< live) live runs, `entries_removed` entries in
    /// all, the first run left being stamped `first_ms`: they become dead
    /// slots, shifted out once there are more than MAX_DEAD.
    pub(crate) fn drop_front(&mut self, k: u32, entries_removed: u64, first_ms: i64) {
        if k > 0 {
            self.drop_front_of(self.header(), k, entries_removed, first_ms, true);
        }
    }

    /// `drop_front` with the block's header at hand; `shrink`: whether the
    /// block may give back room once the dead slots are shifted out (not the
    /// oldest block of a large window, which trims empty and frees soon).
    pub(crate) fn drop_front_of(&mut self, header: Header, k: u32, entries_removed: u64, first_ms: i64, shrink: bool) {
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
    pub(crate) fn trim_in_place(&mut self, cutoff_ms: i64) -> Option<u64> {
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
    pub(crate) fn trim(&mut self, cutoff_ms: i64, shrink: bool) -> u64 {
        match self.trim_in_place(cutoff_ms) {
            Some(removed) => removed,
            None => self.trim_slow(cutoff_ms, shrink),
        }
    }

    /// `trim` for every case.
    #[inline(never)]
    pub(crate) fn trim_slow(&mut self, cutoff_ms: i64, shrink: bool) -> u64 {
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
    pub(crate) fn count_le(&self, cutoff_ms: i64) -> u64 {
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
    pub(crate) fn nth(&self, n: u64) -> Option<i64> {
        let mut seen = 0;
        self.runs().find_map(|(stamp, count)| {
            seen += count;
            (seen >= n).then_some(stamp)
        })
    }
}
