//! Fuzz target: `args::parse` over arbitrary argument vectors.
//!
//! Input layout: byte 0 picks the command (bit 0) and the configured
//! MAX-LIMIT (bits 1..); the rest is split on b'\n' into argv (argv[0] is the
//! command name, argv[1] the key), so every other byte (\0, \r, 0xff...)
//! reaches the parser inside a token.
//!
//! Invariants: parse never panics; an accepted request is within every range
//! (every tier's window and limit, at most 16 tiers);
//! `parse_i64` accepts exactly the canonical decimal form of an i64 (what
//! Redis' string2ll accepts); an error names an argument or is a syntax error,
//! and its text cannot break the protocol (no CR/LF).
#![no_main]

use xcloak_core::args;

use args::{ArgError, Command, MAX_COST, MAX_EXACT_MS, MAX_TIERS};
use libfuzzer_sys::fuzz_target;

const MAX_LIMITS: [i64; 4] = [args::DEFAULT_MAX_LIMIT, 1, 50, args::MAX_LIMIT_CEILING];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let command = if selector & 1 == 0 {
        Command::Allow
    } else {
        Command::Peek
    };
    let max_limit = MAX_LIMITS[usize::from(selector >> 1) % MAX_LIMITS.len()];
    let argv: Vec<&[u8]> = rest.split(|&b| b == b'\n').collect();

    for token in &argv {
        check_integer(token);
    }

    match args::parse(command, &argv, max_limit) {
        Ok(request) => {
            let most = 4 + (MAX_TIERS - 1) * 3 + 6;
            assert!(argv.len() >= 4 && argv.len() <= most, "accepted {} words", argv.len());
            assert!((1..=MAX_TIERS).contains(&request.tiers.len()));
            for tier in request.tiers.iter() {
                assert!((1..=MAX_EXACT_MS).contains(&tier.window_ms));
                assert!((0..=max_limit).contains(&tier.limit));
            }
            // One TIER keyword per tier after the first.
            let keywords = argv[4..].iter().filter(|w| w.eq_ignore_ascii_case(b"TIER")).count();
            assert!(
                keywords >= request.tiers.len() - 1,
                "{keywords} TIER words, {} tiers",
                request.tiers.len()
            );
            assert!((1..=MAX_COST).contains(&request.cost));
            if let Some(now) = request.now_ms {
                assert!((0..=MAX_EXACT_MS).contains(&now));
            }
            assert!(!(request.details && command == Command::Peek), "PEEK has no DETAILS");
            assert!(!(request.stamp && command == Command::Peek), "PEEK has no STAMP");
            assert_eq!(args::parse_i64(argv[2]), Some(request.tiers[0].window_ms));
            assert_eq!(args::parse_i64(argv[3]), Some(request.tiers[0].limit));
        }
        Err(ArgError::Arity) => assert!(argv.len() < 4),
        Err(ArgError::Invalid(text)) => {
            assert!(argv.len() >= 4);
            assert!(
                !text.contains('\r') && !text.contains('\n') && !text.contains('\0'),
                "{text:?}"
            );
            assert!(
                ["window ", "limit ", "COST ", "NOW ", "syntax error"]
                    .iter()
                    .any(|p| text.starts_with(p)),
                "error names no argument: {text:?}"
            );
            assert!(text.len() < 200, "error text too long: {}", text.len());
        }
    }
});

/// `parse_i64` agrees with an independent oracle: a token is an integer iff it
/// is the canonical decimal rendering of some i64.
fn check_integer(token: &[u8]) {
    let parsed = args::parse_i64(token);
    let oracle = std::str::from_utf8(token)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|v| v.to_string().as_bytes() == token);
    assert_eq!(parsed, oracle, "token {token:?}");
}
