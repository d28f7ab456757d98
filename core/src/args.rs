//! Strict parsing of an `XCLOAK.*` command line into a typed [`Request`],
//! from the grammar's tables ([`crate::grammar`]).
//!
//! Integers are parsed the way Redis parses them (`string2ll`): optional `-`,
//! then digits with no leading zero, no spaces, no `+`, no decimals, no hex, no
//! exponent, no overflow. An option is recognised by the token its command's
//! table declares, a value is checked against its arg's range there, and every
//! error names the arg and states that range (so the table, the parser and
//! `COMMAND DOCS` cannot disagree). Parsing happens before any key is touched,
//! so a bad call changes nothing.
//!
//! A call may limit several windows at once: the positional `window limit` is
//! tier 0, and each `TIER window limit` adds the next one (up to
//! [`MAX_TIERS`] in all). They are parsed into one list, [`Tiers`], that the
//! window logic walks; nothing downstream treats tier 0 apart.

use std::fmt;
use std::mem::MaybeUninit;

use crate::grammar::{self, Arg, Token};
pub use crate::grammar::{DEFAULT_MAX_LIMIT, MAX_COST, MAX_EXACT_MS, MAX_LIMIT_CEILING, MAX_LIMIT_FLOOR, MAX_TIERS};

/// A storage form of a window, by name: `STORAGE zset|compact` at load,
/// `xcloak.storage`, and `XCLOAK.CONVERT key ZSET|COMPACT` (any case).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    Zset,
    Compact,
}

impl Storage {
    pub fn parse(bytes: &[u8]) -> Option<Storage> {
        if bytes.eq_ignore_ascii_case(b"zset") {
            Some(Storage::Zset)
        } else if bytes.eq_ignore_ascii_case(b"compact") {
            Some(Storage::Compact)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Storage::Zset => "zset",
            Storage::Compact => "compact",
        }
    }
}

/// Parses `XCLOAK.CONVERT key ZSET|COMPACT` (the command name first).
pub fn parse_convert(argv: &[&[u8]]) -> Result<Storage, ArgError> {
    if !arity_fits(&grammar::CONVERT, argv) {
        return Err(ArgError::Arity);
    }
    let target = &grammar::TARGET;
    Storage::parse(argv[2]).ok_or_else(|| {
        invalid(format!(
            "{} must be {} (got '{}')",
            target.name,
            grammar::either(target.choices()),
            printable(argv[2])
        ))
    })
}

/// Which command is being parsed: they share a grammar but not every option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Allow,
    Peek,
}

impl Command {
    /// Its table.
    pub fn grammar(self) -> &'static grammar::Command {
        match self {
            Command::Allow => &grammar::ALLOW,
            Command::Peek => &grammar::PEEK,
        }
    }
}

/// Whether `argv` (the command name first) has as many words as `command`'s
/// arity asks: exactly, or at least when the arity is negative.
fn arity_fits(command: &grammar::Command, argv: &[&[u8]]) -> bool {
    let words = command.arity.unsigned_abs() as usize;
    if command.arity < 0 {
        argv.len() >= words
    } else {
        argv.len() == words
    }
}

/// One window and its limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tier {
    pub window_ms: i64,
    pub limit: i64,
}

/// The tiers of a call, in the order given (tier 0 is the positional pair).
/// A fixed array: parsing a call allocates nothing, and writes only the tiers
/// given (zeroing all 16 took two instruction-cache lines of every call).
#[derive(Clone, Copy)]
pub struct Tiers {
    /// The first `len` are written.
    items: [MaybeUninit<Tier>; MAX_TIERS],
    len: usize,
}

impl Tiers {
    /// The single tier of a call without `TIER`.
    pub fn one(tier: Tier) -> Tiers {
        let mut items = [MaybeUninit::uninit(); MAX_TIERS];
        items[0] = MaybeUninit::new(tier);
        Tiers { items, len: 1 }
    }

    /// Adds a tier; false when the list is full.
    pub fn push(&mut self, tier: Tier) -> bool {
        if self.len == MAX_TIERS {
            return false;
        }
        self.items[self.len] = MaybeUninit::new(tier);
        self.len += 1;
        true
    }

    pub fn as_slice(&self) -> &[Tier] {
        // SAFETY: the first `len` items are written (`one`, `push`), and
        // MaybeUninit<Tier> has Tier's layout.
        unsafe { std::slice::from_raw_parts(self.items.as_ptr() as *const Tier, self.len) }
    }

    /// Whether `TIER` was given: the replies then carry the per-tier array.
    pub fn is_tiered(&self) -> bool {
        self.len > 1
    }

    /// The longest window: what is trimmed, and what the TTL follows.
    pub fn longest_window_ms(&self) -> i64 {
        self.as_slice().iter().map(|tier| tier.window_ms).max().unwrap_or(0)
    }
}

impl std::ops::Deref for Tiers {
    type Target = [Tier];
    fn deref(&self) -> &[Tier] {
        self.as_slice()
    }
}

impl PartialEq for Tiers {
    fn eq(&self, other: &Tiers) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Tiers {}

impl fmt::Debug for Tiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// A fully validated call. `now_ms` is `None` when the server clock is to be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub tiers: Tiers,
    pub cost: i64,
    pub now_ms: Option<i64>,
    pub details: bool,
    /// `STAMP`: reply the admission's stamp (ALLOW only).
    pub stamp: bool,
    /// `OLDEST`: reply the stamp of the oldest entry live in the binding
    /// tier's window (PEEK only).
    pub oldest: bool,
}

/// A validated `XCLOAK.REFUND key stamp [COST cost]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refund {
    pub stamp_ms: i64,
    pub cost: i64,
}

/// A parse failure. `Arity` maps to Redis' standard wrong-arity error; the
/// other variants carry the full error text (without the `ERR ` prefix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgError {
    Arity,
    Invalid(String),
}

/// Parses `argv` (the command name first, then the key) of XCLOAK.ALLOW or XCLOAK.PEEK.
pub fn parse(command: Command, argv: &[&[u8]], max_limit: i64) -> Result<Request, ArgError> {
    let grammar = command.grammar();
    if !arity_fits(grammar, argv) {
        return Err(ArgError::Arity);
    }
    let first = parse_tier([&grammar::WINDOW, &grammar::LIMIT], argv[2], argv[3], max_limit, None)?;
    let mut request = Request {
        tiers: Tiers::one(first),
        cost: 1,
        now_ms: None,
        details: false,
        stamp: false,
        oldest: false,
    };

    let (mut seen_cost, mut seen_now) = (false, false);
    let mut rest = argv[4..].iter();
    while let Some(word) = rest.next() {
        let (token, arg) = grammar.option(word).ok_or_else(|| unknown_option(word, grammar))?;
        let seen = match token {
            Token::Tier => {
                let (Some(window), Some(limit)) = (rest.next(), rest.next()) else {
                    return Err(invalid(format!(
                        "syntax error, {} needs {}",
                        arg.label(),
                        block_words(arg)
                    )));
                };
                let members = arg.block();
                let tier = parse_tier(
                    [&members[0], &members[1]],
                    window,
                    limit,
                    max_limit,
                    Some((arg.label(), request.tiers.len())),
                )?;
                if !request.tiers.push(tier) {
                    return Err(invalid(format!(
                        "syntax error, {} is given more than {} times (at most {} {}s in all)",
                        arg.label(),
                        arg.times,
                        arg.times + 1,
                        arg.name
                    )));
                }
                continue;
            }
            Token::Cost => &mut seen_cost,
            Token::Now => &mut seen_now,
            Token::Details => &mut request.details,
            Token::Stamp => &mut request.stamp,
            Token::Oldest => &mut request.oldest,
        };
        if *seen {
            return Err(repeated(arg));
        }
        *seen = true;
        let mut value = || rest.next().copied().ok_or_else(|| needs_value(arg));
        match token {
            Token::Cost => request.cost = parse_arg(value()?, arg, max_limit)?,
            Token::Now => request.now_ms = Some(parse_arg(value()?, arg, max_limit)?),
            Token::Details | Token::Stamp | Token::Oldest | Token::Tier => {}
        }
    }
    Ok(request)
}

/// Parses `XCLOAK.REFUND key stamp [COST cost]` (the command name first).
pub fn parse_refund(argv: &[&[u8]]) -> Result<Refund, ArgError> {
    let grammar = &grammar::REFUND;
    if !arity_fits(grammar, argv) {
        return Err(ArgError::Arity);
    }
    let stamp = &grammar::REFUND_STAMP;
    let stamp_ms = parse_arg(argv[2], stamp, DEFAULT_MAX_LIMIT)?;
    let mut refund = Refund { stamp_ms, cost: 1 };
    let mut seen_cost = false;
    let mut rest = argv[3..].iter();
    while let Some(word) = rest.next() {
        match grammar.option(word) {
            Some((Token::Cost, arg)) => {
                if seen_cost {
                    return Err(repeated(arg));
                }
                seen_cost = true;
                let value = rest.next().ok_or_else(|| needs_value(arg))?;
                refund.cost = parse_arg(value, arg, DEFAULT_MAX_LIMIT)?;
            }
            _ => return Err(unknown_option(word, grammar)),
        }
    }
    Ok(refund)
}

/// The `window limit` pair of a tier, by the args that declare them. Tier 0
/// (`tier: None`) is the positional pair, named as in a call without `TIER`;
/// tier `n` is `Some((TIER, n))`, its errors naming it (`window of TIER 2 ...`).
/// Inlined: the args are constants of the table, so their ranges fold into
/// the comparisons, as literals would.
#[inline(always)]
fn parse_tier(
    [window_arg, limit_arg]: [&Arg; 2],
    window: &[u8],
    limit: &[u8],
    max_limit: i64,
    tier: Option<(&str, usize)>,
) -> Result<Tier, ArgError> {
    // Built on the error path only: a valid call allocates nothing.
    let name = |arg: &Arg| match tier {
        None => arg.label().to_string(),
        Some((token, number)) => format!("{} of {token} {number}", arg.label()),
    };
    let window_ms =
        checked(window, window_arg, max_limit).ok_or_else(|| out_of_range(window_arg, &name(window_arg), max_limit))?;
    let limit =
        checked(limit, limit_arg, max_limit).ok_or_else(|| out_of_range(limit_arg, &name(limit_arg), max_limit))?;
    Ok(Tier { window_ms, limit })
}

/// `a window and a limit`: what a block's token needs after it.
fn block_words(arg: &Arg) -> String {
    let words: Vec<String> = arg.block().iter().map(|member| format!("a {}", member.name)).collect();
    words.join(" and ")
}

fn repeated(arg: &Arg) -> ArgError {
    invalid(format!("syntax error, {} is given more than once", arg.label()))
}

fn needs_value(arg: &Arg) -> ArgError {
    invalid(format!("syntax error, {} needs a value", arg.label()))
}

fn invalid(message: String) -> ArgError {
    ArgError::Invalid(message)
}

fn unknown_option(option: &[u8], grammar: &grammar::Command) -> ArgError {
    invalid(format!(
        "syntax error, unknown option '{}' (expected {})",
        printable(option),
        grammar.expected_options()
    ))
}

/// The error of `arg`'s value out of its range, or not an integer at all,
/// naming it `label`.
fn out_of_range(arg: &Arg, label: &str, max_limit: i64) -> ArgError {
    match arg.range() {
        Some(range) => invalid(range.error(label, max_limit)),
        None => invalid(format!("{label} must be an integer")),
    }
}

/// The integer in `bytes` if it is one and lies in `arg`'s range.
#[inline(always)]
fn checked(bytes: &[u8], arg: &Arg, max_limit: i64) -> Option<i64> {
    let range = arg.range()?;
    parse_i64(bytes).filter(|value| (range.min..=range.max(max_limit)).contains(value))
}

/// The value of `arg` (REFUND's ranges do not depend on `max_limit`).
#[inline(always)]
fn parse_arg(bytes: &[u8], arg: &Arg, max_limit: i64) -> Result<i64, ArgError> {
    checked(bytes, arg, max_limit).ok_or_else(|| out_of_range(arg, arg.label(), max_limit))
}

/// Parses an integer exactly as Redis' `string2ll` accepts it. Not inlined:
/// one copy serves every integer argument of a call.
#[inline(never)]
pub fn parse_i64(bytes: &[u8]) -> Option<i64> {
    let (negative, digits) = match bytes {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, bytes),
    };
    match digits {
        [b'0'] if !negative => return Some(0),
        [b'1'..=b'9', ..] => {}
        _ => return None,
    }
    // Accumulate negatively so that i64::MIN parses without overflow.
    let mut value: i64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_sub(i64::from(digit - b'0'))?;
    }
    if negative {
        Some(value)
    } else {
        value.checked_neg()
    }
}

/// A user-supplied token made safe to echo in an error line: printable ASCII
/// only (no CR/LF that would break the protocol), and short.
fn printable(bytes: &[u8]) -> String {
    const MAX_ECHO: usize = 32;
    let mut text: String = bytes
        .iter()
        .take(MAX_ECHO)
        .map(|&b| {
            if (0x20..0x7f).contains(&b) && b != b'\'' {
                b as char
            } else {
                '?'
            }
        })
        .collect();
    if bytes.len() > MAX_ECHO {
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Vec<u8>> {
        line.split(' ').map(|s| s.as_bytes().to_vec()).collect()
    }

    fn run(command: Command, line: &str) -> Result<Request, ArgError> {
        let owned = args(line);
        let argv: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        parse(command, &argv, DEFAULT_MAX_LIMIT)
    }

    fn error_text(command: Command, line: &str) -> String {
        match run(command, line) {
            Err(ArgError::Invalid(text)) => text,
            other => panic!("expected an error for {line:?}, got {other:?}"),
        }
    }

    #[test]
    fn integers_follow_redis_string2ll() {
        for good in ["0", "1", "42", "-7", "9223372036854775807", "-9223372036854775808"] {
            assert_eq!(parse_i64(good.as_bytes()), good.parse::<i64>().ok(), "{good}");
        }
        for bad in [
            "",
            "-",
            "+1",
            " 1",
            "1 ",
            "01",
            "-0",
            "00",
            "1.0",
            "1e3",
            "0x10",
            "9223372036854775808",
            "-9223372036854775809",
            "١",
            "1_000",
        ] {
            assert_eq!(parse_i64(bad.as_bytes()), None, "{bad:?} must be rejected");
        }
    }

    #[test]
    fn minimal_call_uses_defaults() {
        let request = run(Command::Allow, "XCLOAK.ALLOW k 1000 10").unwrap();
        assert_eq!(
            request,
            Request {
                tiers: Tiers::one(Tier {
                    window_ms: 1000,
                    limit: 10
                }),
                cost: 1,
                now_ms: None,
                details: false,
                stamp: false,
                oldest: false
            }
        );
        assert!(!request.tiers.is_tiered());
    }

    #[test]
    fn options_in_any_order_and_any_case() {
        let a = run(Command::Allow, "XCLOAK.ALLOW k 5 3 cost 2 NOW 77 details").unwrap();
        let b = run(Command::Allow, "XCLOAK.ALLOW k 5 3 DETAILS now 77 Cost 2").unwrap();
        assert_eq!(a, b);
        assert_eq!((a.cost, a.now_ms, a.details), (2, Some(77), true));
    }

    #[test]
    fn range_edges() {
        assert!(run(Command::Allow, "X k 9007199254740991 1000000 NOW 9007199254740991").is_ok());
        assert!(run(Command::Allow, "X k 1 0 NOW 0").is_ok());
        assert!(error_text(Command::Allow, "X k 0 1").starts_with("window must be"));
        assert!(error_text(Command::Allow, "X k 9007199254740992 1").starts_with("window must be"));
        assert!(error_text(Command::Allow, "X k 1 1000001").starts_with("limit must be"));
        assert!(error_text(Command::Allow, "X k 1 -1").starts_with("limit must be"));
        assert!(error_text(Command::Allow, "X k 1 1 NOW -1").starts_with("NOW must be"));
        assert!(error_text(Command::Allow, "X k 1 1 COST 0").starts_with("COST must be"));
        assert!(error_text(Command::Allow, "X k 1 1 COST 1000001").starts_with("COST must be"));
    }

    #[test]
    fn max_limit_is_a_parameter() {
        let owned = args("X k 10 50");
        let argv: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        assert!(parse(Command::Allow, &argv, 50).is_ok());
        assert_eq!(
            parse(Command::Allow, &argv, 49),
            Err(ArgError::Invalid("limit must be an integer from 0 to 49".into()))
        );
    }

    #[test]
    fn grammar_errors() {
        assert_eq!(run(Command::Allow, "X k 10"), Err(ArgError::Arity));
        assert!(error_text(Command::Allow, "X k 1 1 NOW").contains("NOW needs a value"));
        assert!(error_text(Command::Allow, "X k 1 1 NOW 1 now 2").contains("NOW is given more than once"));
        assert!(error_text(Command::Allow, "X k 1 1 DETAILS DETAILS").contains("more than once"));
        assert!(error_text(Command::Allow, "X k 1 1 FOO").contains("unknown option 'FOO'"));
        assert!(error_text(Command::Peek, "X k 1 1 DETAILS").contains("expected TIER, COST, NOW or OLDEST"));
        assert!(error_text(Command::Allow, "X k 1 1 FOO").contains("expected TIER, COST, NOW, DETAILS or STAMP"));
        assert!(error_text(Command::Peek, "X k 1 1 STAMP")
            .contains("unknown option 'STAMP' (expected TIER, COST, NOW or OLDEST)"));
        assert!(run(Command::Peek, "X k 1 1 oldest").unwrap().oldest);
        assert!(!run(Command::Peek, "X k 1 1").unwrap().oldest);
        assert!(error_text(Command::Peek, "X k 1 1 OLDEST OLDEST").contains("OLDEST is given more than once"));
        assert!(error_text(Command::Allow, "X k 1 1 OLDEST")
            .contains("unknown option 'OLDEST' (expected TIER, COST, NOW, DETAILS or STAMP)"));
        assert!(error_text(Command::Allow, "X k 1 1 STAMP stamp").contains("STAMP is given more than once"));
        assert!(run(Command::Allow, "X k 1 1 stamp DETAILS").unwrap().stamp);
        assert!(!run(Command::Allow, "X k 1 1 DETAILS").unwrap().stamp);
    }

    fn tiers(request: &Request) -> Vec<(i64, i64)> {
        request.tiers.iter().map(|t| (t.window_ms, t.limit)).collect()
    }

    #[test]
    fn tiers_in_order_given_anywhere_among_the_options() {
        let a = run(Command::Allow, "X k 1000 10 TIER 60000 100 COST 2 tier 5 1 DETAILS").unwrap();
        let b = run(Command::Allow, "X k 1000 10 COST 2 TIER 60000 100 DETAILS TIER 5 1").unwrap();
        assert_eq!(a, b);
        assert_eq!(tiers(&a), [(1000, 10), (60000, 100), (5, 1)]);
        assert!(a.tiers.is_tiered());
        assert_eq!(a.tiers.longest_window_ms(), 60000);
        assert_eq!((a.cost, a.details), (2, true));
        // The same tier twice is allowed (it changes nothing).
        assert_eq!(
            tiers(&run(Command::Peek, "X k 5 1 TIER 5 1").unwrap()),
            [(5, 1), (5, 1)]
        );
    }

    #[test]
    fn at_most_sixteen_tiers() {
        let fifteen = " TIER 2 2".repeat(15);
        let request = run(Command::Peek, &format!("X k 1 1{fifteen}")).unwrap();
        assert_eq!(request.tiers.len(), MAX_TIERS);
        assert_eq!(
            error_text(Command::Peek, &format!("X k 1 1{fifteen} TIER 3 3")),
            "syntax error, TIER is given more than 15 times (at most 16 tiers in all)"
        );
    }

    #[test]
    fn tier_errors_name_the_tier_and_the_range() {
        assert_eq!(
            error_text(Command::Allow, "X k 1 1 TIER 0 5"),
            "window of TIER 1 must be an integer from 1 to 9007199254740991 (milliseconds)"
        );
        assert_eq!(
            error_text(Command::Allow, "X k 1 1 TIER 10 5 TIER 10 -1"),
            "limit of TIER 2 must be an integer from 0 to 1000000"
        );
        assert_eq!(
            error_text(Command::Allow, "X k 1 1 TIER 10"),
            "syntax error, TIER needs a window and a limit"
        );
        assert_eq!(
            error_text(Command::Peek, "X k 1 1 TIER"),
            "syntax error, TIER needs a window and a limit"
        );
        // An option word in a value's place is read as the value.
        assert_eq!(
            error_text(Command::Allow, "X k 1 1 TIER 10 COST 2"),
            "limit of TIER 1 must be an integer from 0 to 1000000"
        );
        // Tier 0 keeps the texts of a call without TIER.
        assert_eq!(
            error_text(Command::Allow, "X k 0 1 TIER 10 5"),
            "window must be an integer from 1 to 9007199254740991 (milliseconds)"
        );
        let owned = args("X k 10 5 TIER 20 51");
        let argv: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        assert_eq!(
            parse(Command::Allow, &argv, 50),
            Err(ArgError::Invalid(
                "limit of TIER 1 must be an integer from 0 to 50".into()
            ))
        );
    }

    #[test]
    fn convert_grammar() {
        let parse = |line: &str| {
            let owned = args(line);
            let argv: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
            parse_convert(&argv)
        };
        assert_eq!(parse("XCLOAK.CONVERT k compact"), Ok(Storage::Compact));
        assert_eq!(parse("XCLOAK.CONVERT k ZSET"), Ok(Storage::Zset));
        assert_eq!(parse("XCLOAK.CONVERT k"), Err(ArgError::Arity));
        assert_eq!(parse("XCLOAK.CONVERT k zset x"), Err(ArgError::Arity));
        assert_eq!(
            parse("XCLOAK.CONVERT k list"),
            Err(ArgError::Invalid("target must be ZSET or COMPACT (got 'list')".into()))
        );
    }

    fn refund(line: &str) -> Result<Refund, ArgError> {
        let owned = args(line);
        let argv: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        parse_refund(&argv)
    }

    #[test]
    fn refund_grammar() {
        assert_eq!(
            refund("R k 1700000000000"),
            Ok(Refund {
                stamp_ms: 1_700_000_000_000,
                cost: 1
            })
        );
        assert_eq!(
            refund("R k 0 cost 1000000"),
            Ok(Refund {
                stamp_ms: 0,
                cost: 1_000_000
            })
        );
        assert_eq!(
            refund("R k 9007199254740991 COST 1"),
            Ok(Refund {
                stamp_ms: MAX_EXACT_MS,
                cost: 1
            })
        );
        assert_eq!(refund("R k"), Err(ArgError::Arity));
        let stamp = "stamp must be an integer from 0 to 9007199254740991 (unix time in milliseconds)";
        for bad in ["R k -1", "R k 9007199254740992", "R k 1.5", "R k x", "R k 01", "R k  1"] {
            assert_eq!(refund(bad), Err(ArgError::Invalid(stamp.into())), "{bad}");
        }
        let cost = "COST must be an integer from 1 to 1000000";
        for bad in ["R k 5 COST 0", "R k 5 COST 1000001", "R k 5 COST -1", "R k 5 COST NOW"] {
            assert_eq!(refund(bad), Err(ArgError::Invalid(cost.into())), "{bad}");
        }
        assert_eq!(
            refund("R k 5 COST"),
            Err(ArgError::Invalid("syntax error, COST needs a value".into()))
        );
        assert_eq!(
            refund("R k 5 COST 1 cost 2"),
            Err(ArgError::Invalid("syntax error, COST is given more than once".into()))
        );
        for (bad, token) in [
            ("R k 5 NOW 1", "NOW"),
            ("R k 5 STAMP", "STAMP"),
            ("R k 5 COST 1 2", "2"),
            ("R k 5 TIER 1 1", "TIER"),
        ] {
            let expected = format!("syntax error, unknown option '{token}' (expected COST)");
            assert_eq!(refund(bad), Err(ArgError::Invalid(expected)), "{bad}");
        }
    }

    #[test]
    fn echoed_tokens_cannot_break_the_protocol() {
        let text = error_text(Command::Allow, "X k 1 1 A\r\nB");
        assert!(!text.contains('\r') && !text.contains('\n'), "{text:?}");
    }
}
