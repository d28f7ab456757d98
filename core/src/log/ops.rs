//! The window's `Log` over a `RunLog`: the hot paths in place, the rest in
//! one block or the index.

use super::*;
use crate::window::Log;

impl Log for RunLog {
    fn len(&self) -> u64 {
        match self.root() {
            None => 0,
            Some(RootRef::Inline(block)) => block.entries(),
            Some(RootRef::Large(large)) => large.entries(),
        }
    }

    // Out of line: a call of one tier never needs it (its window is the
    // longest, whose count is `len` after the trim), and inlined into the
    // window's decision it costs that hot path its setup on every call.
    #[inline(never)]
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
