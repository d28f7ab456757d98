//! Encoding version 2 (what RDB and DUMP carry): groups of runs, each written
//! as a block with the smallest widths.

use super::*;
use crate::args::MAX_EXACT_MS;

impl RunLog {
    // -- Version 2: groups of runs, each written as a block.

    /// The canonical bytes of this window in encoding version 2.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut group: Vec<(i64, u64)> = Vec::with_capacity(BLOCK_RUNS as usize);
        let mut runs = self.runs().peekable();
        while let Some(first) = runs.next() {
            group.clear();
            group.push(first);
            while group.len() < BLOCK_RUNS as usize {
                match runs.peek() {
                    Some(&(stamp, _)) if (stamp - first.0) as u64 <= MAX_SPAN => group.push(runs.next().unwrap()),
                    _ => break,
                }
            }
            put_group(out, &group);
        }
    }

    /// The window whose version 2 canonical bytes these are, or why they are none.
    pub fn decode(bytes: &[u8]) -> Result<RunLog, DecodeError> {
        let mut runs: Vec<(i64, u64)> = Vec::new();
        let mut total: u64 = 0;
        let mut pos = 0;
        while pos < bytes.len() {
            let header_bytes = bytes.get(pos..pos + HEADER_BYTES).ok_or(DecodeError::Truncated)?;
            let header = Header::read(header_bytes);
            if header.tag != 0
                || header.class != 0
                || header.dead != 0
                || header.runs == 0
                || header.runs > BLOCK_RUNS
                || header.dw > SPAN_BITS
                || header.cw > ENTRIES_BITS
            {
                return Err(DecodeError::BadGroup);
            }
            let slots = header.layout();
            let end = pos + slots.bytes(header.runs);
            let data = bytes.get(pos..end).ok_or(DecodeError::Truncated)?;
            if header.last_ms() > MAX_EXACT_MS {
                return Err(DecodeError::StampRange);
            }
            if runs.last().is_some_and(|&(last, _)| last >= header.first_ms) {
                return Err(DecodeError::Unsorted);
            }
            let mut entries = 0u64;
            let mut last_ms = header.first_ms;
            for (stamp_ms, count) in BlockRuns::new(&header, data) {
                if stamp_ms > header.last_ms() {
                    return Err(DecodeError::BadGroup);
                }
                entries += count;
                total = total
                    .checked_add(count)
                    .filter(|&t| t <= MAX_ENTRIES)
                    .ok_or(DecodeError::TooMany)?;
                runs.push((stamp_ms, count));
                last_ms = stamp_ms;
            }
            if last_ms != header.last_ms() || (header.cw > 0 && get_bits(data, DATA_BITS, ENTRIES_BITS) != entries) {
                return Err(DecodeError::BadGroup);
            }
            pos = end;
        }
        if runs.is_empty() {
            return Err(DecodeError::Empty);
        }
        let log = RunLog::from_runs(runs);
        let mut canonical = Vec::with_capacity(bytes.len());
        log.encode(&mut canonical);
        if canonical != bytes {
            return Err(DecodeError::NotCanonical);
        }
        Ok(log)
    }
}

/// Writes one group (at most BLOCK_RUNS runs, span <= MAX_SPAN) as a block
/// with the smallest widths: the canonical layout of version 2.
pub(crate) fn put_group(out: &mut Vec<u8>, group: &[(i64, u64)]) {
    let first_ms = group[0].0;
    let mut slots = Slots { dw: 0, cw: 0 };
    let mut entries = 0;
    for (i, &(stamp, count)) in group.iter().enumerate() {
        if i > 0 {
            slots.dw = slots.dw.max(width_of((stamp - group[i - 1].0) as u64 - 1));
        }
        slots.cw = slots.cw.max(width_of(count - 1));
        entries += count;
    }
    let runs = group.len() as u32;
    let header = Header {
        first_ms,
        dw: slots.dw,
        cw: slots.cw,
        tag: 0,
        class: 0,
        runs,
        dead: 0,
        span: (group[runs as usize - 1].0 - first_ms) as u64,
    };
    let start = out.len();
    out.resize(start + slots.bytes(runs), 0);
    header.write(&mut out[start..start + HEADER_BYTES]);
    let data = &mut out[start..];
    if slots.cw > 0 {
        set_bits(data, DATA_BITS, ENTRIES_BITS, entries);
    }
    for (i, &(stamp, count)) in group.iter().enumerate() {
        if i > 0 {
            set_bits(
                data,
                slots.gap_pos(i as u32),
                slots.dw,
                (stamp - group[i - 1].0) as u64 - 1,
            );
        }
        set_bits(data, slots.count_pos(i as u32), slots.cw, count - 1);
    }
}
