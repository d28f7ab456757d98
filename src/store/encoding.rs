//! The compact form's log, in plain Rust: a window's entries as a byte string
//! of *runs*, no FFI (unit-tested here, fuzzed by `fuzz/fuzz_targets/decode.rs`).
//!
//! A run is every entry of one millisecond: `(stamp, count)`. Runs are kept
//! oldest first, stamps strictly increasing, and each is written as
//!
//! ```text
//! varint(delta << 1 | multi) [varint(count) if multi]
//! ```
//!
//! where `delta` is the gap in ms from the previous run's stamp and `multi` says
//! whether the run holds more than one entry (a lone entry, the common case,
//! costs no count byte). `varint` is LEB128: 7 bits a byte, low bits first. A
//! window of evenly spaced requests 63 ms apart or less costs one byte per
//! request; 8,191 ms apart or less, two.
//!
//! The newest run stays *open* (decoded, in `open_ms`/`open_count`), so that an
//! admission at the newest millisecond adds to it in place, and one at a later
//! millisecond closes it (appends its bytes) and opens another: O(1). The trim
//! walks closed runs from the front and moves `head` past them: O(expired);
//! the dead prefix is dropped once it is as long as the live bytes, so that
//! costs O(1) amortised too. Only a stamp older than the newest (a caller's
//! clock stepping back) or a refund inside the window rewrites the log: O(n).
//!
//! The *canonical* form, what RDB, DUMP, AOF and replication carry, is the
//! same run encoding over every run, the open one included, with the first
//! delta taken from 0 (so it is the first stamp). Equal windows have equal
//! canonical bytes, and [`RunLog::decode`] accepts exactly the canonical form
//! (minimal varints, increasing stamps, counts in range, no trailing bytes),
//! so a crafted payload is refused with a reason, never loaded half-valid.

use crate::args::{MAX_EXACT_MS, MAX_LIMIT_CEILING};
use crate::window::Log;

/// Most entries one window can hold: an admission never takes a window past
/// its `limit`, and no limit can be configured above `MAX_LIMIT_CEILING`.
pub const MAX_ENTRIES: u64 = MAX_LIMIT_CEILING as u64;

/// A window's log of entries as runs of equal stamps (see the module docs).
/// 64 bytes: with a short window's bytes in a 16- or 32-byte allocation, a
/// 10-entry window costs under 100 bytes besides its key.
#[derive(Clone, Debug, Default)]
pub struct RunLog {
    /// Closed runs, oldest first, from `head` on; the bytes before `head` are
    /// trimmed runs not yet dropped.
    bytes: Vec<u8>,
    head: usize,
    /// Stamp of the oldest closed run (the one at `head`; its own delta in
    /// the bytes is not read). Kept here so that a trim with nothing expired,
    /// the common case, reads no byte of the buffer: no cache miss for it.
    head_ms: i64,
    /// Stamp of the newest closed run: the open run's delta starts from it
    /// when it closes.
    tail_ms: i64,
    /// Entries in closed runs.
    closed: u32,
    /// The newest run; `open_count == 0` iff the log is empty.
    open_count: u32,
    open_ms: i64,
}

/// Why a canonical byte string is not a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Empty,
    /// A varint runs past the end of the bytes.
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
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecodeError::Empty => "no entries (an empty window is never stored)",
            DecodeError::Truncated => "the bytes end inside a run",
            DecodeError::BadVarint => "a varint is overlong or overflows 64 bits",
            DecodeError::BadCount => "a run marked as several entries holds fewer than 2",
            DecodeError::Unsorted => "run stamps are not strictly increasing",
            DecodeError::StampRange => "a stamp is above 2^53 - 1",
            DecodeError::TooMany => "more entries than a window can hold (1000000000)",
        })
    }
}

impl RunLog {
    /// Every run, oldest first, as `(stamp_ms, count)`; allocates nothing.
    pub fn runs(&self) -> Runs<'_> {
        Runs { log: self, pos: self.head, stamp_ms: None, open_done: self.open_count == 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.open_count == 0
    }

    /// Bytes held on the heap (for `MEMORY USAGE` and `free_effort`).
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
    }

    /// The heap buffer's pointer, for the server's allocator queries.
    pub fn heap_ptr(&self) -> Option<*const u8> {
        (self.bytes.capacity() > 0).then(|| self.bytes.as_ptr())
    }

    /// Lets `move_to` reallocate the heap buffer elsewhere (active defrag):
    /// it gets the old pointer and returns the new one, or null to keep it.
    ///
    /// # Safety
    /// `move_to` must return null or a pointer to an allocation of the same
    /// allocator, at least `capacity` bytes long, holding a copy of the old
    /// one, which it has freed.
    pub unsafe fn relocate(&mut self, move_to: impl FnOnce(*mut u8) -> *mut u8) {
        if self.bytes.capacity() == 0 {
            return;
        }
        let mut bytes = std::mem::ManuallyDrop::new(std::mem::take(&mut self.bytes));
        let (ptr, len, capacity) = (bytes.as_mut_ptr(), bytes.len(), bytes.capacity());
        let moved = move_to(ptr);
        let ptr = if moved.is_null() { ptr } else { moved };
        // SAFETY: `ptr` is the original allocation or, by the caller's
        // contract, a copy of it of the same capacity from the same allocator.
        self.bytes = unsafe { Vec::from_raw_parts(ptr, len, capacity) };
    }

    /// The canonical bytes of this window (see the module docs).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.bytes.len() - self.head + 20);
        let mut previous_ms = 0;
        for (stamp_ms, count) in self.runs() {
            put_run(out, (stamp_ms - previous_ms) as u64, count);
            previous_ms = stamp_ms;
        }
    }

    /// The window whose canonical bytes these are, or why they are none.
    pub fn decode(bytes: &[u8]) -> Result<RunLog, DecodeError> {
        let mut pos = 0;
        let mut stamp_ms: i64 = 0;
        let mut total: u64 = 0;
        // Start of the last run read, and the stamp before it.
        let (mut last_start, mut before_last_ms) = (0, 0);
        let mut last_count = 0;
        while pos < bytes.len() {
            let start = pos;
            let (delta, count) = read_run(bytes, &mut pos)?;
            if start > 0 && delta == 0 {
                return Err(DecodeError::Unsorted);
            }
            let next_ms = i64::try_from(delta)
                .ok()
                .and_then(|delta| stamp_ms.checked_add(delta))
                .filter(|&stamp| stamp <= MAX_EXACT_MS)
                .ok_or(DecodeError::StampRange)?;
            total = total.checked_add(count).filter(|&t| t <= MAX_ENTRIES).ok_or(DecodeError::TooMany)?;
            (last_start, before_last_ms, last_count) = (start, stamp_ms, count);
            stamp_ms = next_ms;
        }
        if total == 0 {
            return Err(DecodeError::Empty);
        }
        // The bytes before the last run are the closed runs, from 0 (the
        // first one's delta from 0 is its stamp); the last run is the open one.
        let first_ms = if last_start == 0 { 0 } else { read_run(bytes, &mut 0)?.0 as i64 };
        let log = RunLog {
            bytes: bytes[..last_start].to_vec(),
            head: 0,
            head_ms: first_ms,
            tail_ms: if last_start == 0 { 0 } else { before_last_ms },
            closed: (total - last_count) as u32,
            open_count: last_count as u32,
            open_ms: stamp_ms,
        };
        Ok(log)
    }

    /// Removes up to `count` entries stamped exactly `stamp_ms`; returns how
    /// many went. O(1) when it leaves the newest run non-empty, else O(n).
    pub fn remove_at(&mut self, stamp_ms: i64, count: u64) -> u64 {
        if count == 0 || self.is_empty() {
            return 0;
        }
        if stamp_ms == self.open_ms && count < u64::from(self.open_count) {
            self.open_count -= count as u32;
            return count;
        }
        let mut removed = 0;
        let runs: Vec<(i64, u64)> = self
            .runs()
            .filter_map(|(stamp, held)| {
                if stamp != stamp_ms {
                    return Some((stamp, held));
                }
                removed = held.min(count);
                (held > removed).then_some((stamp, held - removed))
            })
            .collect();
        if removed > 0 {
            *self = RunLog::from_runs(runs);
        }
        removed
    }

    /// A log of these runs (stamps strictly increasing, counts >= 1), with
    /// no trimmed prefix (COPY and CONVERT build theirs so).
    pub fn from_runs(runs: impl IntoIterator<Item = (i64, u64)>) -> RunLog {
        let mut log = RunLog::default();
        for (stamp_ms, count) in runs {
            log.record(stamp_ms, count);
        }
        log
    }

    fn clear(&mut self) {
        *self = RunLog::default();
    }

    /// Appends the open run to the closed ones.
    fn close_open_run(&mut self) {
        if self.head == self.bytes.len() {
            // No closed run left: restart the bytes at this stamp.
            self.bytes.clear();
            self.head = 0;
            self.head_ms = self.open_ms;
            self.tail_ms = self.open_ms;
        }
        put_run(&mut self.bytes, (self.open_ms - self.tail_ms) as u64, u64::from(self.open_count));
        self.tail_ms = self.open_ms;
        self.closed += self.open_count;
    }

    /// Drops the trimmed prefix once it is as long as what is left (O(1)
    /// amortised per trimmed byte), and gives back a buffer far too large.
    fn drop_trimmed(&mut self) {
        if self.head == self.bytes.len() {
            self.bytes.clear();
            self.head = 0;
        } else if self.head >= 16 && self.head * 2 >= self.bytes.len() {
            self.bytes.drain(..self.head);
            self.head = 0;
        }
        let used = self.bytes.len();
        if self.bytes.capacity() >= 64 && self.bytes.capacity() >= 4 * used {
            self.bytes.shrink_to(used * 2);
        }
    }

    /// An entry older than the newest: rewrites the log with it in place.
    fn insert_older(&mut self, stamp_ms: i64, cost: u64) {
        let mut runs: Vec<(i64, u64)> = self.runs().collect();
        match runs.binary_search_by_key(&stamp_ms, |&(stamp, _)| stamp) {
            Ok(at) => runs[at].1 += cost,
            Err(at) => runs.insert(at, (stamp_ms, cost)),
        }
        *self = RunLog::from_runs(runs);
    }
}

impl Log for RunLog {
    fn len(&self) -> u64 {
        u64::from(self.closed) + u64::from(self.open_count)
    }

    fn count_expired(&self, cutoff_ms: i64) -> u64 {
        if self.is_empty() || (self.closed > 0 && self.head_ms > cutoff_ms) || (self.closed == 0 && self.open_ms > cutoff_ms) {
            return 0;
        }
        self.runs().take_while(|&(stamp, _)| stamp <= cutoff_ms).map(|(_, count)| count).sum()
    }

    fn trim(&mut self, cutoff_ms: i64) -> u64 {
        if self.is_empty() {
            return 0;
        }
        if self.open_ms <= cutoff_ms {
            let removed = self.len();
            self.clear();
            return removed;
        }
        if self.closed == 0 || self.head_ms > cutoff_ms {
            return 0; // nothing expired: the bytes are not read
        }
        let (mut pos, mut run_ms, mut removed) = (self.head, self.head_ms, 0u64);
        while pos < self.bytes.len() {
            let mut next = pos;
            let Ok((delta, count)) = read_run(&self.bytes, &mut next) else { break };
            if pos != self.head {
                run_ms += delta as i64;
            }
            if run_ms > cutoff_ms {
                // The first run left is the new head.
                self.head_ms = run_ms;
                break;
            }
            (pos, removed) = (next, removed + count);
        }
        self.head = pos;
        self.closed -= removed as u32;
        self.drop_trimmed();
        removed
    }

    fn nth_live(&self, cutoff_ms: i64, n: u64) -> Option<i64> {
        let mut seen = 0;
        self.runs().filter(|&(stamp, _)| stamp > cutoff_ms).find_map(|(stamp, count)| {
            seen += count;
            (seen >= n && n > 0).then_some(stamp)
        })
    }

    fn newest(&self) -> Option<i64> {
        (!self.is_empty()).then_some(self.open_ms)
    }

    fn remove_at(&mut self, stamp_ms: i64, count: u64) -> u64 {
        RunLog::remove_at(self, stamp_ms, count)
    }

    fn record(&mut self, now_ms: i64, cost: u64) {
        if cost == 0 {
            return;
        }
        if self.is_empty() {
            self.clear();
            (self.open_ms, self.open_count) = (now_ms, cost as u32);
            return;
        }
        match now_ms.cmp(&self.open_ms) {
            std::cmp::Ordering::Equal => self.open_count = self.open_count.saturating_add(cost as u32),
            std::cmp::Ordering::Greater => {
                self.close_open_run();
                (self.open_ms, self.open_count) = (now_ms, cost as u32);
            }
            std::cmp::Ordering::Less => self.insert_older(now_ms, cost),
        }
    }
}

/// Iterator over a log's runs, oldest first.
pub struct Runs<'a> {
    log: &'a RunLog,
    pos: usize,
    /// The last closed run's stamp; `None` before the first (at `head_ms`).
    stamp_ms: Option<i64>,
    open_done: bool,
}

impl Iterator for Runs<'_> {
    type Item = (i64, u64);

    fn next(&mut self) -> Option<(i64, u64)> {
        if self.pos < self.log.bytes.len() {
            // The closed bytes were written by `put_run`: they always decode.
            if let Ok((delta, count)) = read_run(&self.log.bytes, &mut self.pos) {
                let stamp_ms = self.stamp_ms.map_or(self.log.head_ms, |previous| previous + delta as i64);
                self.stamp_ms = Some(stamp_ms);
                return Some((stamp_ms, count));
            }
            self.pos = self.log.bytes.len();
        }
        if self.open_done {
            return None;
        }
        self.open_done = true;
        Some((self.log.open_ms, u64::from(self.log.open_count)))
    }
}

fn put_run(out: &mut Vec<u8>, delta: u64, count: u64) {
    put_varint(out, delta << 1 | u64::from(count > 1));
    if count > 1 {
        put_varint(out, count);
    }
}

fn read_run(bytes: &[u8], pos: &mut usize) -> Result<(u64, u64), DecodeError> {
    let head = read_varint(bytes, pos)?;
    let count = if head & 1 == 1 {
        let count = read_varint(bytes, pos)?;
        if count < 2 {
            return Err(DecodeError::BadCount);
        }
        count
    } else {
        1
    };
    Ok((head >> 1, count))
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A minimal LEB128 varint of at most 64 bits.
fn read_varint(bytes: &[u8], pos: &mut usize) -> Result<u64, DecodeError> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *bytes.get(*pos).ok_or(DecodeError::Truncated)?;
        *pos += 1;
        if shift == 63 && byte > 1 {
            return Err(DecodeError::BadVarint);
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            if byte == 0 && shift > 0 {
                return Err(DecodeError::BadVarint);
            }
            return Ok(value);
        }
        shift += 7;
        if shift > 63 {
            return Err(DecodeError::BadVarint);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::tests::VecLog;

    fn stamps(log: &RunLog) -> Vec<i64> {
        log.runs().flat_map(|(stamp, count)| std::iter::repeat_n(stamp, count as usize)).collect()
    }

    fn canonical(log: &RunLog) -> Vec<u8> {
        let mut out = Vec::new();
        log.encode(&mut out);
        out
    }

    /// A small deterministic generator (no dependency): xorshift64*.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn one_byte_per_lone_entry_up_to_63_ms_apart() {
        let mut log = RunLog::default();
        for i in 0..1000 {
            log.record(1_700_000_000_000 + i * 63, 1);
        }
        // 999 closed runs of one byte each; the newest is open.
        assert_eq!(log.bytes.len(), 999);
        let mut log = RunLog::default();
        for i in 0..10 {
            log.record(1_700_000_000_000 + i * 64, 1);
        }
        assert_eq!(log.bytes.len(), 1 + 8 * 2, "64 ms apart needs two bytes (the first delta is 0)");
        assert_eq!(std::mem::size_of::<RunLog>(), 64);
    }

    #[test]
    fn runs_group_equal_stamps_and_count_bytes_only_when_several() {
        let mut log = RunLog::default();
        log.record(100, 1);
        log.record(100, 2);
        log.record(105, 1);
        log.record(300, 4);
        assert_eq!(log.runs().collect::<Vec<_>>(), [(100, 3), (105, 1), (300, 4)]);
        assert_eq!(log.len(), 8);
        // canonical: 100<<1|1, 3 | 5<<1 | 195<<1|1 (two bytes), 4
        assert_eq!(canonical(&log), [201, 1, 3, 10, 135, 3, 4]);
    }

    #[test]
    fn canonical_bytes_round_trip_and_do_not_depend_on_history() {
        let mut a = RunLog::default();
        for stamp in [10, 20, 20, 30, 45, 46, 47] {
            a.record(stamp, 1);
        }
        a.trim(20); // leaves 30, 45, 46, 47 with a trimmed prefix
        let mut b = RunLog::default();
        for stamp in [30, 45, 46, 47] {
            b.record(stamp, 1);
        }
        assert_eq!(canonical(&a), canonical(&b));
        let decoded = RunLog::decode(&canonical(&a)).unwrap();
        assert_eq!(stamps(&decoded), [30, 45, 46, 47]);
        assert_eq!(canonical(&decoded), canonical(&a));
        assert_eq!(decoded.len(), 4);
    }

    #[test]
    fn decode_refuses_every_non_canonical_form() {
        let cases: [(&[u8], DecodeError); 10] = [
            (&[], DecodeError::Empty),
            (&[0x80], DecodeError::Truncated),
            (&[3], DecodeError::Truncated),                        // multi without its count
            (&[3, 1], DecodeError::BadCount),                      // "several" = 1
            (&[3, 0], DecodeError::BadCount),
            (&[2, 0], DecodeError::Unsorted),                      // second run, delta 0
            (&[0x82, 0x00], DecodeError::BadVarint),               // overlong 2
            (&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02], DecodeError::BadVarint),
            (&[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40], DecodeError::StampRange), // 2^55 >> 1
            (&[1, 0xff, 0xff, 0xff, 0xff, 0x0f], DecodeError::TooMany), // 2^32-1 entries
        ];
        for (bytes, expected) in cases {
            assert_eq!(RunLog::decode(bytes).unwrap_err(), expected, "{bytes:?}");
        }
        // The largest stamp and the largest count are accepted.
        let mut log = RunLog::default();
        log.record(MAX_EXACT_MS, MAX_ENTRIES);
        assert_eq!(RunLog::decode(&canonical(&log)).unwrap().runs().collect::<Vec<_>>(), [(MAX_EXACT_MS, MAX_ENTRIES)]);
        // ... and one past either is not.
        let mut over = Vec::new();
        put_run(&mut over, MAX_EXACT_MS as u64 + 1, 1);
        assert_eq!(RunLog::decode(&over).unwrap_err(), DecodeError::StampRange);
        let mut over = Vec::new();
        put_run(&mut over, 5, MAX_ENTRIES + 1);
        assert_eq!(RunLog::decode(&over).unwrap_err(), DecodeError::TooMany);
        // Trailing garbage is a truncated run, never ignored.
        let mut trailing = canonical(&log);
        trailing.push(0x80);
        assert_eq!(RunLog::decode(&trailing).unwrap_err(), DecodeError::Truncated);
    }

    #[test]
    fn trim_walks_only_the_expired_runs_and_drops_the_prefix() {
        let mut log = RunLog::default();
        for i in 0..1000 {
            log.record(i, 1);
        }
        assert_eq!(log.trim(499), 500);
        assert_eq!(log.len(), 500);
        assert!(log.bytes.len() <= 500, "the trimmed half was dropped: {}", log.bytes.len());
        assert_eq!(log.runs().next(), Some((500, 1)));
        assert_eq!(log.trim(999), 500);
        assert!(log.is_empty());
        assert_eq!(log.runs().count(), 0);
    }

    #[test]
    fn remove_at_takes_only_that_stamp_and_at_most_count() {
        let mut log = RunLog::default();
        for (stamp, cost) in [(10, 2), (20, 3), (30, 2)] {
            log.record(stamp, cost);
        }
        assert_eq!(log.remove_at(30, 1), 1, "newest run, O(1) path");
        assert_eq!(log.remove_at(20, 5), 3, "never more than the run holds");
        assert_eq!(log.remove_at(15, 1), 0);
        assert_eq!(log.remove_at(30, 1), 1, "empties the newest run");
        assert_eq!(stamps(&log), [10, 10]);
        assert_eq!(log.newest(), Some(10));
        assert_eq!(log.remove_at(10, 2), 2);
        assert!(log.is_empty());
    }

    /// The compact log answers every `Log` question exactly as the sorted
    /// reference does, over random operations, older stamps and refunds
    /// included; its canonical bytes decode back to the same entries.
    #[test]
    fn behaves_like_the_reference_log() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for round in 0..300 {
            let mut ours = RunLog::default();
            let mut reference = VecLog::default();
            let mut now: i64 = 1_000_000 + rng.below(1000) as i64;
            for _ in 0..(20 + round % 200) {
                now = match rng.below(10) {
                    0 => now,
                    1 => now - rng.below(50) as i64,          // a clock step back
                    2 => now + 1000 + rng.below(5000) as i64, // a long pause
                    _ => now + rng.below(70) as i64,
                };
                let cutoff = now - 1 - rng.below(2000) as i64;
                match rng.below(6) {
                    0 => assert_eq!(ours.trim(cutoff), reference.trim(cutoff)),
                    1 => {
                        let stamp = reference.0.get(rng.below(reference.0.len() as u64 + 1) as usize).copied().unwrap_or(now);
                        let count = 1 + rng.below(3);
                        let expected = {
                            let held = reference.0.iter().filter(|&&s| s == stamp).count() as u64;
                            let removed = held.min(count);
                            let mut left = removed;
                            reference.0.retain(|&s| !(s == stamp && left > 0 && { left -= 1; true }));
                            removed
                        };
                        assert_eq!(ours.remove_at(stamp, count), expected);
                    }
                    _ => {
                        let cost = 1 + rng.below(3);
                        ours.record(now, cost);
                        reference.record(now, cost);
                    }
                }
                assert_eq!(ours.len(), reference.len());
                assert_eq!(ours.count_expired(cutoff), reference.count_expired(cutoff));
                assert_eq!(ours.newest(), reference.newest());
                for n in [1, 2, 3, 7] {
                    assert_eq!(ours.nth_live(cutoff, n), reference.nth_live(cutoff, n), "n={n}");
                }
                assert_eq!(stamps(&ours), reference.0);
                if !ours.is_empty() {
                    let decoded = RunLog::decode(&canonical(&ours)).unwrap();
                    assert_eq!(stamps(&decoded), reference.0);
                }
            }
        }
    }
}
