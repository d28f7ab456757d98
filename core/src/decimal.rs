//! Integers written in decimal by hand, for what runs on every call: the
//! members of a sorted-set window, the replicated effect text.

/// Writes `value` in decimal, zero-padded to `width` (<= 20) digits; returns
/// the length (by hand: this runs on every admission, and `core::fmt` costs
/// more than the rest of it). Two digits per step from a table, in a loop the
/// compiler cannot unroll (its trip count is unknown): the unrolled form of a
/// digit at a time was 1.3 KB, a dozen instruction-cache lines per admission.
pub fn write_decimal(out: &mut [u8], mut value: u64, width: usize) -> usize {
    const PAIRS: [u8; 200] = {
        let mut pairs = [0u8; 200];
        let mut i = 0;
        while i < 100 {
            pairs[2 * i] = b'0' + (i / 10) as u8;
            pairs[2 * i + 1] = b'0' + (i % 10) as u8;
            i += 1;
        }
        pairs
    };
    let digits = value.checked_ilog10().map_or(1, |log| log as usize + 1);
    let len = digits.max(width);
    let mut end = len;
    while value >= 100 {
        let pair = (value % 100) as usize * 2;
        value /= 100;
        out[end - 2..end].copy_from_slice(&PAIRS[pair..pair + 2]);
        end -= 2;
    }
    if value >= 10 {
        let pair = value as usize * 2;
        out[end - 2..end].copy_from_slice(&PAIRS[pair..pair + 2]);
        end -= 2;
    } else {
        out[end - 1] = b'0' + value as u8;
        end -= 1;
    }
    out[..end].fill(b'0');
    len
}

#[cfg(test)]
mod tests {
    use super::write_decimal;

    #[test]
    fn write_decimal_matches_format_at_every_length_and_width() {
        let mut values = vec![0u64, 1, 9, 10, 99, 100, 101, 999, 1000, u64::MAX, u64::MAX - 1, 1 << 53];
        let mut power = 1u64;
        while let Some(next) = power.checked_mul(10) {
            values.extend([power - 1, power, power + 1, next - 1]);
            power = next;
        }
        // Under Miri (some 10,000 times slower), every fifth value at three
        // widths: the same code, and no `unsafe` here to check.
        let (every, widths): (usize, &[usize]) = if cfg!(miri) {
            (5, &[1, 10, 20])
        } else {
            (1, &[1, 2, 5, 10, 13, 20])
        };
        for value in values.into_iter().step_by(every) {
            for &width in widths {
                let mut out = [b'x'; 24];
                let len = write_decimal(&mut out, value, width);
                assert_eq!(
                    &out[..len],
                    format!("{value:0width$}").as_bytes(),
                    "{value} at width {width}"
                );
                assert!(out[len..].iter().all(|&b| b == b'x'), "{value} wrote past its length");
            }
        }
    }
}
