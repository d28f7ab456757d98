//! A block's admissions: a run appended after its last, or added to it.

use super::*;

impl Block {
    /// The common admission, read and written as header words: a run later
    /// than the block's last whose gap and count fit the block's widths, into
    /// a block with room (no dead slot to shift out, no allocation). False,
    /// with nothing changed, when any of that does not hold.
    #[inline(always)]
    pub(crate) fn try_append_in_place(&mut self, stamp_ms: i64, count: u64, limits: Limits) -> bool {
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
    pub(crate) fn try_append(&mut self, stamp_ms: i64, count: u64, limits: Limits) -> bool {
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
    pub(crate) fn try_add_to_last(&mut self, count: u64) -> bool {
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
}
