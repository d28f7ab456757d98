//! A block's refund: one run found from the nearer end, and taken out.

use super::*;

impl Block {
    /// The live run stamped `stamp_ms` (within the block's first and last
    /// stamps), as (its slot, its count, the gap from the previous live run,
    /// 0 for the first): found from the header for the newest, else by a walk
    /// of the slots from whichever end of the block is nearer in time.
    pub(crate) fn find_run(&self, header: &Header, stamp_ms: i64) -> Option<(u32, u64, u64)> {
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
    pub(crate) fn remove_at(&mut self, stamp_ms: i64, count: u64) -> Result<u64, ()> {
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
}
