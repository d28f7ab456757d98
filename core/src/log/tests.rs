//! Unit tests of the compact log: layouts, codecs, every change against a
//! reference log.

use super::*;
use crate::args::MAX_EXACT_MS;
use crate::window::tests::VecLog;
use crate::window::Log;

fn stamps(log: &RunLog) -> Vec<i64> {
    log.runs()
        .flat_map(|(stamp, count)| std::iter::repeat_n(stamp, count as usize))
        .collect()
}

fn canonical(log: &RunLog) -> Vec<u8> {
    let mut out = Vec::new();
    log.encode(&mut out);
    out
}

fn runs_bytes(log: &RunLog) -> Vec<u8> {
    let mut out = Vec::new();
    log.encode_runs(&mut out);
    out
}

/// Bytes the log's allocations take.
fn allocated(log: &RunLog) -> usize {
    let mut total = 0;
    log.allocations(|_, size| total += size);
    total
}

fn block_pointers(log: &RunLog) -> Vec<*const u8> {
    let mut out = Vec::new();
    log.allocations(|ptr, _| out.push(ptr));
    out
}

/// A small deterministic generator (no dependency): xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const T: i64 = 1_732_941_234_567;

#[test]
fn a_window_of_ten_requests_six_seconds_apart_is_one_32_byte_allocation() {
    let evenly = |limit: i64| {
        let mut log = RunLog::default();
        for j in 0..limit {
            log.record(T + j * 60_000 / limit, 1);
        }
        assert_eq!(log.len(), limit as u64);
        log
    };
    // 16 bytes of header, 9 gaps of 13 bits (5999 < 2^13).
    let ten = evenly(10);
    assert_eq!((ten.form(), allocated(&ten)), (Form::Inline, 32));
    // 99 gaps of 10 bits: 124 bytes + 16, the 160-byte class.
    let hundred = evenly(100);
    assert_eq!((hundred.form(), allocated(&hundred)), (Form::Inline, 160));
    // 999 gaps of 6 bits: 750 bytes + 16, the 768-byte class.
    let thousand = evenly(1000);
    assert_eq!((thousand.form(), allocated(&thousand)), (Form::Inline, 768));
    // Lone requests 1 ms apart take no bits at all: 1,024 of them in 16 bytes.
    let mut dense = RunLog::default();
    for i in 0..1024 {
        dense.record(T + i, 1);
    }
    assert_eq!((dense.form(), allocated(&dense)), (Form::Inline, 16));
    assert_eq!(std::mem::size_of::<RunLog>(), 8);
    assert_eq!(std::mem::size_of::<BlockRef>(), 24);
}

#[test]
fn header_fields_round_trip_at_their_limits() {
    let header = Header {
        first_ms: MAX_EXACT_MS,
        dw: SPAN_BITS,
        cw: ENTRIES_BITS,
        tag: TAG_LARGE,
        class: 19,
        runs: BLOCK_RUNS,
        dead: MAX_DEAD,
        span: MAX_SPAN,
    };
    let mut bytes = [0u8; 16];
    header.write(&mut bytes);
    assert_eq!(Header::read(&bytes), header);
    let zero = Header::default();
    zero.write(&mut bytes);
    assert_eq!(bytes, [0; 16]);
}

#[test]
fn bits_read_and_write_anywhere_and_shift_down() {
    let mut data = vec![0u8; 40];
    let mut rng = Rng(7);
    let mut fields = Vec::new();
    let mut pos = 0;
    while pos < 300 {
        let width = 1 + rng.below(46) as u32;
        let value = rng.next() & mask(width);
        set_bits(&mut data, pos, width, value);
        fields.push((pos, width, value));
        pos += width as usize;
    }
    for &(pos, width, value) in &fields {
        assert_eq!(get_bits(&data, pos, width), value, "at {pos}");
    }
    // The last bytes are read and written without reading past the end.
    set_bits(&mut data, 40 * 8 - 5, 5, 0b10110);
    assert_eq!(get_bits(&data, 40 * 8 - 5, 5), 0b10110);
    // Shifting removes exactly the bits in between.
    for cut in [1usize, 7, 8, 9, 63, 64, 65, 130] {
        let mut copy = data.clone();
        let end = 310;
        shift_bits_down(&mut copy, 13 + cut, 13, end);
        for i in 0..13 {
            assert_eq!(get_bits(&copy, i, 1), get_bits(&data, i, 1));
        }
        for i in 13..end - cut {
            assert_eq!(get_bits(&copy, i, 1), get_bits(&data, i + cut, 1), "cut {cut} bit {i}");
        }
    }
}

#[test]
fn runs_group_equal_stamps_and_count_bits_only_when_several() {
    let mut log = RunLog::default();
    log.record(100, 1);
    log.record(100, 2);
    log.record(105, 1);
    log.record(300, 4);
    assert_eq!(log.runs().collect::<Vec<_>>(), [(100, 3), (105, 1), (300, 4)]);
    assert_eq!(log.len(), 8);
    // Version 1: 100<<1|1, 3 | 5<<1 | 195<<1|1 (two bytes), 4
    assert_eq!(runs_bytes(&log), [201, 1, 3, 10, 135, 3, 4]);
    let mut lone = RunLog::default();
    for stamp in [10, 20, 25] {
        lone.record(stamp, 1);
    }
    // Version 2, one group: first 10, dw = bits(9) = 4, cw = 0, runs 3,
    // span 15; slots: gaps - 1 = 9, 4.
    let bytes = canonical(&lone);
    assert_eq!(bytes.len(), 16 + 1);
    assert_eq!(
        Header::read(&bytes),
        Header {
            first_ms: 10,
            dw: 4,
            cw: 0,
            tag: 0,
            class: 0,
            runs: 3,
            dead: 0,
            span: 15
        }
    );
    assert_eq!(bytes[16], 9 | 4 << 4);
}

#[test]
fn canonical_bytes_round_trip_and_do_not_depend_on_history() {
    let mut a = RunLog::default();
    for stamp in [10, 20, 20, 30, 45, 46, 47, 47, 47] {
        a.record(stamp, 1);
    }
    a.trim(20); // leaves 30, 45, 46, 47 x3
    a.remove_at(46, 1);
    a.record(46, 1); // a step back
    let mut b = RunLog::default();
    for (stamp, count) in [(30, 1), (45, 1), (46, 1), (47, 3)] {
        b.record(stamp, count);
    }
    assert_eq!(canonical(&a), canonical(&b));
    assert_eq!(runs_bytes(&a), runs_bytes(&b));
    for decoded in [
        RunLog::decode(&canonical(&a)).unwrap(),
        RunLog::decode_runs(&runs_bytes(&a)).unwrap(),
    ] {
        assert_eq!(stamps(&decoded), [30, 45, 46, 47, 47, 47]);
        assert_eq!(canonical(&decoded), canonical(&a));
        assert_eq!(decoded.len(), 6);
    }
    // A window of many blocks, built two ways. Under Miri (some 10,000
    // times slower), 300 runs up to 2^30 ms apart: 30-bit gaps, so still
    // some 4 blocks under an index after the trim.
    let (count, max_gap, trimmed) = if cfg!(miri) {
        (300, 1 << 30, 100)
    } else {
        (5000, 3000, 2000)
    };
    let mut grown = RunLog::default();
    let mut rng = Rng(11);
    let mut stamp = T;
    let mut runs = Vec::new();
    for _ in 0..count {
        stamp += 1 + rng.below(max_gap) as i64;
        let count = if rng.below(10) == 0 { 2 + rng.below(5) } else { 1 };
        grown.record(stamp, count);
        runs.push((stamp, count));
    }
    grown.trim(runs[trimmed - 1].0);
    for &(stamp, count) in runs[trimmed..].iter().step_by(7) {
        grown.remove_at(stamp, count);
    }
    let kept: Vec<(i64, u64)> = runs[trimmed..]
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 7 != 0)
        .map(|(_, &r)| r)
        .collect();
    let fresh = RunLog::from_runs(kept.iter().copied());
    assert!(matches!(grown.form(), Form::Large(_)));
    assert_eq!(grown.runs().collect::<Vec<_>>(), kept);
    assert_eq!(canonical(&grown), canonical(&fresh));
    assert_eq!(
        RunLog::decode(&canonical(&grown)).unwrap().runs().collect::<Vec<_>>(),
        kept
    );
}

#[test]
fn decode_runs_refuses_every_non_canonical_form() {
    let cases: [(&[u8], DecodeError); 10] = [
        (&[], DecodeError::Empty),
        (&[0x80], DecodeError::Truncated),
        (&[3], DecodeError::Truncated),   // multi without its count
        (&[3, 1], DecodeError::BadCount), // "several" = 1
        (&[3, 0], DecodeError::BadCount),
        (&[2, 0], DecodeError::Unsorted),        // second run, delta 0
        (&[0x82, 0x00], DecodeError::BadVarint), // overlong 2
        (
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
            DecodeError::BadVarint,
        ),
        (
            &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40],
            DecodeError::StampRange,
        ), // 2^55 >> 1
        (&[1, 0xff, 0xff, 0xff, 0xff, 0x0f], DecodeError::TooMany), // 2^32-1 entries
    ];
    for (bytes, expected) in cases {
        assert_eq!(RunLog::decode_runs(bytes).unwrap_err(), expected, "{bytes:?}");
    }
    let mut log = RunLog::default();
    log.record(MAX_EXACT_MS, MAX_ENTRIES);
    assert_eq!(
        RunLog::decode_runs(&runs_bytes(&log))
            .unwrap()
            .runs()
            .collect::<Vec<_>>(),
        [(MAX_EXACT_MS, MAX_ENTRIES)]
    );
    let mut over = Vec::new();
    put_run(&mut over, MAX_EXACT_MS as u64 + 1, 1);
    assert_eq!(RunLog::decode_runs(&over).unwrap_err(), DecodeError::StampRange);
    let mut over = Vec::new();
    put_run(&mut over, 5, MAX_ENTRIES + 1);
    assert_eq!(RunLog::decode_runs(&over).unwrap_err(), DecodeError::TooMany);
    let mut trailing = runs_bytes(&log);
    trailing.push(0x80);
    assert_eq!(RunLog::decode_runs(&trailing).unwrap_err(), DecodeError::Truncated);
}

/// A version 2 group with the given header fields and slot bits, written by hand.
fn group(header: Header, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; 16];
    header.write(&mut out);
    out.extend_from_slice(data);
    out
}

#[test]
fn decode_refuses_every_non_canonical_form() {
    let h = Header {
        first_ms: 10,
        dw: 4,
        cw: 0,
        tag: 0,
        class: 0,
        runs: 3,
        dead: 0,
        span: 15,
    };
    let good = group(h, &[9 | 4 << 4]);
    assert_eq!(
        RunLog::decode(&good).unwrap().runs().collect::<Vec<_>>(),
        [(10, 1), (20, 1), (25, 1)]
    );
    let cases: Vec<(&str, Vec<u8>, DecodeError)> = vec![
        ("empty", vec![], DecodeError::Empty),
        ("a header cut short", good[..15].to_vec(), DecodeError::Truncated),
        ("slots cut short", good[..16].to_vec(), DecodeError::Truncated),
        ("a trailing byte", [&good[..], &[0]].concat(), DecodeError::Truncated),
        ("tag 1", group(Header { tag: 1, ..h }, &[0x49]), DecodeError::BadGroup),
        (
            "size class 3",
            group(Header { class: 3, ..h }, &[0x49]),
            DecodeError::BadGroup,
        ),
        (
            "no runs",
            group(
                Header {
                    runs: 0,
                    span: 0,
                    dw: 0,
                    ..h
                },
                &[],
            ),
            DecodeError::BadGroup,
        ),
        (
            "1,025 runs",
            group(
                Header {
                    runs: 1025,
                    dw: 0,
                    span: 1024,
                    ..h
                },
                &[],
            ),
            DecodeError::BadGroup,
        ),
        ("dw 41", group(Header { dw: 41, ..h }, &[0; 12]), DecodeError::BadGroup),
        (
            "dead slots",
            group(Header { dead: 1, ..h }, &[0x49]),
            DecodeError::BadGroup,
        ),
        (
            "cw 31",
            group(
                Header {
                    cw: 31,
                    dw: 0,
                    runs: 1,
                    span: 0,
                    ..h
                },
                &[0; 8],
            ),
            DecodeError::BadGroup,
        ),
        (
            "a span the gaps do not reach",
            group(Header { span: 16, ..h }, &[0x49]),
            DecodeError::BadGroup,
        ),
        (
            "a gap past the span",
            group(Header { span: 14, ..h }, &[0x49]),
            DecodeError::BadGroup,
        ),
        (
            "a wider gap than needed",
            group(Header { dw: 5, ..h }, &[9 | 4 << 5, 0]),
            DecodeError::NotCanonical,
        ),
        (
            "count bits that are all zero",
            {
                // cw 1 where 0 would do: entries (30 bits) 3, counts - 1 all 0.
                let wide = Header { cw: 1, ..h };
                let slots = wide.layout();
                let mut bytes = vec![0u8; slots.bytes(3)];
                wide.write(&mut bytes[..16]);
                set_bits(&mut bytes, DATA_BITS, ENTRIES_BITS, 3);
                set_bits(&mut bytes, slots.gap_pos(1), 4, 9);
                set_bits(&mut bytes, slots.gap_pos(2), 4, 4);
                bytes
            },
            DecodeError::NotCanonical,
        ),
        (
            "padding bits set",
            group(Header { runs: 2, span: 10, ..h }, &[9 | 1 << 7]),
            DecodeError::NotCanonical,
        ),
        (
            "stamp 2^53",
            group(
                Header {
                    first_ms: MAX_EXACT_MS,
                    runs: 2,
                    span: 1,
                    dw: 0,
                    ..h
                },
                &[],
            ),
            DecodeError::StampRange,
        ),
        (
            "groups out of order",
            [
                &good[..],
                &group(
                    Header {
                        first_ms: 25,
                        runs: 1,
                        span: 0,
                        dw: 0,
                        ..h
                    },
                    &[],
                )[..],
            ]
            .concat(),
            DecodeError::Unsorted,
        ),
        (
            "a group split early",
            [
                &group(
                    Header {
                        runs: 1,
                        span: 0,
                        dw: 0,
                        ..h
                    },
                    &[],
                )[..],
                &group(
                    Header {
                        first_ms: 20,
                        runs: 1,
                        span: 0,
                        dw: 0,
                        ..h
                    },
                    &[],
                )[..],
            ]
            .concat(),
            DecodeError::NotCanonical,
        ),
        (
            "an entry count that lies",
            group(
                Header {
                    cw: 1,
                    runs: 1,
                    span: 0,
                    dw: 0,
                    ..h
                },
                &[3, 0, 0, 0, 1],
            ),
            DecodeError::BadGroup,
        ),
        (
            "1e9 + 1 entries",
            {
                let mut log = RunLog::default();
                log.record(5, MAX_ENTRIES);
                let mut bytes = canonical(&log);
                bytes.extend(group(
                    Header {
                        first_ms: 6,
                        runs: 1,
                        span: 0,
                        dw: 0,
                        cw: 0,
                        tag: 0,
                        class: 0,
                        dead: 0,
                    },
                    &[],
                ));
                bytes
            },
            DecodeError::TooMany,
        ),
    ];
    for (case, bytes, expected) in cases {
        assert_eq!(
            RunLog::decode(&bytes).map(|l| l.len()),
            Err(expected),
            "{case}: {bytes:?}"
        );
    }
    // The largest stamp and count, and 1,025 runs (two groups), are accepted.
    let mut log = RunLog::default();
    log.record(MAX_EXACT_MS, MAX_ENTRIES);
    assert_eq!(
        RunLog::decode(&canonical(&log)).unwrap().runs().collect::<Vec<_>>(),
        [(MAX_EXACT_MS, MAX_ENTRIES)]
    );
    // Under Miri (some 10,000 times slower) the 1,025 runs are left out: a
    // payload of several groups is decoded below (`far`, cut by its span).
    if !cfg!(miri) {
        let many = RunLog::from_runs((0..1025).map(|i| (T + 3 * i, 1)));
        let bytes = canonical(&many);
        assert_eq!(Header::read(&bytes).runs, 1024);
        assert_eq!(RunLog::decode(&bytes).unwrap().len(), 1025);
    }
    // A span of 2^40 ms or more starts a new group.
    let far = RunLog::from_runs([(0, 1), (MAX_SPAN as i64, 1), (MAX_SPAN as i64 + 1, 1)]);
    let bytes = canonical(&far);
    assert_eq!(Header::read(&bytes).runs, 2);
    assert_eq!(RunLog::decode(&bytes).unwrap().runs().count(), 3);
}

#[test]
fn trim_frees_expired_blocks_and_reads_nothing_when_nothing_expired() {
    // Under Miri (some 10,000 times slower): 600 entries 2^30 ms apart
    // (30-bit slots): the inline block of 269 that overflowed (freed by the
    // trim of half) and some 6 blocks of 64 after it.
    let (n, gap, min_blocks, min_freed) = if cfg!(miri) {
        (600, 1 << 30, 5, 1)
    } else {
        (10_000, 1000, 11, 22)
    };
    let mut log = RunLog::default();
    for i in 0..n {
        log.record(T + i * gap, 1);
    }
    let Form::Large(blocks) = log.form() else {
        panic!("{:?}", log.form())
    };
    assert!(blocks >= min_blocks, "{blocks} blocks");
    let before = block_pointers(&log);
    assert_eq!(log.trim(T - 1), 0);
    assert_eq!(
        block_pointers(&log),
        before,
        "a trim with nothing expired changes nothing"
    );
    assert_eq!(log.trim(T + (n / 2 - 1) * gap), n as u64 / 2);
    assert_eq!(log.len(), n as u64 / 2);
    assert_eq!(log.runs().next(), Some((T + n / 2 * gap, 1)));
    let Form::Large(left) = log.form() else { panic!() };
    // The first block (the inline one that overflowed) held 807 entries,
    // the others about 190: some 23 blocks are gone (natively).
    assert!(left <= blocks - min_freed, "{left} of {blocks} blocks left");
    assert_eq!(log.trim(T + (n - 2) * gap), n as u64 / 2 - 1);
    assert_eq!(log.form(), Form::Inline, "one block left: inline again");
    assert_eq!(log.trim(T + n * gap), 1);
    assert!(log.is_empty());
    assert_eq!(log.runs().count(), 0);
    assert_eq!(log.newest(), None);
}

/// A trim marks slots dead and shifts nothing until 127 are dead or the
/// block needs their room; a window in a steady state (trim one, add
/// one) keeps its allocation.
#[test]
fn trims_shift_bits_out_once_per_127_runs_and_the_room_is_reused() {
    // Under Miri (some 10,000 times slower): 300 entries, 300 calls of the
    // steady state (the shift at 128 dead slots happens as often).
    let (fill, steady) = if cfg!(miri) { (300, 300) } else { (600, 10_000) };
    let mut log = RunLog::default();
    for i in 0..fill {
        log.record(T + i * 1000, 1);
    }
    let Some(RootRef::Inline(block)) = log.root() else {
        panic!()
    };
    let (size, before) = (block.size(), block.as_ptr());
    for i in 0..127 {
        assert_eq!(log.trim(T + i * 1000), 1);
        let Some(RootRef::Inline(block)) = log.root() else {
            panic!()
        };
        assert_eq!(block.header().dead, i as u32 + 1);
        assert_eq!(block.as_ptr(), before, "a trim moves nothing");
    }
    assert_eq!(log.trim(T + 127 * 1000), 1);
    let Some(RootRef::Inline(block)) = log.root() else {
        panic!()
    };
    assert_eq!(
        (block.header().dead, block.header().runs),
        (0, fill as u32 - 128),
        "shifted out at 128"
    );
    assert_eq!(log.runs().next(), Some((T + 128 * 1000, 1)));
    // Steady state: one trimmed, one added, 10,000 times: no growth.
    for i in fill..fill + steady {
        log.record(T + i * 1000, 1);
        assert_eq!(log.trim(T + (i - fill + 128) * 1000), 1);
        assert_eq!(log.len(), fill as u64 - 128);
    }
    let Some(RootRef::Inline(block)) = log.root() else {
        panic!()
    };
    assert!(block.size() <= size, "{} B, {size} B before", block.size());
    assert_eq!(
        canonical(&log),
        canonical(&RunLog::from_runs(log.runs().collect::<Vec<_>>()))
    );
}

/// Every index entry agrees with its block, and the root's count with
/// the index; every block has a live run, and its size class holds it.
fn assert_consistent(log: &RunLog) {
    let check = |block: &Block| {
        let header = block.header();
        assert!(header.dead <= MAX_DEAD && header.dead <= header.runs, "{header:?}");
        assert!(header.layout().bytes(header.runs) <= block.size(), "{header:?}");
        let runs: Vec<(i64, u64)> = block.runs().collect();
        assert_eq!(runs.len() as u32, header.live());
        if let (Some(first), Some(last)) = (runs.first(), runs.last()) {
            assert_eq!((first.0, last.0), (header.first_ms, header.last_ms()));
        }
        assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), block.entries());
    };
    match log.root() {
        None => {}
        Some(RootRef::Inline(block)) => check(block),
        Some(RootRef::Large(large)) => {
            assert!(large.refs().len() >= 2);
            for r in large.refs() {
                check(&r.block);
                assert!(r.block.live_runs() > 0);
                assert_eq!(
                    (r.first_ms, u64::from(r.entries)),
                    (r.block.first_ms(), r.block.entries())
                );
            }
            assert_eq!(
                large.entries(),
                large.refs().iter().map(|r| u64::from(r.entries)).sum::<u64>()
            );
        }
    }
}

/// What `XCLOAK.ALLOW` does to a window at its limit, call after call:
/// one run trimmed, one added (in place, the hot path), at sizes around
/// every boundary (a class, MAX_DEAD, the inline capacity, a block of a
/// large window), with lone entries and with runs of several; the log
/// stays exactly the reference's and consistent throughout.
#[test]
fn a_window_at_its_limit_trims_one_and_adds_one() {
    // Under Miri (some 10,000 times slower): a window of 2, 130 calls past
    // the fill (its dead slots reach MAX_DEAD and are shifted out), lone
    // entries and runs of 3 (a window of 300 in the steady state is
    // `trims_shift_bits_out_once_per_127_runs_and_the_room_is_reused`, the
    // inline capacity has its own test, `behaves_like_the_reference_log`
    // the other gaps).
    let (sizes, calls, steps): (&[i64], i64, &[(i64, i64)]) = if cfg!(miri) {
        (&[2], 130, &[(1000, 1), (7, 3)])
    } else {
        (
            &[1, 2, 10, 12, 127, 128, 129, 300, 1023, 1024, 1025, 3000],
            600,
            &[(1000, 1), (1, 1), (7, 3), (70_000, 1)],
        )
    };
    for &size in sizes {
        for &(step_ms, cost) in steps {
            let mut ours = RunLog::default();
            let mut reference = VecLog::default();
            let window = size * step_ms;
            for i in 0..size + calls {
                let now = T + i * step_ms;
                let cutoff = now - window;
                assert_eq!(
                    ours.trim(cutoff),
                    reference.trim(cutoff),
                    "size {size} step {step_ms} call {i}"
                );
                ours.record(now, cost as u64);
                reference.record(now, cost as u64);
                assert_eq!(ours.len(), reference.len());
                assert_eq!(ours.newest(), reference.newest());
                if i % 37 == 0 || i >= size + calls - 10 {
                    assert_eq!(stamps(&ours), reference.0, "size {size} step {step_ms} call {i}");
                    assert_consistent(&ours);
                }
            }
            assert_eq!(
                canonical(&ours),
                canonical(&RunLog::from_runs(ours.runs().collect::<Vec<_>>()))
            );
        }
    }
}

/// `widen` re-packs every run at wider widths, from every layout to every
/// wider one, with dead slots to shift out, and keeps the runs and count.
#[test]
fn widen_keeps_every_run_at_any_wider_layout() {
    let mut rng = Rng(0x5EED);
    // Under Miri (some 10,000 times slower): blocks of 2 and 64 runs, widened
    // by two of the four steps.
    let (run_counts, extras): (&[usize], &[(u32, u32)]) = if cfg!(miri) {
        (&[2, 64], &[(0, 1), (3, 2)])
    } else {
        (&[1, 2, 9, 64, 100], &[(0, 1), (1, 0), (3, 2), (9, 0)])
    };
    for (dw, cw) in [(0u32, 0u32), (0, 3), (5, 0), (10, 0), (7, 2), (12, 9), (33, 0), (3, 20)] {
        for &runs in run_counts {
            let mut stamp = T;
            let mut list = Vec::new();
            for i in 0..runs {
                if i > 0 {
                    stamp += 1 + (rng.next() & mask(dw)) as i64;
                }
                list.push((stamp, 1 + (rng.next() & mask(cw))));
            }
            let Some(slots) = (0..runs).try_fold(Slots { dw: 0, cw: 0 }, |slots, i| {
                let gap = if i > 0 { (list[i].0 - list[i - 1].0) as u64 } else { 1 };
                Some(Slots {
                    dw: slots.dw.max(width_of(gap - 1)),
                    cw: slots.cw.max(width_of(list[i].1 - 1)),
                })
            }) else {
                unreachable!()
            };
            if slots.bytes(runs as u32) + 64 > BLOCK_BYTES {
                continue;
            }
            for &(extra_dw, extra_cw) in extras {
                let (mut block, taken) = Block::pack(&list, INLINE);
                assert_eq!(taken, runs);
                let dead = (runs as u32 - 1).min(2);
                let expired = block.runs().take(dead as usize).map(|r| r.1).sum::<u64>();
                if dead > 0 {
                    block.drop_front(dead, expired, list[dead as usize].0);
                }
                let to = Slots {
                    dw: (slots.dw + extra_dw).min(40),
                    cw: (slots.cw + extra_cw).min(30),
                };
                if to.bytes(runs as u32) > BLOCK_BYTES {
                    continue;
                }
                block.reserve(to.bytes(runs as u32));
                block.widen(to);
                let header = block.header();
                assert_eq!(
                    (header.dw, header.cw, header.dead),
                    (to.dw, to.cw, 0),
                    "{dw}/{cw} -> {to:?}"
                );
                assert_eq!(
                    block.runs().collect::<Vec<_>>(),
                    list[dead as usize..],
                    "{dw}/{cw} -> {to:?}, {runs} runs"
                );
                assert_eq!(block.entries(), list[dead as usize..].iter().map(|r| r.1).sum::<u64>());
            }
        }
    }
}

#[test]
fn remove_at_takes_only_that_stamp_and_at_most_count() {
    let mut log = RunLog::default();
    for (stamp, cost) in [(10, 2), (20, 3), (30, 2)] {
        log.record(stamp, cost);
    }
    assert_eq!(log.remove_at(30, 1), 1, "the newest run, in place");
    assert_eq!(log.remove_at(20, 5), 3, "never more than the run holds");
    assert_eq!(log.remove_at(15, 1), 0);
    assert_eq!(log.remove_at(31, 1), 0);
    assert_eq!(log.remove_at(30, 1), 1, "empties the newest run");
    assert_eq!(stamps(&log), [10, 10]);
    assert_eq!(log.newest(), Some(10));
    assert_eq!(log.remove_at(10, 2), 2);
    assert!(log.is_empty());
    // A middle run whose neighbours' gap is wider than the block's width.
    let mut log = RunLog::default();
    for stamp in [0, 1, 2, 3] {
        log.record(stamp, 1);
    }
    assert_eq!(log.remove_at(1, 1), 1);
    assert_eq!(log.remove_at(2, 1), 1);
    assert_eq!(stamps(&log), [0, 3]);
    assert_eq!(canonical(&log), canonical(&RunLog::from_runs([(0, 1), (3, 1)])));
}

/// Refunds change one block: the newest in O(1), any other by a binary
/// search of the index and a rewrite of its block only.
#[test]
fn a_refund_changes_one_block_and_the_newest_is_found_from_the_header() {
    // Under Miri (some 10,000 times slower), 598 entries 2^30 ms apart
    // (31-bit slots): still some 10 blocks under an index (and `middle` a
    // multiple of 3, as with 100,000).
    let (n, gap): (i64, i64) = if cfg!(miri) { (598, 1 << 30) } else { (100_000, 1000) };
    let mut log = RunLog::default();
    for i in 0..n {
        log.record(T + i * gap, 1 + (i % 3 == 0) as u64);
    }
    let before = block_pointers(&log);
    let entries = log.len();
    // The newest: only the last block (and the root, if it moved) may change.
    assert_eq!(log.remove_at(T + (n - 1) * gap, 1), 1);
    let after = block_pointers(&log);
    assert_eq!(after.len(), before.len());
    assert_eq!(after[1..after.len() - 1], before[1..before.len() - 1]);
    // A middle stamp: one block changes.
    let middle = n / 2 + 1; // a multiple of 3: a run of two entries
    assert_eq!(middle % 3, 0);
    assert_eq!(log.remove_at(T + middle * gap, 1), 1);
    let after = block_pointers(&log);
    let changed = after.iter().zip(&before).skip(1).filter(|(a, b)| a != b).count();
    assert!(changed <= 2, "{changed} blocks moved");
    assert_eq!(log.len(), entries - 2);
    // Stamps 0..=middle, a third of them (0, 3, ..., middle) with two entries, one refunded.
    assert_eq!(
        log.count_expired(T + middle * gap),
        (middle + 1 + middle / 3 + 1 - 1) as u64
    );
}

/// A window at the inline capacity, one below and one above it, under
/// admissions, trims and refunds: the form moves at exactly the capacity,
/// both ways, and every answer is the reference's.
///
/// Not under Miri (over a minute there even at its smallest): the moves
/// between the forms run under Miri in `canonical_bytes_round_trip_...`
/// (inline to large by admissions; refunds and a trim in a large window),
/// `trim_frees_expired_blocks_...` (large to inline by trims) and
/// `behaves_like_the_reference_log`; only a refund that moves a window back
/// inline is left to the native run.
#[test]
#[cfg_attr(miri, ignore)]
fn the_inline_capacity_boundary() {
    // (gap between lone entries, runs one block holds): 1 ms apart, slots
    // of 0 bits, BLOCK_RUNS runs; 1,000 ms apart, 10 bits, (1008 * 8) / 10 + 1.
    for (gap, capacity) in [(1i64, BLOCK_RUNS as i64), (1000, 807)] {
        for size in [capacity - 1, capacity, capacity + 1] {
            let fill = |log: &mut RunLog, reference: &mut VecLog| {
                for i in 0..size {
                    log.record(T + i * gap, 1);
                    reference.record(T + i * gap, 1);
                }
            };
            let inline_at = |n: i64| if n <= capacity { Form::Inline } else { Form::Large(2) };
            let check = |log: &RunLog, reference: &VecLog, what: &str| {
                assert_eq!(stamps(log), reference.0, "{what}");
                assert_eq!(log.len(), reference.len(), "{what}");
                assert_eq!(log.newest(), reference.newest(), "{what}");
                for cutoff in [T - 1, T, T + gap * size / 2, T + gap * (size - 1)] {
                    assert_eq!(
                        log.count_expired(cutoff),
                        reference.count_expired(cutoff),
                        "{what} {cutoff}"
                    );
                    assert_eq!(
                        log.nth_live(cutoff, 1),
                        reference.nth_live(cutoff, 1),
                        "{what} {cutoff}"
                    );
                }
                assert_eq!(
                    RunLog::decode(&canonical(log)).unwrap().runs().collect::<Vec<_>>(),
                    log.runs().collect::<Vec<_>>()
                );
            };
            let what = format!("gap {gap}, {size} entries (capacity {capacity})");
            // Admissions.
            let (mut log, mut reference) = (RunLog::default(), VecLog::default());
            fill(&mut log, &mut reference);
            assert_eq!(log.form(), inline_at(size), "{what}");
            check(&log, &reference, &what);
            // One more admission, then its refund: across the boundary and back.
            log.record(T + size * gap, 1);
            reference.record(T + size * gap, 1);
            assert_eq!(log.form(), inline_at(size + 1), "{what}, one more");
            check(&log, &reference, &what);
            assert_eq!(log.remove_at(T + size * gap, 1), 1);
            reference.remove_at(T + size * gap, 1);
            assert_eq!(log.form(), inline_at(size), "{what}, refunded");
            check(&log, &reference, &what);
            // A refund of the oldest and one in the middle.
            for stamp in [T, T + gap * (size / 2)] {
                assert_eq!(log.remove_at(stamp, 1), reference.remove_at(stamp, 1));
                check(&log, &reference, &format!("{what}, refund of {stamp}"));
            }
            // Trims: the oldest one, then all but the newest.
            let (mut log, mut reference) = (RunLog::default(), VecLog::default());
            fill(&mut log, &mut reference);
            assert_eq!(log.trim(T), reference.trim(T));
            check(&log, &reference, &format!("{what}, trimmed 1"));
            assert_eq!(log.trim(T + gap * (size - 2)), reference.trim(T + gap * (size - 2)));
            assert_eq!(log.form(), Form::Inline, "{what}: one entry left");
            check(&log, &reference, &format!("{what}, trimmed to 1"));
            // A step back into the full window.
            let (mut log, mut reference) = (RunLog::default(), VecLog::default());
            fill(&mut log, &mut reference);
            if gap > 1 {
                log.record(T + gap / 2, 1);
                reference.record(T + gap / 2, 1);
                check(&log, &reference, &format!("{what}, a step back"));
            }
        }
    }
}

/// The compact log answers every `Log` question exactly as the sorted
/// reference does, over random operations, older stamps and refunds
/// included, in windows from one entry to many blocks; its canonical bytes
/// (both versions) decode back to the same entries.
#[test]
fn behaves_like_the_reference_log() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // Under Miri (some 10,000 times slower): 8 rounds (round 0 big, with
    // gaps wider than a block's span: large windows; round 7 small, with
    // them), the big one of 100 steps, the small ones checked every tenth
    // step and at their last, a large cost up to 100 (not 10,000: the
    // reference log holds one element per entry).
    let (rounds, big_steps, small_checks, large_cost) = if cfg!(miri) {
        (8, 100, 10, 100)
    } else {
        (300, 3000, 1, 10_000)
    };
    for round in 0..rounds {
        let mut ours = RunLog::default();
        let mut reference = VecLog::default();
        let mut now: i64 = 1_000_000 + rng.below(1000) as i64;
        let big = round % 10 == 0;
        let steps = if big { big_steps } else { 20 + round % 200 };
        for step in 0..steps {
            now = match rng.below(10) {
                0 => now,
                1 => now - rng.below(50) as i64,          // a clock step back
                2 => now + 1000 + rng.below(5000) as i64, // a long pause
                3 if round % 7 == 0 => now + (1 << 40),   // a gap wider than a block's span
                _ => now + rng.below(70) as i64,
            }
            .clamp(0, MAX_EXACT_MS);
            let cutoff = if big {
                now - 1 - rng.below(200_000) as i64
            } else {
                now - 1 - rng.below(2000) as i64
            };
            match rng.below(if big { 12 } else { 6 }) {
                0 => assert_eq!(ours.trim(cutoff), reference.trim(cutoff)),
                1 => {
                    let stamp = reference
                        .0
                        .get(rng.below(reference.0.len() as u64 + 1) as usize)
                        .copied()
                        .unwrap_or(now);
                    let count = 1 + rng.below(3);
                    assert_eq!(
                        ours.remove_at(stamp, count),
                        reference.remove_at(stamp, count),
                        "remove_at({stamp}, {count})"
                    );
                }
                _ => {
                    let cost = if !big && rng.below(50) == 0 {
                        1 + rng.below(large_cost)
                    } else {
                        1 + rng.below(3)
                    };
                    ours.record(now, cost);
                    reference.record(now, cost);
                }
            }
            if big && step % 50 != 0 || !big && step % small_checks != 0 && step + 1 != steps {
                continue;
            }
            assert_eq!(ours.len(), reference.len());
            assert_eq!(ours.count_expired(cutoff), reference.count_expired(cutoff));
            assert_eq!(ours.newest(), reference.newest());
            for n in [1, 2, 3, 7, 500] {
                assert_eq!(ours.nth_live(cutoff, n), reference.nth_live(cutoff, n), "n={n}");
            }
            assert_eq!(stamps(&ours), reference.0);
            assert_consistent(&ours);
            if !ours.is_empty() {
                assert_eq!(stamps(&RunLog::decode(&canonical(&ours)).unwrap()), reference.0);
                assert_eq!(stamps(&RunLog::decode_runs(&runs_bytes(&ours)).unwrap()), reference.0);
                assert_eq!(canonical(&ours.clone()), canonical(&ours));
            }
        }
    }
}
