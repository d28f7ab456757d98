//! The table's own invariants: each would fail on a table that contradicts
//! itself, the parser or the module's registration.

use super::*;
use crate::args::Storage;

/// Every arg of `command`, the members of its blocks included.
fn all_args(command: &Command) -> Vec<&'static Arg> {
    let mut all = Vec::new();
    for arg in command.args {
        all.push(arg);
        all.extend(arg.block());
    }
    all
}

#[test]
fn names_are_lower_case_and_unique() {
    let names: Vec<&str> = COMMANDS.iter().map(|c| c.name).collect();
    for (i, name) in names.iter().enumerate() {
        assert!(name.starts_with("xcloak.") && *name == name.to_lowercase(), "{name}");
        assert!(!names[..i].contains(name), "{name} twice");
    }
    for command in COMMANDS {
        let args: Vec<&str> = command.args.iter().map(|a| a.name).collect();
        for (i, name) in args.iter().enumerate() {
            assert!(!args[..i].contains(name), "{}: arg {name} twice", command.name);
        }
    }
}

#[test]
fn every_token_is_unique_per_command_and_spelled_once() {
    for command in COMMANDS {
        let tokens: Vec<Token> = command.args.iter().filter_map(|a| a.token).collect();
        for (i, token) in tokens.iter().enumerate() {
            assert!(!tokens[..i].contains(token), "{}: {token:?} twice", command.name);
            // The parser finds each by its word, in any case.
            let word = token.word();
            assert_eq!(command.option(word.as_bytes()).map(|(t, _)| t), Some(*token));
            assert_eq!(
                command.option(word.to_lowercase().as_bytes()).map(|(t, _)| t),
                Some(*token)
            );
        }
        // A token is an option: optional, and after the positional args.
        let first_option = command
            .args
            .iter()
            .position(|a| a.token.is_some())
            .unwrap_or(command.args.len());
        assert!(
            command.args[first_option..]
                .iter()
                .all(|a| a.token.is_some() && a.optional),
            "{}",
            command.name
        );
        assert!(
            command.args[..first_option].iter().all(|a| !a.optional),
            "{}",
            command.name
        );
    }
    for (i, token) in Token::ALL.iter().enumerate() {
        let word = token.word();
        assert!(word.bytes().all(|b| b.is_ascii_uppercase()), "{word}");
        assert!(Token::ALL[..i].iter().all(|other| other.word() != word), "{word} twice");
    }
}

#[test]
fn ranges_are_ordered_and_stated_in_the_summaries() {
    for command in COMMANDS {
        for arg in all_args(command) {
            let summary = arg.summary();
            assert!(
                !summary.contains('{') && !summary.contains('}'),
                "{}: {summary}",
                arg.name
            );
            match arg.range() {
                Some(range) => {
                    assert!(range.min <= range.max(DEFAULT_MAX_LIMIT), "{}: {range:?}", arg.name);
                    assert!(range.min <= range.max(MAX_LIMIT_FLOOR), "{}: {range:?}", arg.name);
                    assert!(range.max(MAX_LIMIT_CEILING) <= MAX_EXACT_MS, "{}: {range:?}", arg.name);
                    assert!(
                        summary.contains(&range.text()),
                        "{}'s summary does not state its range {}: {summary}",
                        arg.name,
                        range.text()
                    );
                    assert!(
                        arg.doc.contains("{range}"),
                        "{}: the range is a second literal",
                        arg.name
                    );
                }
                None => assert!(
                    !arg.doc.contains("{range}"),
                    "{}: a range placeholder without a range",
                    arg.name
                ),
            }
            if arg.times > 1 {
                assert!(summary.contains(&format!("up to {} times", arg.times)), "{summary}");
            }
        }
    }
    // The texts rendered from the ranges, as COMMAND DOCS and the errors state them.
    assert_eq!(
        WINDOW.summary(),
        "Window length in milliseconds, 1 to 9007199254740991."
    );
    assert_eq!(
        LIMIT.summary(),
        "Most units admitted per window, 0 to xcloak.max-limit (default 1000000)."
    );
    assert_eq!(
        NOW.range().unwrap().error("NOW", DEFAULT_MAX_LIMIT),
        "NOW must be an integer from 0 to 9007199254740991 (unix time in milliseconds)"
    );
    assert_eq!(
        LIMIT.range().unwrap().error("limit", 50),
        "limit must be an integer from 0 to 50"
    );
}

#[test]
fn arity_counts_the_required_args() {
    for command in COMMANDS {
        let required = command.args.iter().filter(|a| !a.optional).count() as i32;
        assert_eq!(command.arity.abs(), 1 + required, "{}", command.name);
        let takes_more = command.args.iter().any(|a| a.optional) || command.name == APPLY.name;
        assert_eq!(command.arity < 0, takes_more, "{}", command.name);
    }
}

#[test]
fn one_key_first_with_consistent_flags() {
    for command in COMMANDS {
        let keys = all_args(command).iter().filter(|a| a.kind == Kind::Key).count();
        assert_eq!(keys, 1, "{}", command.name);
        assert_eq!(command.args[0].kind, Kind::Key, "{}", command.name);
        assert_eq!(command.key_position(), 1);
        let flags = command.key_flags;
        assert!(
            flags.contains(KeyFlags::RW) != flags.contains(KeyFlags::RO),
            "{}: RW or RO",
            command.name
        );
        // The registration flags agree with the key's: a read-only command
        // writes nothing, a write may be refused under maxmemory only if it
        // can grow the key.
        let registered: Vec<&str> = command.flags.split(' ').collect();
        assert_eq!(
            registered.contains(&"write"),
            flags.contains(KeyFlags::RW),
            "{}",
            command.name
        );
        assert_eq!(
            registered.contains(&"readonly"),
            flags.contains(KeyFlags::RO),
            "{}",
            command.name
        );
        if registered.contains(&"deny-oom") {
            assert!(flags.contains(KeyFlags::UPDATE), "{}", command.name);
        }
        let categories: Vec<&str> = command.acl_categories.split(' ').collect();
        assert_eq!(
            categories.contains(&"write"),
            flags.contains(KeyFlags::RW),
            "{}",
            command.name
        );
        assert_eq!(
            categories.contains(&"read"),
            flags.contains(KeyFlags::RO),
            "{}",
            command.name
        );
    }
}

#[test]
fn blocks_and_repeats() {
    for command in COMMANDS {
        for arg in command.args {
            if let Kind::Block(members) = arg.kind {
                assert!(arg.token.is_some() && !members.is_empty(), "{}", arg.name);
                assert!(members
                    .iter()
                    .all(|m| m.token.is_none() && !m.optional && m.block().is_empty()));
            }
            assert!(arg.times >= 1, "{}", arg.name);
            assert!(
                arg.times == 1 || arg.token.is_some(),
                "{}: repeats without a token",
                arg.name
            );
        }
    }
    // The tier list holds the positional pair and every repeat of TIER.
    assert_eq!(TIER.times + 1, MAX_TIERS);
    // A TIER's pair is the positional pair: same names and ranges.
    let pair: Vec<(&str, Option<Range>)> = TIER.block().iter().map(|a| (a.name, a.range())).collect();
    assert_eq!(pair, [(WINDOW.name, WINDOW.range()), (LIMIT.name, LIMIT.range())]);
}

#[test]
fn convert_choices_are_the_storage_forms() {
    let choices = TARGET.choices();
    assert!(!choices.is_empty());
    for choice in choices {
        let form = Storage::parse(choice.as_bytes()).unwrap_or_else(|| panic!("{choice} is no storage form"));
        assert_eq!(form.name().to_uppercase(), *choice);
    }
    for form in [Storage::Zset, Storage::Compact] {
        assert!(choices.contains(&form.name().to_uppercase().as_str()), "{form:?}");
    }
}

#[test]
fn either_lists_alternatives() {
    assert_eq!(either(&[]), "");
    assert_eq!(either(&["COST"]), "COST");
    assert_eq!(either(&["A", "B"]), "A or B");
    assert_eq!(ALLOW.expected_options(), "TIER, COST, NOW, DETAILS or STAMP");
    assert_eq!(PEEK.expected_options(), "TIER, COST, NOW or OLDEST");
}

/// The packed comparison takes a word only whole: not with a trailing NUL
/// (which packs as the padding does), a prefix, an extension, or past the
/// longest token.
#[test]
fn option_words_match_whole() {
    let found = |word: &[u8]| ALLOW.option(word).map(|(token, _)| token);
    assert_eq!(found(b"now"), Some(Token::Now));
    assert_eq!(found(b"dEtAiLs"), Some(Token::Details));
    for word in [
        &b"NOW\0"[..],
        b"\0NOW",
        b"NO",
        b"NOWS",
        b"DETAILSX",
        b"DETAILS\0",
        b"",
        b"OLDEST",
        b"\xcf\x84IER",
    ] {
        assert_eq!(found(word), None, "{word:?}");
    }
    assert_eq!(PEEK.option(b"oldest").map(|(token, _)| token), Some(Token::Oldest));
    assert_eq!(REFUND.option(b"TIER"), None);
    assert!(Token::ALL.iter().all(|token| token.word().len() <= Token::LONGEST));
    assert_eq!(Token::LONGEST, "DETAILS".len());
}
