//! Encoding version 1 (0.1.0's RDB encoding; `XCLOAK.APPLY key L`, AOF
//! rewrites and DEBUG DIGEST): one varint run after another.

use super::*;
use crate::args::MAX_EXACT_MS;

impl RunLog {
    // -- Version 1: varint runs.

    /// The window's runs in encoding version 1 (what `XCLOAK.APPLY key L`,
    /// the AOF rewrite and DEBUG DIGEST carry).
    pub fn encode_runs(&self, out: &mut Vec<u8>) {
        let mut previous_ms = 0;
        for (stamp_ms, count) in self.runs() {
            put_run(out, (stamp_ms - previous_ms) as u64, count);
            previous_ms = stamp_ms;
        }
    }

    /// The window whose version 1 bytes these are, or why they are none.
    pub fn decode_runs(bytes: &[u8]) -> Result<RunLog, DecodeError> {
        let mut pos = 0;
        let mut stamp_ms: i64 = 0;
        let mut total: u64 = 0;
        let mut runs: Vec<(i64, u64)> = Vec::new();
        while pos < bytes.len() {
            let start = pos;
            let (delta, count) = read_run(bytes, &mut pos)?;
            if start > 0 && delta == 0 {
                return Err(DecodeError::Unsorted);
            }
            stamp_ms = i64::try_from(delta)
                .ok()
                .and_then(|delta| stamp_ms.checked_add(delta))
                .filter(|&stamp| stamp <= MAX_EXACT_MS)
                .ok_or(DecodeError::StampRange)?;
            total = total
                .checked_add(count)
                .filter(|&t| t <= MAX_ENTRIES)
                .ok_or(DecodeError::TooMany)?;
            runs.push((stamp_ms, count));
        }
        if total == 0 {
            return Err(DecodeError::Empty);
        }
        Ok(RunLog::from_runs(runs))
    }
}
