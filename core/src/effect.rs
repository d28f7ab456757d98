//! The compact form's replicated effect, as text: what one call did to a
//! window, with explicit values, in the single argument of
//! `XCLOAK.APPLY key <effect> [<canonical bytes>]`. Pure Rust (tested here).
//!
//! ```text
//! L                 load: replace the window with the canonical bytes that follow
//! T<cutoff>         trim: remove the entries stamped <= cutoff (may be negative)
//! R<stamp>*<count>  remove up to count entries stamped exactly stamp (a refund)
//! A<stamp>*<count>  add count entries stamped stamp
//! E<unix-ms>        set the key's expiry to this absolute time
//! ```
//!
//! Each at most once, written and applied in that order, e.g.
//! `T1700000000000A1700000060000*1E1796014829288`. One argument, not one per
//! value: a replicated command costs the server an allocation per argument,
//! and this one is sent for every admission.

use crate::args::{MAX_COST, MAX_EXACT_MS};
use crate::decimal::write_decimal;
use crate::log::MAX_ENTRIES;

/// One call's effect on a compact window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effect {
    pub load: bool,
    pub trim_cutoff_ms: Option<i64>,
    pub remove: Option<(i64, u64)>,
    pub add: Option<(i64, u64)>,
    pub expire_at_ms: Option<i64>,
}

/// Longest text an effect can take: five operations of at most 42 bytes.
pub const MAX_TEXT: usize = 1 + 21 + 2 * (1 + 20 + 1 + 20) + 1 + 20;

impl Effect {
    pub fn is_empty(&self) -> bool {
        *self == Effect::default()
    }

    /// Writes the text into `out`; returns its length.
    pub fn write(&self, out: &mut [u8; MAX_TEXT]) -> usize {
        let mut text = Writer { out, len: 0 };
        if self.load {
            text.byte(b'L');
        }
        if let Some(cutoff_ms) = self.trim_cutoff_ms {
            text.byte(b'T');
            text.number(cutoff_ms);
        }
        for (letter, op) in [(b'R', self.remove), (b'A', self.add)] {
            if let Some((stamp_ms, count)) = op {
                text.byte(letter);
                text.number(stamp_ms);
                text.byte(b'*');
                text.number(count as i64);
            }
        }
        if let Some(expire_at_ms) = self.expire_at_ms {
            text.byte(b'E');
            text.number(expire_at_ms);
        }
        text.len
    }

    /// Parses the text strictly: known letters, in order, each once, with
    /// integers in range (as Redis parses integers).
    pub fn parse(text: &[u8]) -> Result<Effect, String> {
        let mut effect = Effect::default();
        let mut rest = text;
        let mut last_order = 0;
        if rest.is_empty() {
            return Err("XCLOAK.APPLY effect is empty".to_string());
        }
        while let Some((&letter, tail)) = rest.split_first() {
            let order = match letter {
                b'L' => 1,
                b'T' => 2,
                b'R' => 3,
                b'A' => 4,
                b'E' => 5,
                _ => {
                    return Err(format!(
                        "XCLOAK.APPLY effect has an unknown operation at '{}'",
                        printable(rest)
                    ))
                }
            };
            if order <= last_order {
                return Err(
                    "XCLOAK.APPLY effect repeats an operation or has them out of order (L T R A E)".to_string(),
                );
            }
            last_order = order;
            let end = tail.iter().position(|b| b"LTRAE".contains(b)).unwrap_or(tail.len());
            let (value, next) = tail.split_at(end);
            rest = next;
            let integer = |bytes: &[u8], name: &str, min: i64, max: i64| {
                crate::args::parse_i64(bytes)
                    .filter(|v| (min..=max).contains(v))
                    .ok_or_else(|| format!("XCLOAK.APPLY effect: {name} must be an integer from {min} to {max}"))
            };
            let pair = |bytes: &[u8], max_count: i64| -> Result<(i64, u64), String> {
                let star = bytes
                    .iter()
                    .position(|&b| b == b'*')
                    .ok_or("XCLOAK.APPLY effect: a stamp needs *count")?;
                let stamp_ms = integer(&bytes[..star], "stamp", 0, MAX_EXACT_MS)?;
                let count = integer(&bytes[star + 1..], "count", 1, max_count)?;
                Ok((stamp_ms, count as u64))
            };
            match letter {
                b'L' if value.is_empty() => effect.load = true,
                b'L' => return Err("XCLOAK.APPLY effect: L takes no value".to_string()),
                b'T' => effect.trim_cutoff_ms = Some(integer(value, "trim cutoff", -MAX_EXACT_MS, MAX_EXACT_MS)?),
                b'R' => effect.remove = Some(pair(value, MAX_COST)?),
                b'A' => effect.add = Some(pair(value, MAX_ENTRIES as i64)?),
                _ => effect.expire_at_ms = Some(integer(value, "expiry", 0, i64::MAX / 2)?),
            }
        }
        Ok(effect)
    }
}

struct Writer<'a> {
    out: &'a mut [u8; MAX_TEXT],
    len: usize,
}

impl Writer<'_> {
    fn byte(&mut self, byte: u8) {
        self.out[self.len] = byte;
        self.len += 1;
    }

    fn number(&mut self, value: i64) {
        if value < 0 {
            self.byte(b'-');
        }
        self.len += write_decimal(&mut self.out[self.len..], value.unsigned_abs(), 1);
    }
}

fn printable(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(16)
        .map(|&b| {
            if b.is_ascii_graphic() && b != b'\'' {
                b as char
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(effect: &Effect) -> String {
        let mut out = [0u8; MAX_TEXT];
        let len = effect.write(&mut out);
        String::from_utf8(out[..len].to_vec()).unwrap()
    }

    #[test]
    fn writes_and_parses_back() {
        let every = Effect {
            load: true,
            trim_cutoff_ms: Some(-MAX_EXACT_MS),
            remove: Some((MAX_EXACT_MS, MAX_COST as u64)),
            add: Some((MAX_EXACT_MS, MAX_ENTRIES)),
            expire_at_ms: Some(i64::MAX / 2),
        };
        assert!(text(&every).len() <= MAX_TEXT);
        for effect in [
            every,
            Effect {
                trim_cutoff_ms: Some(1_700_000_000_000),
                add: Some((1_700_000_060_000, 1)),
                expire_at_ms: Some(1_796_014_829_288),
                ..Effect::default()
            },
            Effect {
                add: Some((0, 3)),
                ..Effect::default()
            },
            Effect {
                remove: Some((5, 2)),
                ..Effect::default()
            },
        ] {
            assert_eq!(Effect::parse(text(&effect).as_bytes()), Ok(effect), "{}", text(&effect));
        }
        assert_eq!(
            text(&Effect {
                trim_cutoff_ms: Some(1_700_000_000_000),
                add: Some((1_700_000_060_000, 1)),
                expire_at_ms: Some(1_796_014_829_288),
                ..Effect::default()
            }),
            "T1700000000000A1700000060000*1E1796014829288"
        );
    }

    #[test]
    fn refuses_anything_else() {
        for (bad, says) in [
            ("", "empty"),
            ("X5", "unknown operation at 'X5'"),
            ("A5", "needs *count"),
            ("A5*0", "count must be an integer from 1 to 1000000000"),
            ("R5*1000001", "count must be an integer from 1 to 1000000"),
            ("A-1*1", "stamp must be an integer from 0"),
            ("T1T2", "repeats"),
            ("A1*1T0", "out of order"),
            ("T01", "trim cutoff must be"),
            ("T", "trim cutoff must be"),
            ("L5", "L takes no value"),
            ("E-1", "expiry must be"),
            ("T9007199254740992", "trim cutoff must be"),
        ] {
            let error = Effect::parse(bad.as_bytes()).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
    }
}
