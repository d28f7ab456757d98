//! The grammar of the `XCLOAK.*` commands, declared once.
//!
//! One [`Command`] table per command: its name, documentation (summary,
//! complexity, tips), arity, the flags it is registered with, its key's flags
//! and its ACL categories, and its arguments ([`Arg`]: name, [`Kind`] with the
//! valid [`Range`] or choices, [`Token`], optional, repeated, block members,
//! and the doc text). Everything else is generated from it:
//!
//! - [`crate::args`] parses a call from it: an option is recognised by the
//!   token its [`Arg`] declares, a value is checked against the arg's range,
//!   and every error names the arg and states that range in these words;
//! - the module registers each command and fills `COMMAND DOCS` /
//!   `COMMAND INFO` and the ACL categories from it (`src/metadata.rs`), a
//!   summary that states a range rendering it from the same [`Range`]
//!   ([`Arg::summary`]).
//!
//! So changing a range here changes the parser, its error text and
//! `COMMAND DOCS` together.

/// Largest integer a sorted-set score (an IEEE double) holds exactly: 2^53 - 1.
pub const MAX_EXACT_MS: i64 = 9_007_199_254_740_991;
/// Default upper bound of `limit` (configurable with `MAX-LIMIT` / `xcloak.max-limit`).
pub const DEFAULT_MAX_LIMIT: i64 = 1_000_000;
/// Upper bound of `COST`.
pub const MAX_COST: i64 = 1_000_000;
/// Largest value `MAX-LIMIT` may be configured to.
pub const MAX_LIMIT_CEILING: i64 = 1_000_000_000;
/// Smallest value `MAX-LIMIT` / `xcloak.max-limit` may take.
pub const MAX_LIMIT_FLOOR: i64 = 1;
/// Most tiers in one call: the positional pair and up to 15 `TIER`s.
pub const MAX_TIERS: usize = 16;
/// The setting that bounds `limit` ([`Max::MaxLimit`]).
pub const MAX_LIMIT_SETTING: &str = "xcloak.max-limit";
/// Version of the commands, as `COMMAND DOCS` shows it in `since`.
pub const SINCE: &str = "0.1.0";

/// An option word. [`Token::word`] is its one spelling (matched in any case).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token {
    Tier,
    Cost,
    Now,
    Details,
    Stamp,
    Oldest,
}

impl Token {
    pub const ALL: [Token; 6] = [
        Token::Tier,
        Token::Cost,
        Token::Now,
        Token::Details,
        Token::Stamp,
        Token::Oldest,
    ];

    /// The length of the longest word.
    pub const LONGEST: usize = {
        let mut longest = 0;
        let mut i = 0;
        while i < Token::ALL.len() {
            if Token::ALL[i].word().len() > longest {
                longest = Token::ALL[i].word().len();
            }
            i += 1;
        }
        longest
    };

    /// The word's bytes as one integer, the first in the lowest byte (a
    /// token is at most 8 bytes: checked at compile time below).
    #[inline]
    pub const fn packed(self) -> u64 {
        let word = self.word().as_bytes();
        let mut packed = 0u64;
        let mut i = 0;
        while i < word.len() {
            packed |= (word[i] as u64) << (8 * i);
            i += 1;
        }
        packed
    }

    pub const fn word(self) -> &'static str {
        match self {
            Token::Tier => "TIER",
            Token::Cost => "COST",
            Token::Now => "NOW",
            Token::Details => "DETAILS",
            Token::Stamp => "STAMP",
            Token::Oldest => "OLDEST",
        }
    }
}

const _: () = assert!(Token::LONGEST <= 8, "a token is packed into a u64");

impl Token {
    /// Each word of [`Token::ALL`] packed ([`Token::packed`]), at compile
    /// time: matching a word costs one comparison a token.
    const PACKED: [u64; Token::ALL.len()] = {
        let mut packed = [0; Token::ALL.len()];
        let mut i = 0;
        while i < Token::ALL.len() {
            packed[i] = Token::ALL[i].packed();
            i += 1;
        }
        packed
    };
}

/// The upper end of a [`Range`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Max {
    Value(i64),
    /// The configured `xcloak.max-limit` ([`DEFAULT_MAX_LIMIT`] unless set).
    MaxLimit,
}

/// The integers an argument accepts, `min` to `max` inclusive, and their unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub min: i64,
    pub max: Max,
    /// What the integer counts, for error texts (`milliseconds`); empty: a count.
    pub unit: &'static str,
}

impl Range {
    /// The upper end, with `max_limit` as the configured bound.
    #[inline]
    pub fn max(self, max_limit: i64) -> i64 {
        match self.max {
            Max::Value(max) => max,
            Max::MaxLimit => max_limit,
        }
    }

    /// `1 to 9007199254740991`, or `0 to xcloak.max-limit`: how docs state it.
    pub fn text(self) -> String {
        match self.max {
            Max::Value(max) => format!("{} to {max}", self.min),
            Max::MaxLimit => format!("{} to {MAX_LIMIT_SETTING}", self.min),
        }
    }

    /// The error of a value outside the range, or not an integer, for the
    /// argument called `label`, with `max_limit` as the configured bound.
    pub fn error(self, label: &str, max_limit: i64) -> String {
        let unit = if self.unit.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.unit)
        };
        format!(
            "{label} must be an integer from {} to {}{unit}",
            self.min,
            self.max(max_limit)
        )
    }
}

/// What an argument is, with what it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Key,
    /// One of these words, in any case (documented as a string).
    OneOf(&'static [&'static str]),
    Integer(Range),
    /// An integer that is a unix time in milliseconds.
    UnixTime(Range),
    /// The token alone.
    PureToken,
    /// The token, then these arguments.
    Block(&'static [Arg]),
}

/// One argument after the command name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arg {
    pub name: &'static str,
    pub kind: Kind,
    /// The word that introduces it (`COST 5`), or is all of it (`DETAILS`).
    pub token: Option<Token>,
    pub optional: bool,
    /// Most times it may be given, each with its token (`TIER w l TIER w l`); 1 if it does not repeat.
    pub times: usize,
    /// Its doc text, with placeholders: `{range}` (its [`Range::text`]),
    /// `{times}`, `{choices}` (`ZSET or COMPACT`), `{default-max-limit}`.
    /// [`Arg::summary`] renders it.
    pub doc: &'static str,
}

impl Arg {
    /// A required argument, given once, with no token.
    const fn plain(name: &'static str, kind: Kind, doc: &'static str) -> Arg {
        Arg {
            name,
            kind,
            token: None,
            optional: false,
            times: 1,
            doc,
        }
    }

    /// An optional argument introduced by `token`.
    const fn option(token: Token, name: &'static str, kind: Kind, doc: &'static str) -> Arg {
        Arg {
            token: Some(token),
            optional: true,
            ..Arg::plain(name, kind, doc)
        }
    }

    /// How its errors name it: its token (`COST`), else its name (`window`).
    pub fn label(&self) -> &'static str {
        self.token.map_or(self.name, Token::word)
    }

    pub fn range(&self) -> Option<Range> {
        match self.kind {
            Kind::Integer(range) | Kind::UnixTime(range) => Some(range),
            _ => None,
        }
    }

    /// The arguments inside a block, empty otherwise.
    pub fn block(&self) -> &'static [Arg] {
        match self.kind {
            Kind::Block(members) => members,
            _ => &[],
        }
    }

    /// The words of a [`Kind::OneOf`], empty otherwise.
    pub fn choices(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::OneOf(words) => words,
            _ => &[],
        }
    }

    /// The doc text, its placeholders filled from this arg's own values.
    pub fn summary(&self) -> String {
        self.doc
            .replace("{range}", &self.range().map(Range::text).unwrap_or_default())
            .replace("{times}", &self.times.to_string())
            .replace("{choices}", &either(self.choices()))
            .replace("{default-max-limit}", &DEFAULT_MAX_LIMIT.to_string())
    }
}

/// `A, B or C`: a list of alternatives as the errors and docs write it.
pub fn either(words: &[&str]) -> String {
    match words {
        [] => String::new(),
        [only] => only.to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// `REDISMODULE_CMD_KEY_*` flags of a command's key, as a set of bits the
/// module maps one to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyFlags(u8);

impl KeyFlags {
    /// Read-write: the command may read and modify the key.
    pub const RW: KeyFlags = KeyFlags(1);
    /// Read-only.
    pub const RO: KeyFlags = KeyFlags(1 << 1);
    /// The command returns or uses the key's data.
    pub const ACCESS: KeyFlags = KeyFlags(1 << 2);
    /// The command updates the data (no insert, no delete of the key itself).
    pub const UPDATE: KeyFlags = KeyFlags(1 << 3);
    /// The command removes data from the key.
    pub const DELETE: KeyFlags = KeyFlags(1 << 4);
    pub const ALL: [KeyFlags; 5] = [
        KeyFlags::RW,
        KeyFlags::RO,
        KeyFlags::ACCESS,
        KeyFlags::UPDATE,
        KeyFlags::DELETE,
    ];

    pub const fn with(self, other: KeyFlags) -> KeyFlags {
        KeyFlags(self.0 | other.0)
    }

    pub const fn contains(self, other: KeyFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// One command, declared once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command {
    /// Lower case, as `COMMAND` lists it.
    pub name: &'static str,
    pub summary: &'static str,
    pub complexity: &'static str,
    /// Space-separated hints for clients and proxies.
    pub tips: Option<&'static str>,
    /// As `COMMAND INFO` reports it: negative means "at least".
    pub arity: i32,
    /// The flags it is registered with (`RedisModule_CreateCommand`).
    pub flags: &'static str,
    pub key_flags: KeyFlags,
    /// Space-separated ACL categories (Redis 7.2+, Valkey).
    pub acl_categories: &'static str,
    pub args: &'static [Arg],
}

impl Command {
    /// The position of its one key in the call (the command name is 0): the
    /// first, last and step of its keys are (position, position, 1).
    pub fn key_position(&self) -> usize {
        1 + self.args.iter().position(|arg| arg.kind == Kind::Key).unwrap_or(0)
    }

    /// The token `word` names (any case) and its arg, if this command takes it.
    #[inline]
    pub fn option(&self, word: &[u8]) -> Option<(Token, &'static Arg)> {
        // Upper-cased and packed once into an integer (a word longer than
        // every token is none), then compared with each token's: one
        // comparison a token, no call to memcmp.
        if word.len() > Token::LONGEST {
            return None;
        }
        let mut packed = 0u64;
        for (i, b) in word.iter().enumerate() {
            packed |= u64::from(b.to_ascii_uppercase()) << (8 * i);
        }
        // The word's token (a trailing NUL packs as nothing: the length tells),
        // then whether this command takes it.
        let token = Token::ALL[Token::PACKED.iter().position(|&p| p == packed)?];
        if token.word().len() != word.len() {
            return None;
        }
        self.args
            .iter()
            .find(|arg| arg.token == Some(token))
            .map(|arg| (token, arg))
    }

    /// Its options' tokens, in order: `TIER, COST, NOW, DETAILS or STAMP`.
    pub fn expected_options(&self) -> String {
        let words: Vec<&str> = self.args.iter().filter_map(|arg| arg.token.map(Token::word)).collect();
        either(&words)
    }
}

const MS: &str = "milliseconds";
const UNIX_MS: &str = "unix time in milliseconds";
/// A window's length (positional, or a TIER's).
const WINDOW_RANGE: Range = Range {
    min: 1,
    max: Max::Value(MAX_EXACT_MS),
    unit: MS,
};
const LIMIT_RANGE: Range = Range {
    min: 0,
    max: Max::MaxLimit,
    unit: "",
};
const COST_RANGE: Range = Range {
    min: 1,
    max: Max::Value(MAX_COST),
    unit: "",
};
/// A unix time in milliseconds: `NOW`, REFUND's stamp.
const TIME_RANGE: Range = Range {
    min: 0,
    max: Max::Value(MAX_EXACT_MS),
    unit: UNIX_MS,
};

pub const KEY: Arg = Arg::plain(
    "key",
    Kind::Key,
    "The window's log (one per client identity): a sorted set, or the compact type xcloaklog.",
);
pub const WINDOW: Arg = Arg::plain(
    "window",
    Kind::Integer(WINDOW_RANGE),
    "Window length in milliseconds, {range}.",
);
pub const LIMIT: Arg = Arg::plain(
    "limit",
    Kind::Integer(LIMIT_RANGE),
    "Most units admitted per window, {range} (default {default-max-limit}).",
);
pub const TIER: Arg = Arg {
    times: MAX_TIERS - 1,
    ..Arg::option(
        Token::Tier,
        "tier",
        Kind::Block(&[
            Arg::plain(
                "window",
                Kind::Integer(WINDOW_RANGE),
                "This tier's window in milliseconds, {range}.",
            ),
            Arg::plain("limit", Kind::Integer(LIMIT_RANGE), "This tier's limit, {range}."),
        ]),
        "Another window and limit checked in the same call, up to {times} times: admitted only if every tier has \
         room.",
    )
};
pub const COST: Arg = Arg::option(
    Token::Cost,
    "cost",
    Kind::Integer(COST_RANGE),
    "Units this request consumes, {range} (default 1); all or nothing.",
);
pub const NOW: Arg = Arg::option(
    Token::Now,
    "unix-time-milliseconds",
    Kind::UnixTime(TIME_RANGE),
    "The caller's clock in unix milliseconds, {range} (default: the server's).",
);
pub const DETAILS: Arg = Arg::option(
    Token::Details,
    "details",
    Kind::PureToken,
    "Reply [allowed, limit, remaining, retry_after_ms, reset_after_ms] instead of 1/0, with a sixth element, the \
     per-tier array, when TIER is given.",
);
pub const STAMP: Arg = Arg::option(
    Token::Stamp,
    "stamp",
    Kind::PureToken,
    "Reply the admission's stamp (the millisecond it recorded, -1 if rejected) instead of 1/0, or as the last \
     element of the DETAILS reply: the handle XCLOAK.REFUND takes.",
);
pub const OLDEST: Arg = Arg::option(
    Token::Oldest,
    "oldest",
    Kind::PureToken,
    "Add, last, the stamp of the oldest entry live in the binding tier's window (where that moving window starts), \
     -1 if the window holds none.",
);
/// REFUND's stamp.
pub const REFUND_STAMP: Arg = Arg::plain(
    "stamp",
    Kind::Integer(TIME_RANGE),
    "The admission's stamp in unix milliseconds, {range} (the STAMP reply of XCLOAK.ALLOW).",
);
/// REFUND's `COST`: the same range as ALLOW's, another text.
pub const REFUND_COST: Arg = Arg::option(
    Token::Cost,
    "cost",
    Kind::Integer(COST_RANGE),
    "Units to give back, {range} (default 1); never more than that stamp holds.",
);
/// CONVERT's target form: the names of [`crate::args::Storage`].
pub const TARGET: Arg = Arg::plain(
    "target",
    Kind::OneOf(&["ZSET", "COMPACT"]),
    "{choices} (COMPACT needs the module loaded with STORAGE compact).",
);

pub const ALLOW: Command = Command {
    name: "xcloak.allow",
    summary: "Admits a request of COST units if the sliding window (and every TIER) has room, and records it once. \
              Replies 1/0 (with STAMP the admission's stamp, or -1), or with DETAILS [allowed, limit, remaining, \
              retry_after_ms, reset_after_ms], plus the per-tier array when TIER is given and the stamp with STAMP.",
    complexity: "O(log(N) + (M + C)*log(N)) with N the entries in the key, M the entries that expired (removed) and \
                 C the cost; each TIER shorter than the longest window adds O(log(N) + E), E the entries older than \
                 its window; DETAILS adds O(K) per tier, K <= N the entries older than the one whose departure makes \
                 room.",
    tips: Some("nondeterministic_output"),
    arity: -4,
    flags: "write deny-oom fast",
    key_flags: KeyFlags::RW.with(KeyFlags::ACCESS).with(KeyFlags::UPDATE),
    acl_categories: "write fast",
    args: &[KEY, WINDOW, LIMIT, TIER, COST, NOW, DETAILS, STAMP],
};

pub const PEEK: Command = Command {
    name: "xcloak.peek",
    summary: "Replies what XCLOAK.ALLOW would decide now, writing nothing: [allowed, limit, remaining, \
              retry_after_ms, reset_after_ms], plus the per-tier array when TIER is given and the oldest live \
              entry's stamp with OLDEST.",
    complexity: "O(log(N) + M + K) with N the entries in the key, M the entries that expired (counted, not removed) \
                 and K <= N the entries older than the one whose departure makes room; each TIER adds as much.",
    tips: Some("nondeterministic_output"),
    arity: -4,
    flags: "readonly fast",
    key_flags: KeyFlags::RO.with(KeyFlags::ACCESS),
    acl_categories: "read fast",
    args: &[KEY, WINDOW, LIMIT, TIER, COST, NOW, OLDEST],
};

pub const REFUND: Command = Command {
    name: "xcloak.refund",
    summary: "Gives back an admission: removes up to COST entries stamped exactly stamp (the STAMP reply of \
              XCLOAK.ALLOW) and replies how many it removed. Trims nothing and leaves the TTL alone.",
    complexity: "O(log(N) + C*log(N)) with N the entries in the key and C the cost (O(N) on a compact window when \
                 the stamp is not the newest).",
    tips: None,
    arity: -3,
    // Not deny-oom: it only frees.
    flags: "write fast",
    key_flags: KeyFlags::RW.with(KeyFlags::DELETE),
    acl_categories: "write fast",
    args: &[KEY, REFUND_STAMP, REFUND_COST],
};

pub const CONVERT: Command = Command {
    name: "xcloak.convert",
    summary: "Rewrites one window in the other storage form (ZSET: a sorted set; COMPACT: the module's compact \
              type), keeping every entry and the TTL. Replies 1 if converted, 0 if the key is missing or already in \
              that form.",
    complexity: "O(N) with N the entries in the key (O(N*log(N)) into a sorted set).",
    tips: None,
    arity: 3,
    flags: "write deny-oom",
    key_flags: KeyFlags::RW.with(KeyFlags::ACCESS).with(KeyFlags::UPDATE),
    acl_categories: "write slow",
    args: &[KEY, TARGET],
};

/// Internal: its arguments after the key are an effect's words, not documented.
pub const APPLY: Command = Command {
    name: "xcloak.apply",
    summary: "Internal: replays the effect of a call on a compact window (load, trim, remove, add, expiry) from the \
              replication link or the AOF. Refused from clients.",
    complexity: "O(M + 1) for a trim of M entries and an add; O(N) to load N entries.",
    tips: None,
    arity: -2,
    flags: "write",
    key_flags: KeyFlags::RW.with(KeyFlags::UPDATE),
    acl_categories: "write",
    args: &[KEY],
};

/// Every command, in the order they are registered.
pub const COMMANDS: [&Command; 5] = [&ALLOW, &PEEK, &REFUND, &CONVERT, &APPLY];

#[cfg(test)]
mod tests;
