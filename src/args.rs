//! Strict parsing of an `XCLOAK.*` command line into a typed [`Request`].
//!
//! Integers are parsed the way Redis parses them (`string2ll`): optional `-`,
//! then digits with no leading zero, no spaces, no `+`, no decimals, no hex, no
//! exponent, no overflow. Every error names the argument and its valid range,
//! and parsing happens before any key is touched, so a bad call changes nothing.

/// Largest integer a sorted-set score (an IEEE double) holds exactly: 2^53 - 1.
pub const MAX_EXACT_MS: i64 = 9_007_199_254_740_991;
/// Default upper bound of `limit` (configurable with `MAX-LIMIT` / `xcloak.max-limit`).
pub const DEFAULT_MAX_LIMIT: i64 = 1_000_000;
/// Upper bound of `COST`.
pub const MAX_COST: i64 = 1_000_000;
/// Largest value `MAX-LIMIT` may be configured to.
pub const MAX_LIMIT_CEILING: i64 = 1_000_000_000;

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
    if argv.len() != 3 {
        return Err(ArgError::Arity);
    }
    Storage::parse(argv[2]).ok_or_else(|| {
        invalid(format!("target must be ZSET or COMPACT (got '{}')", printable(argv[2])))
    })
}

/// Which command is being parsed: they share a grammar but not every option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Allow,
    Peek,
}

/// A fully validated call. `now_ms` is `None` when the server clock is to be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub window_ms: i64,
    pub limit: i64,
    pub cost: i64,
    pub now_ms: Option<i64>,
    pub details: bool,
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
    if argv.len() < 4 {
        return Err(ArgError::Arity);
    }
    let window_ms = parse_in_range(argv[2], "window", 1, MAX_EXACT_MS, " (milliseconds)")?;
    let limit = parse_in_range(argv[3], "limit", 0, max_limit, "")?;
    let mut request = Request { window_ms, limit, cost: 1, now_ms: None, details: false };

    let (mut seen_cost, mut seen_now) = (false, false);
    let mut rest = argv[4..].iter();
    while let Some(option) = rest.next() {
        let name = Option_::from_bytes(option, command)
            .ok_or_else(|| unknown_option(option, command))?;
        let seen = match name {
            Option_::Cost => &mut seen_cost,
            Option_::Now => &mut seen_now,
            Option_::Details => &mut request.details,
        };
        if *seen {
            return Err(invalid(format!("syntax error, {} is given more than once", name.label())));
        }
        *seen = true;
        let mut value = || {
            rest.next().copied().ok_or_else(|| {
                invalid(format!("syntax error, {} needs a value", name.label()))
            })
        };
        match name {
            Option_::Cost => request.cost = parse_in_range(value()?, "COST", 1, MAX_COST, "")?,
            Option_::Now => {
                request.now_ms =
                    Some(parse_in_range(value()?, "NOW", 0, MAX_EXACT_MS, " (unix time in milliseconds)")?)
            }
            Option_::Details => {}
        }
    }
    Ok(request)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Option_ {
    Cost,
    Now,
    Details,
}

impl Option_ {
    fn from_bytes(bytes: &[u8], command: Command) -> Option<Self> {
        if bytes.eq_ignore_ascii_case(b"COST") {
            Some(Option_::Cost)
        } else if bytes.eq_ignore_ascii_case(b"NOW") {
            Some(Option_::Now)
        } else if bytes.eq_ignore_ascii_case(b"DETAILS") && command == Command::Allow {
            Some(Option_::Details)
        } else {
            None
        }
    }

    fn label(self) -> &'static str {
        match self {
            Option_::Cost => "COST",
            Option_::Now => "NOW",
            Option_::Details => "DETAILS",
        }
    }
}

fn invalid(message: String) -> ArgError {
    ArgError::Invalid(message)
}

fn unknown_option(option: &[u8], command: Command) -> ArgError {
    let expected = match command {
        Command::Allow => "COST, NOW or DETAILS",
        Command::Peek => "COST or NOW",
    };
    invalid(format!("syntax error, unknown option '{}' (expected {expected})", printable(option)))
}

/// Error text for an integer argument out of its range, or not an integer at all.
pub fn range_error(name: &str, min: i64, max: i64, unit: &str) -> ArgError {
    invalid(format!("{name} must be an integer from {min} to {max}{unit}"))
}

fn parse_in_range(bytes: &[u8], name: &str, min: i64, max: i64, unit: &str) -> Result<i64, ArgError> {
    match parse_i64(bytes) {
        Some(value) if (min..=max).contains(&value) => Ok(value),
        _ => Err(range_error(name, min, max, unit)),
    }
}

/// Parses an integer exactly as Redis' `string2ll` accepts it.
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
        .map(|&b| if (0x20..0x7f).contains(&b) && b != b'\'' { b as char } else { '?' })
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
            "", "-", "+1", " 1", "1 ", "01", "-0", "00", "1.0", "1e3", "0x10", "9223372036854775808",
            "-9223372036854775809", "١", "1_000",
        ] {
            assert_eq!(parse_i64(bad.as_bytes()), None, "{bad:?} must be rejected");
        }
    }

    #[test]
    fn minimal_call_uses_defaults() {
        let request = run(Command::Allow, "XCLOAK.ALLOW k 1000 10").unwrap();
        assert_eq!(
            request,
            Request { window_ms: 1000, limit: 10, cost: 1, now_ms: None, details: false }
        );
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
        assert!(error_text(Command::Peek, "X k 1 1 DETAILS").contains("expected COST or NOW"));
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

    #[test]
    fn echoed_tokens_cannot_break_the_protocol() {
        let text = error_text(Command::Allow, "X k 1 1 A\r\nB");
        assert!(!text.contains('\r') && !text.contains('\n'), "{text:?}");
    }
}
