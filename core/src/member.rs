//! The members of a sorted-set window (shared with the article's script and
//! `src/lua/`): with `s = t mod 10^11` (the stamp's last 11 digits: a cycle
//! of 3.17 years), the `k`-th entry admitted at millisecond `t` is the
//! integer `s * 1000 + k` while `k < 1000`, and `"{s}:{k:010}"` beyond. The
//! integer has at most 14 digits: a listpack stores it as an 8-byte integer,
//! and a skiplist's string of it fits the allocator's 16-byte class. Both
//! forms sort by `k` among entries of equal score, so the last entry at `t`
//! tells the next free `k` (`src/store/zset.rs` explains the rest).

use crate::decimal::write_decimal;

/// Largest `k` stored in the compact integer form of a member.
const COMPACT_SLOTS: i64 = 1000;

/// Stamps enter members modulo this (their last 11 digits), see the file docs.
const STAMP_CYCLE_MS: i64 = 100_000_000_000;

/// Writes the member of slot `k` at `now_ms` into `buffer` (by hand: this
/// runs on every admission, and `core::fmt` costs more than the rest of it).
pub fn format_member(buffer: &mut [u8; 48], now_ms: i64, k: i64) -> &[u8] {
    let stamp = now_ms.rem_euclid(STAMP_CYCLE_MS);
    let len = if k < COMPACT_SLOTS {
        write_decimal(&mut buffer[..], (stamp * COMPACT_SLOTS + k) as u64, 1)
    } else {
        let stamp = write_decimal(&mut buffer[..], stamp as u64, 1);
        buffer[stamp] = b':';
        stamp + 1 + write_decimal(&mut buffer[stamp + 1..], k as u64, 10)
    };
    &buffer[..len]
}

/// The slot `k` of a member written at `now_ms` by this module, if it is one.
pub fn member_slot(member: &[u8], now_ms: i64) -> Option<i64> {
    let stamp = now_ms.rem_euclid(STAMP_CYCLE_MS);
    if let Some(colon) = member.iter().position(|&b| b == b':') {
        let (head, slot) = (&member[..colon], &member[colon + 1..]);
        if crate::args::parse_i64(head)? != stamp || slot.is_empty() || !slot.iter().all(u8::is_ascii_digit) {
            return None;
        }
        return std::str::from_utf8(slot).ok()?.parse().ok();
    }
    let value = crate::args::parse_i64(member)?;
    (value >= 0 && value / COMPACT_SLOTS == stamp).then_some(value % COMPACT_SLOTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(now_ms: i64, k: i64) -> String {
        let mut buffer = [0u8; 48];
        String::from_utf8(format_member(&mut buffer, now_ms, k).to_vec()).unwrap()
    }

    #[test]
    fn members_round_trip() {
        for now_ms in [0, 1, 999, 1_732_941_234_567, crate::args::MAX_EXACT_MS] {
            for k in [0, 1, 998, 999, 1000, 1001, 123_456, 999_999_999] {
                let text = member(now_ms, k);
                assert_eq!(member_slot(text.as_bytes(), now_ms), Some(k), "{text}");
                assert_eq!(member_slot(text.as_bytes(), now_ms + 1), None, "{text} is not of now+1");
            }
        }
    }

    #[test]
    fn members_are_unique_across_stamps_and_slots() {
        let mut seen = std::collections::HashSet::new();
        // Under Miri (some 10,000 times slower), fewer stamps and the slots
        // either side of 1,000 (where the member's shape changes).
        let (stamps_each, first_slots) = if cfg!(miri) { (3, 990) } else { (50, 0) };
        let stamps = (0..stamps_each)
            .chain(1_732_941_234_500..1_732_941_234_500 + stamps_each)
            .chain([99_999_999_999]);
        for now_ms in stamps {
            for k in (0..3).chain(first_slots.max(3)..1005).chain([99_999, 100_000]) {
                assert!(seen.insert(member(now_ms, k)), "duplicate at {now_ms}/{k}");
            }
        }
    }

    #[test]
    fn members_sort_by_slot_within_a_stamp() {
        let now_ms = 1_732_941_234_567;
        let texts: Vec<String> = [0, 1, 10, 999, 1000, 1001, 9999, 10_000, 1_000_000]
            .iter()
            .map(|&k| member(now_ms, k))
            .collect();
        let mut sorted = texts.clone();
        sorted.sort();
        assert_eq!(texts, sorted, "the last member at a score must carry the largest slot");
    }

    #[test]
    fn the_scripts_members_are_not_ours() {
        assert_eq!(member_slot(b"1000-5", 1000), None);
        assert_eq!(member_slot(b"1000:", 1000), None);
        assert_eq!(member_slot(b"-1000", 1000), None);
    }

    #[test]
    fn members_are_the_stamps_last_11_digits_then_the_slot() {
        for now_ms in [
            0,
            1,
            9,
            10,
            999,
            99_999_999_999,
            100_000_000_000,
            1_732_941_234_567,
            crate::args::MAX_EXACT_MS,
        ] {
            let stamp = now_ms % 100_000_000_000;
            for k in [
                0,
                1,
                9,
                10,
                999,
                1000,
                1001,
                123_456,
                999_999_999,
                1_000_000_000,
                12_345_678_901,
            ] {
                let expected = if k < 1000 {
                    format!("{}", stamp * 1000 + k)
                } else {
                    format!("{stamp}:{k:010}")
                };
                assert_eq!(member(now_ms, k), expected);
            }
        }
    }

    #[test]
    fn stamps_a_cycle_apart_share_members_and_nx_tells_them_apart() {
        // The price of 14 digits: the same member 10^11 ms (3.17 years) later.
        // Both can only be live together with a window over 3 years (or NOW
        // jumping by the cycle); ZADD NX then skips to the next free slot.
        assert_eq!(member(1, 5), member(100_000_000_001, 5));
        assert_eq!(member_slot(member(1, 5).as_bytes(), 100_000_000_001), Some(5));
    }

    #[test]
    fn compact_members_have_at_most_14_digits() {
        assert_eq!(member(1_732_941_234_567, 7), "32941234567007");
        for now_ms in [99_999_999_999, 1_799_999_999_999, crate::args::MAX_EXACT_MS] {
            assert!(member(now_ms, 999).len() <= 14, "{}", member(now_ms, 999));
        }
    }
}
