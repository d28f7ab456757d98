//! Random call sequences of XCLOAK.ALLOW / XCLOAK.PEEK / XCLOAK.REFUND,
//! shared by the model test (tests/model.rs: against a reference model, on
//! both storage forms) and the storage differential (tests/storage_diff.rs:
//! the two forms against each other): 1 to 4 tiers, COST, DETAILS, STAMP,
//! PEEK (with and without OLDEST), NOW moving by 0, 1, around a tier's window, randomly and backwards,
//! tiers changing mid-way, and refunds of earlier admissions' stamps (expired,
//! partial, doubled) or of unknown ones.

use proptest::prelude::*;

/// Largest stamp, window and NOW: 2^53 - 1.
pub const MAX_EXACT_MS: i64 = 9_007_199_254_740_991;
/// The NOW of a sequence's first call.
pub const START_MS: i64 = 1_700_000_000_000;

#[derive(Clone, Debug)]
pub enum Step {
    Zero,
    One,
    /// Relative to one tier's window (its index modulo the number of tiers).
    WindowMinusOne(usize),
    Window(usize),
    WindowPlusOne(usize),
    Forward(i64),
    Back(i64),
}

/// Which stamp a refund names.
#[derive(Clone, Debug)]
pub enum Target {
    /// The NOW of an earlier ALLOW of the sequence (by index, modulo their
    /// number): admitted or not, maybe expired or refunded already.
    Earlier(usize),
    /// The stamp the previous refund named (a refund made twice).
    Again,
    /// NOW minus this: a stamp no call used, unless by chance.
    Unknown(i64),
}

#[derive(Clone, Debug)]
pub struct Call {
    /// Instead of ALLOW/PEEK, `XCLOAK.REFUND key <target> [COST cost]`
    /// (the step still moves NOW).
    pub refund: Option<Target>,
    /// `STAMP` on an ALLOW.
    pub stamp: bool,
    pub peek: bool,
    /// `OLDEST` on a PEEK.
    pub oldest: bool,
    pub details: bool,
    /// `None`: no COST option (the default, 1).
    pub cost: Option<i64>,
    pub step: Step,
    /// New tiers from this call on (a caller reconfiguring mid-sequence).
    pub new_tiers: Option<Vec<(i64, i64)>>,
}

#[derive(Clone, Debug)]
pub struct Sequence {
    pub tiers: Vec<(i64, i64)>,
    pub calls: Vec<Call>,
}

pub fn window() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(1i64),
        Just(2),
        2..50i64,
        50..5_000i64,
        Just(60_000),
        1..=86_400_000i64,
        Just(86_400_000),
        Just(MAX_EXACT_MS),
    ]
}

pub fn limit() -> impl Strategy<Value = i64> {
    prop_oneof![0..=5i64, 0..=40i64, 100..=300i64]
}

/// 1 to 4 tiers; half the sequences have one (the reply without `TIER`).
pub fn tiers() -> impl Strategy<Value = Vec<(i64, i64)>> {
    prop_oneof![
        1 => prop::collection::vec((window(), limit()), 1..=1),
        1 => prop::collection::vec((window(), limit()), 2..=4),
    ]
}

pub fn call() -> impl Strategy<Value = Call> {
    let cost = prop_oneof![
        4 => Just(None),
        4 => (1..=3i64).prop_map(Some),
        2 => (1..=320i64).prop_map(Some),
        1 => Just(Some(1_000_000)),
    ];
    let step = prop_oneof![
        3 => Just(Step::Zero),
        2 => Just(Step::One),
        1 => (0..4usize).prop_map(Step::WindowMinusOne),
        1 => (0..4usize).prop_map(Step::Window),
        1 => (0..4usize).prop_map(Step::WindowPlusOne),
        3 => (0..2_000i64).prop_map(Step::Forward),
        1 => (1..5_000i64).prop_map(Step::Back),
    ];
    let refund = prop::option::weighted(
        0.2,
        prop_oneof![
            4 => any::<usize>().prop_map(Target::Earlier),
            1 => Just(Target::Again),
            1 => (0..3_000i64).prop_map(Target::Unknown),
        ],
    );
    (
        any::<bool>(),
        any::<bool>(),
        cost,
        step,
        prop::option::weighted(0.05, tiers()),
        refund,
        any::<bool>(),
    )
        .prop_map(|(peek, details, cost, step, new_tiers, refund, stamp)| Call {
            refund,
            stamp: stamp && !(peek && details),
            peek: peek && details, // a quarter PEEK, the rest ALLOW with or without DETAILS
            oldest: peek && details && stamp, // half the PEEKs ask OLDEST
            details,
            cost,
            step,
            new_tiers,
        })
}

pub fn sequence() -> impl Strategy<Value = Sequence> {
    (tiers(), prop::collection::vec(call(), 1..120)).prop_map(|(tiers, calls)| Sequence { tiers, calls })
}

/// The command line of a call: the positional pair is tier 0, a `TIER` each
/// for the others; a refund names `refund_stamp` (from [`walk`]).
pub fn command_of(call: &Call, key: &str, tiers: &[(i64, i64)], now: i64, refund_stamp: Option<i64>) -> redis::Cmd {
    if let Some(stamp) = refund_stamp {
        let mut command = redis::cmd("XCLOAK.REFUND");
        command.arg(key).arg(stamp);
        if let Some(cost) = call.cost {
            command.arg("COST").arg(cost);
        }
        return command;
    }
    let mut command = redis::cmd(if call.peek { "XCLOAK.PEEK" } else { "XCLOAK.ALLOW" });
    command.arg(key).arg(tiers[0].0).arg(tiers[0].1);
    for &(window, limit) in &tiers[1..] {
        command.arg("TIER").arg(window).arg(limit);
    }
    if let Some(cost) = call.cost {
        command.arg("COST").arg(cost);
    }
    command.arg("NOW").arg(now);
    if call.details && !call.peek {
        command.arg("DETAILS");
    }
    if call.stamp && !call.peek {
        command.arg("STAMP");
    }
    if call.oldest && call.peek {
        command.arg("OLDEST");
    }
    command
}

/// One step of `walk`: the call's index, the call, the tiers in force, its NOW
/// and, for a refund, the stamp it names.
pub type Walked<'a> = (usize, &'a Call, Vec<(i64, i64)>, i64, Option<i64>);

/// Each call of `sequence` with the tiers in force, its NOW (kept within
/// 0 ..= 2^53 - 1, the range NOW accepts) and, for a refund, the stamp it
/// names.
pub fn walk(sequence: &Sequence) -> impl Iterator<Item = Walked<'_>> {
    let mut tiers = sequence.tiers.clone();
    let mut now = START_MS;
    // The NOWs of the ALLOW calls so far, and the stamp the last refund named.
    let (mut allowed_at, mut last_refund): (Vec<i64>, Option<i64>) = (Vec::new(), None);
    sequence.calls.iter().enumerate().map(move |(i, call)| {
        if let Some(new_tiers) = &call.new_tiers {
            tiers = new_tiers.clone();
        }
        let window_of = |index: usize| tiers[index % tiers.len()].0;
        let step = match call.step {
            Step::Zero => 0,
            Step::One => 1,
            Step::WindowMinusOne(t) => window_of(t) - 1,
            Step::Window(t) => window_of(t),
            Step::WindowPlusOne(t) => window_of(t).saturating_add(1),
            Step::Forward(ms) => ms,
            Step::Back(ms) => -ms,
        };
        now = now.saturating_add(step).clamp(0, MAX_EXACT_MS);
        let refund_stamp = call.refund.as_ref().map(|target| {
            let stamp = match target {
                Target::Earlier(index) if !allowed_at.is_empty() => allowed_at[index % allowed_at.len()],
                Target::Again if last_refund.is_some() => last_refund.unwrap_or(now),
                Target::Earlier(_) | Target::Again => now,
                Target::Unknown(back) => (now - back).max(0),
            };
            last_refund = Some(stamp);
            stamp
        });
        if call.refund.is_none() && !call.peek {
            allowed_at.push(now);
        }
        (i, call, tiers.clone(), now, refund_stamp)
    })
}
