//! Blocks written at once from a list of runs, at their final size.

use super::*;

impl Block {
    /// A block of as many of `runs` (at least one) as fit, allocated at its
    /// final size and written once; returns it and how many runs it took.
    pub(crate) fn pack(runs: &[(i64, u64)], limits: Limits) -> (Block, usize) {
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
    pub(crate) fn duplicate(&self) -> Block {
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
pub(crate) fn build_blocks(runs: impl IntoIterator<Item = (i64, u64)>, inline_if_it_fits: bool) -> Vec<Block> {
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
