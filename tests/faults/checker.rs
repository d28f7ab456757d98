//! The checker: pure Rust over a `History`.
//!
//! - **Over-admission.** For every key and every interval `(t - window, t]`
//!   (the module's window at `t`), the acknowledged admissions whose stamps
//!   fall inside, minus the limit, where positive. The count only grows at a
//!   stamp, so the right ends worth trying are the stamps themselves. A key's
//!   over-admission in a segment is the largest over the right ends inside it.
//! - **Lost admissions.** An acknowledged admission `(key, stamp)` is lost when
//!   the primary that serves the key at the end of its segment does not hold
//!   it: in that node's latest snapshot taken while it was primary (since it
//!   last became one), begun more than 100 ms after the stamp and read to the
//!   end more than 250 ms before the stamp leaves the window (so a trim can't
//!   have removed it),
//!   the key holds fewer entries at that stamp than were acknowledged. With
//!   no such snapshot, the admission is *unchecked*. Counting entries per
//!   stamp makes this a lower bound when two nodes admitted on one key in the
//!   same millisecond (an entry of one can stand in for the other's).
//! - **Timeouts.** A call whose client timed out is counted as applied when
//!   its late reply came (admitted or rejected).

use std::collections::BTreeMap;

use super::history::{History, Late, Ms, Outcome, Segment, Snapshot};

/// A key's worst interval: the count of acknowledged admissions in the
/// window ending at a stamp in `[from, to)`, minus `limit`, at least 0.
pub fn over_admission(sorted_stamps: &[Ms], window_ms: Ms, limit: i64, from: Ms, to: Ms) -> i64 {
    let mut worst = 0;
    let mut oldest = 0; // first index inside (t - window, t]
    for (newest, &t) in sorted_stamps.iter().enumerate() {
        while sorted_stamps[oldest] <= t - window_ms {
            oldest += 1;
        }
        // Equal stamps: the window ending at t holds all of them.
        if t < from || t >= to || sorted_stamps.get(newest + 1) == Some(&t) {
            continue;
        }
        worst = worst.max((newest - oldest + 1) as i64 - limit);
    }
    worst
}

/// What the checker found in one segment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SegmentReport {
    pub kind: String,
    /// Acknowledged admissions stamped in the segment.
    pub acked: u64,
    pub lost: u64,
    pub unchecked: u64,
    /// Over-admission of every key (index = key).
    pub over: Vec<i64>,
    pub calls: u64,
    pub refused: u64,
    pub not_replicated: u64,
    /// Of those, refunded by their stamp.
    pub refunded: u64,
    pub timeouts: u64,
    /// Timed-out calls the server ran anyway: admitted, rejected, erred.
    pub late_admitted: u64,
    pub late_rejected: u64,
    pub late_error: u64,
    pub dropped: u64,
}

/// Acknowledged admissions per key, sorted by stamp.
fn admissions_by_key(history: &History) -> Vec<Vec<Ms>> {
    let mut by_key = vec![Vec::new(); history.keys as usize];
    for op in &history.ops {
        if let Outcome::Admitted { stamp } = op.outcome {
            by_key[op.key as usize].push(stamp);
        }
    }
    for stamps in &mut by_key {
        stamps.sort_unstable();
    }
    by_key
}

/// When `node` last became primary before `at_ms`: the first snapshot of
/// the run of primary snapshots of that node that contains `at_ms`.
fn primary_since(snapshots: &[&Snapshot], at_ms: Ms) -> Option<Ms> {
    let mut since = None;
    for snapshot in snapshots.iter().take_while(|s| s.at_ms <= at_ms) {
        since = match (snapshot.primary, since) {
            (true, None) => Some(snapshot.at_ms),
            (true, since) => since,
            (false, _) => None,
        };
    }
    since
}

/// Lost and unchecked acknowledged admissions of `segment`.
fn losses(history: &History, segment: &Segment, by_key: &[Vec<Ms>]) -> (u64, u64) {
    let mut by_node: BTreeMap<&str, Vec<&Snapshot>> = BTreeMap::new();
    for snapshot in &history.snapshots {
        by_node.entry(snapshot.node.as_str()).or_default().push(snapshot);
    }
    for snapshots in by_node.values_mut() {
        snapshots.sort_by_key(|s| s.at_ms);
    }
    let (mut lost, mut unchecked) = (0, 0);
    for (key, stamps) in by_key.iter().enumerate() {
        let Some(node) = segment.final_primary.get(&(key as u16)) else {
            unchecked += stamps
                .iter()
                .filter(|&&s| s >= segment.start_ms && s < segment.end_ms)
                .count() as u64;
            continue;
        };
        let snapshots = by_node.get(node.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        let since = primary_since(snapshots, segment.end_ms);
        let mut i = 0;
        while i < stamps.len() {
            let stamp = stamps[i];
            let acked = stamps[i..].iter().take_while(|&&s| s == stamp).count();
            i += acked;
            if stamp < segment.start_ms || stamp >= segment.end_ms {
                continue;
            }
            let usable = snapshots.iter().rev().find(|s| {
                s.primary
                    && since.is_some_and(|since| s.at_ms >= since)
                    && s.at_ms > stamp + 100
                    && s.read_by_ms < stamp + history.window_ms - 250
                    && s.stamps.contains_key(&(key as u16))
            });
            match usable {
                None => {
                    if std::env::var("XCLOAK_FAULT_DEBUG").is_ok() {
                        let near: Vec<(Ms, bool, bool)> = snapshots
                            .iter()
                            .filter(|s| s.at_ms > stamp - 500 && s.at_ms < stamp + history.window_ms)
                            .map(|s| (s.at_ms - stamp, s.primary, s.stamps.contains_key(&(key as u16))))
                            .collect();
                        eprintln!(
                            "unchecked: {} key {key} stamp {} (+{} ms in segment) node {node} since {:?}: {near:?}",
                            segment.kind,
                            stamp,
                            stamp - segment.start_ms,
                            since.map(|s| s - stamp)
                        );
                    }
                    unchecked += acked as u64
                }
                Some(snapshot) => {
                    let held = snapshot.stamps[&(key as u16)].iter().filter(|&&s| s == stamp).count();
                    lost += acked.saturating_sub(held) as u64;
                    if held < acked && std::env::var("XCLOAK_FAULT_DEBUG").is_ok() {
                        eprintln!(
                            "lost: {} key {key} +{} ms in segment, snapshot +{} ms after",
                            segment.kind,
                            stamp - segment.start_ms,
                            snapshot.at_ms - stamp
                        );
                    }
                }
            }
        }
    }
    (lost, unchecked)
}

/// Checks every segment of the history.
pub fn check(history: &History) -> Vec<SegmentReport> {
    let by_key = admissions_by_key(history);
    history
        .segments
        .iter()
        .map(|segment| {
            let inside = |ms: Ms| ms >= segment.start_ms && ms < segment.end_ms;
            let mut report = SegmentReport {
                kind: segment.kind.clone(),
                ..Default::default()
            };
            report.over = by_key
                .iter()
                .map(|stamps| {
                    over_admission(
                        stamps,
                        history.window_ms,
                        history.limit,
                        segment.start_ms,
                        segment.end_ms,
                    )
                })
                .collect();
            report.acked = by_key.iter().flatten().filter(|&&s| inside(s)).count() as u64;
            (report.lost, report.unchecked) = losses(history, segment, &by_key);
            for op in history.ops.iter().filter(|op| inside(op.sent_ms)) {
                report.calls += 1;
                match &op.outcome {
                    Outcome::Admitted { .. } | Outcome::Rejected => {}
                    Outcome::NotReplicated { refunded, .. } => {
                        report.not_replicated += 1;
                        report.refunded += *refunded as u64;
                    }
                    Outcome::Refused(_) => report.refused += 1,
                    Outcome::Dropped(_) => report.dropped += 1,
                    Outcome::Timeout => {
                        report.timeouts += 1;
                        match history.late.get(&op.id) {
                            Some(Late::Admitted(_)) => report.late_admitted += 1,
                            Some(Late::Rejected) => report.late_rejected += 1,
                            Some(Late::Error(_)) => report.late_error += 1,
                            Some(Late::NoReply) | None => {}
                        }
                    }
                }
            }
            report
        })
        .collect()
}

/// The segments of one fault kind, summed: the row of the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KindSummary {
    pub kind: String,
    pub runs: usize,
    pub acked: u64,
    pub lost: u64,
    pub unchecked: u64,
    /// Largest over-admission of a key in one run, and the mean over all
    /// (run, key) pairs, in admissions.
    pub max_over: i64,
    pub mean_over: f64,
    /// (run, key) pairs with an over-admission, of all pairs.
    pub keys_affected: usize,
    pub key_runs: usize,
    pub calls: u64,
    pub refused: u64,
    pub not_replicated: u64,
    pub refunded: u64,
    pub timeouts: u64,
    pub late_admitted: u64,
    pub late_rejected: u64,
    pub late_error: u64,
    pub dropped: u64,
}

/// One row per kind, in order of first appearance.
pub fn summarize(reports: &[SegmentReport]) -> Vec<KindSummary> {
    let mut rows: Vec<KindSummary> = Vec::new();
    for report in reports {
        let position = rows.iter().position(|row| row.kind == report.kind).unwrap_or_else(|| {
            rows.push(KindSummary {
                kind: report.kind.clone(),
                ..Default::default()
            });
            rows.len() - 1
        });
        let row = &mut rows[position];
        row.runs += 1;
        row.acked += report.acked;
        row.lost += report.lost;
        row.unchecked += report.unchecked;
        row.max_over = row.max_over.max(report.over.iter().copied().max().unwrap_or(0));
        row.mean_over += report.over.iter().sum::<i64>() as f64;
        row.keys_affected += report.over.iter().filter(|&&o| o > 0).count();
        row.key_runs += report.over.len();
        row.calls += report.calls;
        row.refused += report.refused;
        row.not_replicated += report.not_replicated;
        row.refunded += report.refunded;
        row.timeouts += report.timeouts;
        row.late_admitted += report.late_admitted;
        row.late_rejected += report.late_rejected;
        row.late_error += report.late_error;
        row.dropped += report.dropped;
    }
    for row in &mut rows {
        row.mean_over /= row.key_runs.max(1) as f64;
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::super::history::*;
    use super::*;

    const W: Ms = 1000;

    fn admitted(id: u64, key: u16, stamp: Ms) -> Op {
        Op {
            id,
            key,
            sent_ms: stamp,
            latency_us: 0,
            outcome: Outcome::Admitted { stamp },
        }
    }

    fn history(ops: Vec<Op>, limit: i64, segments: Vec<Segment>) -> History {
        History {
            window_ms: W,
            limit,
            keys: 2,
            ops,
            segments,
            ..Default::default()
        }
    }

    fn segment(kind: &str, start_ms: Ms, end_ms: Ms) -> Segment {
        let final_primary = [(0, "a".to_string()), (1, "a".to_string())].into_iter().collect();
        Segment {
            kind: kind.into(),
            start_ms,
            end_ms,
            final_primary,
        }
    }

    #[test]
    fn a_history_within_the_limit_has_no_over_admission() {
        // Limit 3: three at 0..2, three more once the first have left at 1000..1002
        // ((t - 1000, t] at t = 1000 holds 1, 2 and 1000).
        let stamps = [0, 1, 2, 1000, 1001, 1002, 2500, 2500, 2500];
        let ops = stamps
            .iter()
            .enumerate()
            .map(|(i, &s)| admitted(i as u64, 0, s))
            .collect();
        let reports = check(&history(ops, 3, vec![segment("none", 0, 10_000)]));
        assert_eq!(reports[0].over, vec![0, 0]);
        assert_eq!(reports[0].acked, 9);
        assert_eq!(summarize(&reports)[0].keys_affected, 0);
    }

    #[test]
    fn a_known_over_admission_is_found_and_attributed_to_its_segment() {
        // Key 0: limit 3, a fourth admission at 999 (the first, at 0, is still in).
        // Key 1: two extra in one millisecond, in the second segment.
        let mut ops: Vec<Op> = [0, 1, 2, 999]
            .iter()
            .enumerate()
            .map(|(i, &s)| admitted(i as u64, 0, s))
            .collect();
        ops.extend(
            [5000, 5100, 5200, 5300, 5300]
                .iter()
                .enumerate()
                .map(|(i, &s)| admitted(100 + i as u64, 1, s)),
        );
        let segments = vec![segment("kill", 0, 4000), segment("stop", 4000, 9000)];
        let reports = check(&history(ops, 3, segments));
        assert_eq!(reports[0].over, vec![1, 0]);
        assert_eq!(
            reports[1].over,
            vec![0, 2],
            "equal stamps all count in the window ending there"
        );
        let rows = summarize(&reports);
        assert_eq!((rows[0].max_over, rows[0].keys_affected, rows[0].key_runs), (1, 1, 2));
        assert_eq!(rows[0].mean_over, 0.5);
        assert_eq!((rows[1].max_over, rows[1].keys_affected), (2, 1));
    }

    #[test]
    fn the_window_is_half_open() {
        // (t - W, t]: an entry exactly W old has left, so 0 and 1000 never count together.
        assert_eq!(over_admission(&[0, 1000], W, 1, 0, 5000), 0);
        assert_eq!(over_admission(&[0, 999], W, 1, 0, 5000), 1);
        // Only right ends inside [from, to) count.
        assert_eq!(over_admission(&[0, 999], W, 1, 0, 999), 0);
    }

    #[test]
    fn lost_admissions_are_those_the_final_primary_lacks() {
        let ops = vec![
            admitted(1, 0, 1000),
            admitted(2, 0, 1000),
            admitted(3, 0, 1200),
            admitted(4, 1, 1300),
        ];
        let mut segment = segment("kill", 0, 5000);
        segment.final_primary.insert(0, "b".into());
        segment.final_primary.insert(1, "b".into());
        let snapshot = |node: &str, at_ms: Ms, primary: bool, held: &[(u16, &[Ms])]| Snapshot {
            node: node.into(),
            at_ms,
            read_by_ms: at_ms + 10,
            primary,
            stamps: held.iter().map(|(k, s)| (*k, s.to_vec())).collect(),
        };
        let mut h = history(ops, 10, vec![segment]);
        h.snapshots = vec![
            // "b" as a replica, then primary holding one of the two at 1000 and the one at 1200.
            snapshot("b", 1150, false, &[]),
            snapshot("b", 1500, true, &[(0, &[1000, 1200]), (1, &[])]),
            // Too late to tell (within 250 ms of the stamps leaving the window).
            snapshot("b", 2100, true, &[(0, &[]), (1, &[])]),
        ];
        let reports = check(&h);
        assert_eq!(
            (reports[0].lost, reports[0].unchecked),
            (2, 0),
            "one of the two at 1000, and key 1's at 1300"
        );

        // A snapshot whose reads ended too near a stamp's leaving (a trim may
        // have run meanwhile) proves nothing for it: the two at 1000 (out by
        // 2000) are unchecked, key 1's at 1300 still lost.
        h.snapshots[1].read_by_ms = 1800;
        let reports = check(&h);
        assert_eq!((reports[0].lost, reports[0].unchecked), (1, 2));
        // Nor does no snapshot of the final primary at all.
        h.snapshots.retain(|s| s.at_ms != 1500);
        let reports = check(&h);
        assert_eq!((reports[0].lost, reports[0].unchecked), (0, 4));
    }

    #[test]
    fn timed_out_calls_are_counted_by_their_late_reply() {
        let timeout = |id: u64| Op {
            id,
            key: 0,
            sent_ms: 10,
            latency_us: 500_000,
            outcome: Outcome::Timeout,
        };
        let mut h = history(
            vec![timeout(1), timeout(2), timeout(3), timeout(4)],
            3,
            vec![segment("stop", 0, 1000)],
        );
        h.late = [(1, Late::Admitted(700)), (2, Late::Rejected), (3, Late::NoReply)]
            .into_iter()
            .collect();
        let report = &check(&h)[0];
        assert_eq!((report.timeouts, report.late_admitted, report.late_rejected), (4, 1, 1));
        assert_eq!(report.acked, 0, "a timed-out admission is not acknowledged");
    }
}
