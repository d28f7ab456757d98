//! Hostile payloads for the compact form (`xcloaklog`): `RESTORE` payloads with
//! a valid checksum but crafted contents are refused ("Bad data format"), or
//! loaded as a window every command then handles; the server never crashes,
//! hangs, or changes any other key. The internal `XCLOAK.APPLY` is refused to
//! clients however it is sent.
//!
//! The payloads are built here, byte by byte, by encoders of this file (not
//! the module's): the framing is learnt from (and checked against) a real
//! `DUMP`:
//!
//! ```text
//! 07                          RDB_TYPE_MODULE_2
//! 81 <8 bytes big-endian>     module type id (RDB length encoding); low 10 bits: encoding version
//! 02 <length>                 RDB_MODULE_OPCODE_UINT, the entry count
//! 05 <length> <bytes>         RDB_MODULE_OPCODE_STRING, the canonical runs
//! 00                          RDB_MODULE_OPCODE_EOF
//! <2 bytes LE>                RDB version
//! <8 bytes LE>                CRC-64 (Jones, reflected) of everything before it
//! ```
//!
//! Both encodings the module reads are attacked: version 2 (what it writes:
//! groups of up to 1,024 runs, each a 16-byte header and bit-packed slots:
//!
//! ```text
//! word 0   first stamp (53 bits) | gap width dw (6) | count width cw (5)
//! word 1   tag 0 (1) | size class 0 (5) | runs (11) | dead slots 0 (7) | span (40)
//! bits     [entries (30) if cw > 0] count-1 | gap-1 count-1 | ... zero padding to a byte
//! ```
//! )
//! and version 1 (0.1.0's varint runs). A version 1 payload that loads must
//! dump back as the version 2 payload of the same window.
//!
//! Every case runs on two servers, `sanitize-dump-payload no` (the default)
//! and `yes`, and must give the same outcome on both: the server's deep
//! sanitization knows only core encodings, so the module validates by itself.
use crate::common;
use common::*;

use redis::{Connection, Value};

const MAX_EXACT_MS: u64 = 9_007_199_254_740_991;
const MAX_ENTRIES: u64 = 1_000_000_000;
const T: u64 = 1_700_000_000_000;
const VICTIM: &str = "victim";

// ---------------------------------------------------------------------------
// Encoders: RDB lengths, CRC-64, the module's canonical runs.

/// Redis' `crc64` (crc64.c): Jones polynomial 0xad93d23594c935a9, reflected,
/// initial value 0, no final xor.
fn crc64(bytes: &[u8]) -> u64 {
    const REFLECTED_POLY: u64 = 0x95ac_9329_ac4b_c9b5; // 0xad93d23594c935a9 bit-reversed
    let mut crc = 0u64;
    for &byte in bytes {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ REFLECTED_POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// RDB length encoding (rdbSaveLen): 6 bits, 14 bits, 32 or 64 bits big-endian.
fn rdb_len(value: u64) -> Vec<u8> {
    if value < 1 << 6 {
        vec![value as u8]
    } else if value < 1 << 14 {
        vec![0x40 | (value >> 8) as u8, value as u8]
    } else if value <= u64::from(u32::MAX) {
        let mut out = vec![0x80];
        out.extend_from_slice(&(value as u32).to_be_bytes());
        out
    } else {
        let mut out = vec![0x81];
        out.extend_from_slice(&value.to_be_bytes());
        out
    }
}

/// Reads one RDB length at `pos` (the inverse of `rdb_len`, for the real DUMP).
fn read_rdb_len(bytes: &[u8], pos: &mut usize) -> u64 {
    let first = bytes[*pos];
    *pos += 1;
    match first >> 6 {
        0 => u64::from(first & 0x3f),
        1 => {
            let value = u64::from(first & 0x3f) << 8 | u64::from(bytes[*pos]);
            *pos += 1;
            value
        }
        _ => {
            let width = match first {
                0x80 => 4,
                0x81 => 8,
                other => panic!("not a plain RDB length: {other:#x}"),
            };
            let value = bytes[*pos..*pos + width]
                .iter()
                .fold(0u64, |v, &b| v << 8 | u64::from(b));
            *pos += width;
            value
        }
    }
}

fn varint(mut value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
    out
}

/// One run as the module writes it: varint(delta << 1 | multi) [varint(count)].
fn run(delta: u64, count: u64) -> Vec<u8> {
    let mut out = varint(delta << 1 | u64::from(count > 1));
    if count > 1 {
        out.extend(varint(count));
    }
    out
}

/// The version 1 bytes of `(stamp, count)` runs, stamps increasing.
fn canonical_v1(runs: &[(u64, u64)]) -> Vec<u8> {
    let mut previous = 0;
    runs.iter()
        .flat_map(|&(stamp, count)| {
            let bytes = run(stamp - previous, count);
            previous = stamp;
            bytes
        })
        .collect()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Version 2: `value` in `width` bits at bit `pos`, bit by bit (little-endian bit order).
fn put_bits(data: &mut [u8], pos: usize, width: u32, value: u64) {
    for bit in 0..width as usize {
        if value >> bit & 1 == 1 {
            data[(pos + bit) / 8] |= 1 << ((pos + bit) % 8);
        }
    }
}

fn width(value: u64) -> u32 {
    64 - value.leading_zeros()
}

/// A version 2 group's header and slots, with the widths given (None: the
/// smallest) and the header fields as a writer would set them, then `tweak`ed.
#[derive(Clone, Copy, Debug)]
struct Group {
    first: u64,
    dw: u32,
    cw: u32,
    tag: u64,
    class: u64,
    runs: u64,
    dead: u64,
    span: u64,
    entries: u64,
}

impl Group {
    fn of(runs: &[(u64, u64)]) -> Group {
        let first = runs[0].0;
        let dw = runs.windows(2).map(|w| width(w[1].0 - w[0].0 - 1)).max().unwrap_or(0);
        let cw = runs.iter().map(|&(_, count)| width(count - 1)).max().unwrap();
        let span = runs[runs.len() - 1].0 - first;
        Group {
            first,
            dw,
            cw,
            tag: 0,
            class: 0,
            runs: runs.len() as u64,
            dead: 0,
            span,
            entries: runs.iter().map(|r| r.1).sum(),
        }
    }

    /// The bytes of `runs` (their gaps and counts) laid out as this header says.
    fn bytes(&self, runs: &[(u64, u64)]) -> Vec<u8> {
        let w0 = self.first | u64::from(self.dw) << 53 | u64::from(self.cw) << 59;
        let w1 = self.tag | self.class << 1 | self.runs << 6 | self.dead << 17 | self.span << 24;
        let base = if self.cw > 0 { 30 } else { 0 };
        let slot = (self.dw + self.cw) as usize;
        let bits = base + self.cw as usize + (runs.len().max(1) - 1) * slot;
        let mut data = vec![0u8; bits.div_ceil(8)];
        if self.cw > 0 {
            put_bits(&mut data, 0, 30, self.entries);
        }
        for (i, &(stamp, count)) in runs.iter().enumerate() {
            let mut pos = base;
            if i > 0 {
                pos += self.cw as usize + (i - 1) * slot;
                put_bits(&mut data, pos, self.dw, stamp - runs[i - 1].0 - 1);
                pos += self.dw as usize;
            }
            put_bits(&mut data, pos, self.cw, count - 1);
        }
        cat(&[&w0.to_le_bytes(), &w1.to_le_bytes(), &data])
    }
}

/// The version 2 bytes of `(stamp, count)` runs: groups of up to 1,024 runs,
/// a new one also where the span from the group's first stamp would reach 2^40.
fn canonical(runs: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < runs.len() {
        let mut end = start + 1;
        while end < runs.len() && end - start < 1024 && runs[end].0 - runs[start].0 < 1 << 40 {
            end += 1;
        }
        out.extend(Group::of(&runs[start..end]).bytes(&runs[start..end]));
        start = end;
    }
    out
}

/// A saved field of the module value.
#[derive(Clone)]
enum Field {
    /// RDB_MODULE_OPCODE_UINT and its value.
    Uint(u64),
    /// RDB_MODULE_OPCODE_STRING and its bytes.
    Str(Vec<u8>),
    /// Bytes written as they are (a wrong opcode, a lying length...).
    Raw(Vec<u8>),
}

/// The framing a real DUMP showed: the type id and the RDB version.
#[derive(Clone, Copy)]
struct Frame {
    type_id: u64,
    rdb_version: [u8; 2],
}

impl Frame {
    fn with_encver(self, encver: u64) -> Frame {
        Frame {
            type_id: self.type_id & !1023 | encver,
            ..self
        }
    }

    /// A DUMP payload of these fields: type 7, id, fields, EOF, version, CRC.
    fn payload(&self, fields: &[Field]) -> Vec<u8> {
        let mut body = vec![7];
        body.extend(rdb_len(self.type_id));
        for field in fields {
            match field {
                Field::Uint(value) => {
                    body.push(2);
                    body.extend(rdb_len(*value));
                }
                Field::Str(bytes) => {
                    body.push(5);
                    body.extend(rdb_len(bytes.len() as u64));
                    body.extend_from_slice(bytes);
                }
                Field::Raw(bytes) => body.extend_from_slice(bytes),
            }
        }
        body.push(0);
        self.seal(body)
    }

    /// Appends the RDB version and the CRC-64 to a body.
    fn seal(&self, mut body: Vec<u8>) -> Vec<u8> {
        body.extend_from_slice(&self.rdb_version);
        let crc = crc64(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        body
    }

    /// A payload of a window: the right count, the canonical bytes (version 2).
    fn window(&self, runs: &[(u64, u64)]) -> Vec<u8> {
        let count = runs.iter().map(|r| r.1).sum();
        self.with_encver(2)
            .payload(&[Field::Uint(count), Field::Str(canonical(runs))])
    }

    /// The same window in 0.1.0's encoding (version 1).
    fn window_v1(&self, runs: &[(u64, u64)]) -> Vec<u8> {
        let count = runs.iter().map(|r| r.1).sum();
        self.with_encver(1)
            .payload(&[Field::Uint(count), Field::Str(canonical_v1(runs))])
    }
}

// ---------------------------------------------------------------------------
// Server side.

fn compact_server(sanitize: bool) -> Server {
    ServerConfig::default()
        .module_args(&["STORAGE", "compact"])
        .arg("sanitize-dump-payload", if sanitize { "yes" } else { "no" })
        // DUMP writes strings as they are (no LZF), so a canonical payload
        // dumps back byte for byte.
        .arg("rdbcompression", "no")
        .start()
}

/// Windows in both forms and a key of other types: what must never change.
fn populate(conn: &mut Connection) {
    for (key, stamps) in [("rl:one", &[T][..]), ("rl:runs", &[T, T, T + 1, T + 70, T + 9000][..])] {
        for &now in stamps {
            let _: i64 = redis::cmd("XCLOAK.ALLOW")
                .arg(key)
                .arg(86_400_000)
                .arg(100)
                .arg("NOW")
                .arg(now)
                .query(conn)
                .unwrap();
        }
        // Never expires during the test (so the digest is stable).
        let _: i64 = redis::cmd("PERSIST").arg(key).query(conn).unwrap();
    }
    let _: () = redis::cmd("ZADD").arg("rl:zset").arg(1).arg("a").query(conn).unwrap();
    let _: () = redis::cmd("SET").arg("string").arg("v").query(conn).unwrap();
    let _: () = redis::cmd("HSET").arg("hash").arg("f").arg("v").query(conn).unwrap();
}

/// Learns the framing from `DUMP rl:one` (one entry at T) and checks every
/// byte of it against this file's encoders.
fn learn_frame(conn: &mut Connection) -> Frame {
    let dump: Vec<u8> = redis::cmd("DUMP").arg("rl:one").query(conn).unwrap();
    let n = dump.len();
    assert!(n > 12, "{dump:?}");
    assert_eq!(dump[0], 7, "RDB_TYPE_MODULE_2: {dump:?}");
    assert_eq!(
        crc64(&dump[..n - 8]),
        u64::from_le_bytes(dump[n - 8..].try_into().unwrap()),
        "CRC-64 of {dump:?}"
    );
    let mut pos = 1;
    let type_id = read_rdb_len(&dump, &mut pos);
    assert_eq!(
        type_id & 1023,
        2,
        "encoding version 2 in the low 10 bits of {type_id:#x}"
    );
    assert_eq!(dump[pos], 2, "UINT opcode");
    pos += 1;
    assert_eq!(read_rdb_len(&dump, &mut pos), 1, "entry count");
    assert_eq!(dump[pos], 5, "STRING opcode");
    pos += 1;
    let len = read_rdb_len(&dump, &mut pos) as usize;
    assert_eq!(&dump[pos..pos + len], canonical(&[(T, 1)]).as_slice(), "canonical runs");
    pos += len;
    assert_eq!(dump[pos], 0, "EOF opcode");
    assert_eq!(pos + 1 + 2 + 8, n, "then 2 bytes of RDB version and 8 of CRC");
    let frame = Frame {
        type_id,
        rdb_version: [dump[n - 10], dump[n - 9]],
    };
    assert_eq!(
        frame.window(&[(T, 1)]),
        dump,
        "this file's encoder rebuilds the real DUMP"
    );
    // And a window of several runs, to check the multi flag and counts.
    let dump: Vec<u8> = redis::cmd("DUMP").arg("rl:runs").query(conn).unwrap();
    assert_eq!(frame.window(&[(T, 2), (T + 1, 1), (T + 70, 1), (T + 9000, 1)]), dump);
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca, "crc64.c's own test vector");
    frame
}

fn digest_value(conn: &mut Connection, key: &str) -> Value {
    redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(conn).unwrap()
}

fn ping(server: &Server, conn: &mut Connection, case: &str) {
    let pong: redis::RedisResult<String> = redis::cmd("PING").query(conn);
    assert_eq!(
        pong.ok().as_deref(),
        Some("PONG"),
        "{case}: the server stopped answering:\n{}",
        server.log()
    );
}

/// An integer array of the five reply fields.
fn five_integers(value: Value, what: &str) -> Vec<i64> {
    match value {
        Value::Array(items) if items.len() == 5 => items
            .into_iter()
            .map(|item| match item {
                Value::Int(i) => i,
                other => panic!("{what}: {other:?}"),
            })
            .collect(),
        other => panic!("{what}: not five fields: {other:?}"),
    }
}

/// Everything a user or the server can do with a loaded window works on the
/// restored key, and leaves it loadable: ALLOW/PEEK with DETAILS, DUMP and
/// RESTORE of that dump, COPY, MEMORY USAGE, DEBUG DIGEST-VALUE, DEBUG RELOAD.
fn exercise(server: &Server, conn: &mut Connection, case: &str) {
    let key = VICTIM;
    let kind: String = redis::cmd("TYPE").arg(key).query(conn).unwrap();
    assert_eq!(kind, "xcloaklog", "{case}");
    let usage: i64 = redis::cmd("MEMORY").arg("USAGE").arg(key).query(conn).unwrap();
    assert!(usage > 0, "{case}: MEMORY USAGE {usage}");
    let value_digest = digest_value(conn, key);

    // DUMP is canonical: it restores to the same value, and dumps identically.
    let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query(conn).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("victim:dump")
        .arg(0)
        .arg(dump.as_slice())
        .query(conn)
        .unwrap_or_else(|e| panic!("{case}: the module's own DUMP is refused: {e}"));
    let again: Vec<u8> = redis::cmd("DUMP").arg("victim:dump").query(conn).unwrap();
    assert_eq!(again, dump, "{case}: DUMP after RESTORE of a DUMP");
    assert_eq!(digest_value(conn, "victim:dump"), value_digest, "{case}");
    let copied: i64 = redis::cmd("COPY").arg(key).arg("victim:copy").query(conn).unwrap();
    assert_eq!(copied, 1, "{case}");
    assert_eq!(digest_value(conn, "victim:copy"), value_digest, "{case}: COPY");

    // Read-only first, on the three equal copies: they must agree.
    let mut peeks = Vec::new();
    for k in [key, "victim:dump", "victim:copy"] {
        let peek: Value = redis::cmd("XCLOAK.PEEK")
            .arg(k)
            .arg(60_000)
            .arg(10)
            .query(conn)
            .unwrap_or_else(|e| panic!("{case}: PEEK {k}: {e}"));
        let fields = five_integers(peek, case);
        assert!(
            (0..=10).contains(&fields[2]) && fields[3] >= -1 && fields[4] >= 0,
            "{case}: PEEK {fields:?}"
        );
        let far: Value = redis::cmd("XCLOAK.PEEK")
            .arg(k)
            .arg(MAX_EXACT_MS)
            .arg(1_000_000)
            .arg("NOW")
            .arg(MAX_EXACT_MS)
            .query(conn)
            .unwrap();
        peeks.push((fields[0], fields[1], fields[2], five_integers(far, case)));
    }
    assert!(
        peeks.windows(2).all(|w| w[0] == w[1]),
        "{case}: copies disagree: {peeks:?}"
    );

    // DEBUG RELOAD saves and loads the whole keyspace: what was accepted is
    // written back and read again, unchanged.
    let reloaded: redis::RedisResult<String> = redis::cmd("DEBUG").arg("RELOAD").query(conn);
    assert_eq!(
        reloaded.as_deref().ok(),
        Some("OK"),
        "{case}: DEBUG RELOAD {reloaded:?}\n{}",
        server.log()
    );
    let after: Vec<u8> = redis::cmd("DUMP").arg(key).query(conn).unwrap();
    assert_eq!(after, dump, "{case}: DUMP changed across DEBUG RELOAD");

    // Writes: the server clock, a step to the far end of time, limits below
    // what the window holds; then a reload of what they left.
    for (k, window, limit, now) in [
        (key, 60_000, 10, None),
        ("victim:dump", MAX_EXACT_MS, 1_000_000, Some(MAX_EXACT_MS)),
        ("victim:copy", 1, 1, Some(0)),
        ("victim:copy", 1000, 5, Some(T + 500)),
    ] {
        let mut cmd = redis::cmd("XCLOAK.ALLOW");
        cmd.arg(k).arg(window).arg(limit).arg("COST").arg(1);
        if let Some(now) = now {
            cmd.arg("NOW").arg(now);
        }
        let reply: Value = cmd
            .arg("DETAILS")
            .query(conn)
            .unwrap_or_else(|e| panic!("{case}: ALLOW {k}: {e}"));
        let fields = five_integers(reply, case);
        assert!(
            fields[1] == limit as i64 && fields[2] >= 0 && fields[3] >= -1 && fields[4] >= 0,
            "{case}: ALLOW {fields:?}"
        );
    }
    let reloaded: redis::RedisResult<String> = redis::cmd("DEBUG").arg("RELOAD").query(conn);
    assert_eq!(
        reloaded.as_deref().ok(),
        Some("OK"),
        "{case}: DEBUG RELOAD after writes {reloaded:?}\n{}",
        server.log()
    );
    ping(server, conn, case);
}

/// What a case must do.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    Refused,
    /// Loaded, and then `DUMP` gives back exactly the payload (it was canonical).
    Loaded,
    /// Loaded (a version 1 payload), and then `DUMP` gives this version 2 payload.
    LoadedAs(Vec<u8>),
    /// Either is fine (the server's own framing rules decide); if it loads,
    /// everything must work on it.
    Either,
}

/// RESTOREs `payload` as `VICTIM`, checks the outcome and everything after it,
/// and returns whether it loaded. The keyspace digest afterwards (the victim
/// and its copies deleted) must be `baseline`.
fn try_case(
    server: &Server,
    conn: &mut Connection,
    baseline: &str,
    case: &str,
    payload: &[u8],
    expect: &Expect,
) -> bool {
    let restored: redis::RedisResult<String> = redis::cmd("RESTORE").arg(VICTIM).arg(0).arg(payload).query(conn);
    ping(server, conn, case);
    let loaded = match &restored {
        Ok(_) => true,
        Err(e) => {
            let text = format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or(""));
            assert!(text.contains("Bad data format"), "{case}: refused with {text}");
            let exists: i64 = redis::cmd("EXISTS").arg(VICTIM).query(conn).unwrap();
            assert_eq!(exists, 0, "{case}: a refused RESTORE left a key");
            false
        }
    };
    let dumps_as = |conn: &mut Connection, expected: &[u8]| {
        assert!(
            loaded,
            "{case}: refused a canonical payload {payload:02x?}: {restored:?}\n{}",
            server.log()
        );
        let dump: Vec<u8> = redis::cmd("DUMP").arg(VICTIM).query(conn).unwrap();
        assert_eq!(dump, expected, "{case}: the payload dumps back differently");
    };
    match expect {
        Expect::Refused => assert!(!loaded, "{case}: accepted a crafted payload {payload:02x?}"),
        Expect::Loaded => dumps_as(conn, payload),
        Expect::LoadedAs(v2) => dumps_as(conn, v2),
        Expect::Either => {}
    }
    if loaded {
        exercise(server, conn, case);
        let _: i64 = redis::cmd("DEL")
            .arg(VICTIM)
            .arg("victim:dump")
            .arg("victim:copy")
            .query(conn)
            .unwrap();
    }
    assert_eq!(digest(conn), baseline, "{case}: the rest of the keyspace changed");
    loaded
}

/// The crafted cases of version 1 (0.1.0's varint runs): (name, payload, what must happen).
fn crafted_v1(frame: &Frame) -> Vec<(String, Vec<u8>, Expect)> {
    use Expect::*;
    use Field::*;
    let v1 = frame.with_encver(1);
    let runs = [(T, 3), (T + 1, 1), (T + 70, 2)];
    let good = canonical_v1(&runs);
    let n = 6;
    let with = |bytes: Vec<u8>, count: u64| v1.payload(&[Uint(count), Str(bytes)]);
    let as_v2 = |runs: &[(u64, u64)]| LoadedAs(frame.window(runs));
    let mut cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        ("valid", with(good.clone(), n), as_v2(&runs)),
        ("valid: one entry at 0", frame.window_v1(&[(0, 1)]), as_v2(&[(0, 1)])),
        (
            "valid: stamp 2^53-1",
            frame.window_v1(&[(MAX_EXACT_MS, 1)]),
            as_v2(&[(MAX_EXACT_MS, 1)]),
        ),
        (
            "valid: 1e9 entries in one run",
            frame.window_v1(&[(T, MAX_ENTRIES)]),
            as_v2(&[(T, MAX_ENTRIES)]),
        ),
        (
            "valid: 1e9 entries over two runs",
            frame.window_v1(&[(1, MAX_ENTRIES / 2), (MAX_EXACT_MS, MAX_ENTRIES / 2)]),
            as_v2(&[(1, MAX_ENTRIES / 2), (MAX_EXACT_MS, MAX_ENTRIES / 2)]),
        ),
        // The entry count.
        ("count: one more", with(good.clone(), n + 1), Refused),
        ("count: one fewer", with(good.clone(), n - 1), Refused),
        ("count: 0", with(good.clone(), 0), Refused),
        ("count: 2^64-1", with(good.clone(), u64::MAX), Refused),
        ("count: 2^32 + 6 (u32 wrap)", with(good.clone(), (1 << 32) + n), Refused),
        // Stamps.
        // A writer that subtracted a later stamp from an earlier one: delta -50 as u64, shifted.
        (
            "unsorted: a step back of 50 ms",
            with(cat(&[&run(100, 1), &varint((-50i64 as u64) << 1)]), 2),
            Refused,
        ),
        (
            "equal stamps (second delta 0)",
            with(cat(&[&run(100, 1), &run(0, 1)]), 2),
            Refused,
        ),
        (
            "equal stamps, both multi",
            with(cat(&[&run(100, 2), &run(0, 2)]), 4),
            Refused,
        ),
        ("stamp 2^53", frame.window_v1(&[(MAX_EXACT_MS + 1, 1)]), Refused),
        (
            "stamp 2^53 reached by the second delta",
            with(cat(&[&run(MAX_EXACT_MS, 1), &run(1, 1)]), 2),
            Refused,
        ),
        ("stamp 2^63-1", with(run(i64::MAX as u64, 1), 1), Refused),
        (
            "delta overflowing i64",
            with(cat(&[&run(100, 1), &varint(u64::MAX - 1)]), 2),
            Refused,
        ),
        (
            "delta overflowing i64, multi",
            with(cat(&[&run(100, 1), &varint(u64::MAX), &varint(2)]), 3),
            Refused,
        ),
        // Counts inside the runs.
        (
            "multi flag, count 1",
            with(cat(&[&varint(T << 1 | 1), &varint(1)]), 1),
            Refused,
        ),
        (
            "multi flag, count 0",
            with(cat(&[&varint(T << 1 | 1), &varint(0)]), 0),
            Refused,
        ),
        (
            "total 1e9 + 1",
            frame.window_v1(&[(T, MAX_ENTRIES), (T + 1, 1)]),
            Refused,
        ),
        ("one run of 1e9 + 1", frame.window_v1(&[(T, MAX_ENTRIES + 1)]), Refused),
        (
            "one run of 2^32 + 2 (u32 wrap)",
            frame.window_v1(&[(T, (1 << 32) + 2)]),
            Refused,
        ),
        ("one run of 2^64-1", frame.window_v1(&[(T, u64::MAX)]), Refused),
        (
            "two runs summing past 2^64",
            with(cat(&[&run(1, u64::MAX), &run(1, u64::MAX)]), 0),
            Refused,
        ),
        // Varints.
        ("truncated varint", with(cat(&[&good, &[0x80]]), n), Refused),
        (
            "truncated: multi flag without its count",
            with(varint(T << 1 | 1), 1),
            Refused,
        ),
        (
            "truncated in the middle of the first stamp",
            with(good[..3].to_vec(), n),
            Refused,
        ),
        ("overlong varint (2 as 82 00)", with(vec![0x82, 0x00], 1), Refused),
        (
            "overlong varint of a real stamp",
            with(cat(&[&varint(T << 1)[..5], &[0x80 | varint(T << 1)[5], 0x00]]), 1),
            Refused,
        ),
        (
            "varint of 11 bytes",
            with(vec![0xff; 10].into_iter().chain([0x01]).collect(), 1),
            Refused,
        ),
        (
            "varint above 2^64",
            with(vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02], 1),
            Refused,
        ),
        ("trailing byte 00", with(cat(&[&good, &[0x00]]), n), Refused),
        ("trailing run-like bytes", with(cat(&[&good, &run(1, 1)]), n), Refused),
        ("empty string, count 0", with(Vec::new(), 0), Refused),
        ("empty string, count 1", with(Vec::new(), 1), Refused),
        // Lengths and fields of the RDB framing.
        (
            "string length 2^62",
            v1.payload(&[Uint(n), Raw(cat(&[&[5], &rdb_len(1 << 62), &good]))]),
            Refused,
        ),
        (
            "string length 1 MB past the payload",
            v1.payload(&[Uint(n), Raw(cat(&[&[5], &rdb_len(1 << 20), &good]))]),
            Refused,
        ),
        (
            "string length one past the bytes",
            v1.payload(&[Uint(n), Raw(cat(&[&[5], &rdb_len(good.len() as u64 + 1), &good]))]),
            Refused,
        ),
        (
            "string length one short of the bytes",
            v1.payload(&[Uint(n), Raw(cat(&[&[5], &rdb_len(good.len() as u64 - 1), &good]))]),
            Refused,
        ),
        ("missing field: no string", v1.payload(&[Uint(n)]), Refused),
        ("missing field: no count", v1.payload(&[Str(good.clone())]), Refused),
        ("missing fields: none", v1.payload(&[]), Refused),
        ("fields swapped", v1.payload(&[Str(good.clone()), Uint(n)]), Refused),
        (
            "extra field: a uint",
            v1.payload(&[Uint(n), Str(good.clone()), Uint(1)]),
            Refused,
        ),
        (
            "extra field: a string",
            v1.payload(&[Uint(n), Str(good.clone()), Str(good.clone())]),
            Refused,
        ),
        (
            "wrong opcode: SINT for the count",
            v1.payload(&[Raw(cat(&[&[1], &rdb_len(n)])), Str(good.clone())]),
            Refused,
        ),
        (
            "wrong opcode: DOUBLE for the count",
            v1.payload(&[Raw(cat(&[&[4], &[0; 8]])), Str(good.clone())]),
            Refused,
        ),
        (
            "wrong opcode: FLOAT for the string",
            v1.payload(&[Uint(n), Raw(cat(&[&[3], &[0; 4]]))]),
            Refused,
        ),
        (
            "wrong opcode: 9",
            v1.payload(&[Uint(n), Raw(cat(&[&[9], &rdb_len(good.len() as u64), &good]))]),
            Refused,
        ),
        (
            "no EOF opcode",
            v1.seal(cat(&[
                &[7],
                &rdb_len(v1.type_id),
                &[2],
                &rdb_len(n),
                &[5],
                &rdb_len(good.len() as u64),
                &good,
            ])),
            Refused,
        ),
        (
            "cut after the type id",
            v1.seal(cat(&[&[7], &rdb_len(v1.type_id)])),
            Refused,
        ),
        (
            "unknown module type",
            Frame {
                type_id: v1.type_id ^ 1 << 40,
                ..v1
            }
            .payload(&[Uint(n), Str(good.clone())]),
            Refused,
        ),
        // Redis' own framing, which the module does not decide.
        (
            "bytes after the EOF opcode",
            {
                let valid = with(good.clone(), n);
                v1.seal(cat(&[&valid[..valid.len() - 10], &[0xab, 0xcd]]))
            },
            Either,
        ),
        (
            "count as a 64-bit length",
            v1.payload(&[Raw(cat(&[&[2, 0x81], &n.to_be_bytes()])), Str(good.clone())]),
            Either,
        ),
        // RDB_TYPE_MODULE (version 1 framing: no opcodes, no EOF), sent by old servers.
        (
            "module type v1 framing",
            v1.seal(cat(&[
                &[6],
                &rdb_len(v1.type_id),
                &rdb_len(n),
                &rdb_len(good.len() as u64),
                &good,
            ])),
            Either,
        ),
        (
            "module type v1 framing, wrong count",
            v1.seal(cat(&[
                &[6],
                &rdb_len(v1.type_id),
                &rdb_len(n + 1),
                &rdb_len(good.len() as u64),
                &good,
            ])),
            Refused,
        ),
        // A version 2 window sent as version 1, and the reverse.
        ("version 2 bytes under version 1", with(canonical(&runs), n), Refused),
        (
            "version 1 bytes under version 2",
            frame.with_encver(2).payload(&[Uint(n), Str(good.clone())]),
            Refused,
        ),
    ];
    // An LZF-compressed string (encoding 0xc3) claiming a huge uncompressed length.
    cases.push((
        "LZF string claiming 2^40 bytes",
        v1.payload(&[
            Uint(n),
            Raw(cat(&[&[5, 0xc3], &rdb_len(4), &rdb_len(1 << 40), &[0, 1, 2, 3]])),
        ]),
        Refused,
    ));
    cases
        .into_iter()
        .map(|(name, payload, expect)| ("v1 ".to_string() + name, payload, expect))
        .collect()
}

/// The crafted cases of version 2 (groups of bit-packed runs).
fn crafted_v2(frame: &Frame) -> Vec<(String, Vec<u8>, Expect)> {
    use Expect::*;
    use Field::*;
    let v2 = frame.with_encver(2);
    let runs = [(T, 3), (T + 1, 1), (T + 70, 2), (T + 9000, 1)];
    let n = 7;
    let g = Group::of(&runs);
    let with = |bytes: Vec<u8>, count: u64| v2.payload(&[Uint(count), Str(bytes)]);
    let tweaked = |tweak: &dyn Fn(&mut Group)| {
        let mut group = g;
        tweak(&mut group);
        with(group.bytes(&runs), n)
    };
    let lone = [(T, 1), (T + 10, 1), (T + 25, 1)];
    let lone_group = Group::of(&lone);
    let many: Vec<(u64, u64)> = (0..1025).map(|i| (T + 7 * i, 1 + i % 2)).collect();
    let many_count: u64 = many.iter().map(|r| r.1).sum();
    let mut cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        ("valid", frame.window(&runs), Loaded),
        ("valid: one entry at 0", frame.window(&[(0, 1)]), Loaded),
        ("valid: stamp 2^53-1", frame.window(&[(MAX_EXACT_MS, 1)]), Loaded),
        (
            "valid: stamps 0 and 2^53-1 (groups split by the span)",
            frame.window(&[(0, 2), (MAX_EXACT_MS, 1)]),
            Loaded,
        ),
        (
            "valid: 1e9 entries in one run",
            frame.window(&[(T, MAX_ENTRIES)]),
            Loaded,
        ),
        ("valid: 1,025 runs in two groups", frame.window(&many), Loaded),
        ("valid: lone entries (no count bits)", frame.window(&lone), Loaded),
        // The entry count of the RDB field.
        ("count: one more", with(canonical(&runs), n + 1), Refused),
        ("count: one fewer", with(canonical(&runs), n - 1), Refused),
        (
            "count: 2^32 + 7 (u32 wrap)",
            with(canonical(&runs), (1 << 32) + n),
            Refused,
        ),
        // Header fields.
        ("tag 1 (a large root)", tweaked(&|g| g.tag = 1), Refused),
        ("dead slots 1", tweaked(&|g| g.dead = 1), Refused),
        ("dead slots 127", tweaked(&|g| g.dead = 127), Refused),
        ("size class 11", tweaked(&|g| g.class = 11), Refused),
        ("no runs", tweaked(&|g| g.runs = 0), Refused),
        ("runs one fewer", tweaked(&|g| g.runs = 3), Refused),
        ("runs one more", tweaked(&|g| g.runs = 5), Refused),
        (
            "runs 1,025",
            {
                let mut g = Group::of(&many[..1025]);
                g.runs = 1025;
                with(g.bytes(&many[..1025]), many_count)
            },
            Refused,
        ),
        ("runs 2,047", tweaked(&|g| g.runs = 2047), Refused),
        ("span one more", tweaked(&|g| g.span += 1), Refused),
        ("span one fewer", tweaked(&|g| g.span -= 1), Refused),
        (
            "span 2^40 - 1 past the gaps",
            tweaked(&|g| g.span = (1 << 40) - 1),
            Refused,
        ),
        ("gap width 41", tweaked(&|g| g.dw = 41), Refused),
        ("gap width 63", tweaked(&|g| g.dw = 63), Refused),
        ("count width 31", tweaked(&|g| g.cw = 31), Refused),
        ("a gap width wider than needed", tweaked(&|g| g.dw += 1), Refused),
        ("a count width wider than needed", tweaked(&|g| g.cw += 1), Refused),
        (
            "count bits where none are needed",
            with(
                {
                    let mut g = lone_group;
                    g.cw = 1;
                    g.bytes(&lone)
                },
                3,
            ),
            Refused,
        ),
        ("a gap width too narrow", tweaked(&|g| g.dw -= 1), Refused),
        ("the group's entry count lies", tweaked(&|g| g.entries += 1), Refused),
        ("the group's entry count 0", tweaked(&|g| g.entries = 0), Refused),
        (
            "first stamp 2^53-1 (the next ones past it)",
            tweaked(&|g| g.first = MAX_EXACT_MS),
            Refused,
        ),
        (
            "a stamp past 2^53-1 through the span",
            frame.with_encver(2).payload(&[
                Uint(2),
                Str(Group::of(&[(MAX_EXACT_MS - 5, 1), (MAX_EXACT_MS + 1, 1)])
                    .bytes(&[(MAX_EXACT_MS - 5, 1), (MAX_EXACT_MS + 1, 1)])),
            ]),
            Refused,
        ),
        // Padding and length.
        (
            "a padding bit set",
            {
                // Two lone entries 10 ms apart: one gap of 4 bits, then 4 bits of padding.
                let pair = [(T, 1), (T + 10, 1)];
                let mut bytes = Group::of(&pair).bytes(&pair);
                assert_eq!(bytes.len(), 17);
                *bytes.last_mut().unwrap() |= 0x80;
                with(bytes, 2)
            },
            Refused,
        ),
        (
            "a trailing zero byte",
            with(cat(&[&canonical(&runs), &[0]]), n),
            Refused,
        ),
        (
            "a trailing header",
            with(cat(&[&canonical(&runs), &[0; 16]]), n),
            Refused,
        ),
        (
            "cut inside the slots",
            with(canonical(&runs)[..18].to_vec(), n),
            Refused,
        ),
        (
            "cut inside the header",
            with(canonical(&runs)[..9].to_vec(), n),
            Refused,
        ),
        ("empty", with(Vec::new(), 0), Refused),
        // Groups.
        (
            "two groups where one would do",
            with(
                cat(&[
                    &Group::of(&runs[..2]).bytes(&runs[..2]),
                    &Group::of(&runs[2..]).bytes(&runs[2..]),
                ]),
                n,
            ),
            Refused,
        ),
        (
            "groups out of order",
            with(
                cat(&[
                    &Group::of(&runs[2..]).bytes(&runs[2..]),
                    &Group::of(&runs[..2]).bytes(&runs[..2]),
                ]),
                n,
            ),
            Refused,
        ),
        (
            "groups sharing a stamp",
            with(
                cat(&[
                    &Group::of(&runs[..2]).bytes(&runs[..2]),
                    &Group::of(&runs[1..]).bytes(&runs[1..]),
                ]),
                n + 1,
            ),
            Refused,
        ),
        (
            "1e9 + 1 entries over two groups",
            with(
                cat(&[&canonical(&[(T, MAX_ENTRIES)]), &canonical(&[(T + 1, 1)])]),
                MAX_ENTRIES + 1,
            ),
            Refused,
        ),
        ("a count of 2^30 (past 1e9)", frame.window(&[(T, 1 << 30)]), Refused),
        // Encoding versions this module does not write.
        (
            "encoding version 0",
            frame.with_encver(0).payload(&[Uint(n), Str(canonical(&runs))]),
            Refused,
        ),
        (
            "encoding version 1023",
            frame.with_encver(1023).payload(&[Uint(n), Str(canonical(&runs))]),
            Refused,
        ),
    ];
    cases.push((
        "group LZF string claiming 2^40 bytes",
        v2.payload(&[
            Uint(n),
            Raw(cat(&[&[5, 0xc3], &rdb_len(4), &rdb_len(1 << 40), &[0, 1, 2, 3]])),
        ]),
        Refused,
    ));
    cases
        .into_iter()
        .map(|(name, payload, expect)| ("v2 ".to_string() + name, payload, expect))
        .collect()
}

const RANDOM_ROUNDS: usize = 300;

/// Random windows (which must load, in both versions) and random mutations
/// of valid payloads (anything after the type byte; the CRC fixed up), each
/// through `try_case`.
fn random_cases(frame: &Frame) -> Vec<(String, Vec<u8>, Expect)> {
    let mut rng = Rng(0x5EED_0000_0011);
    let mut cases = Vec::new();
    for round in 0..RANDOM_ROUNDS {
        let mut runs = Vec::new();
        let mut stamp = match rng.below(4) {
            0 => 0,
            1 => MAX_EXACT_MS - rng.below(100),
            _ => T + rng.below(1 << 20),
        };
        for _ in 0..1 + rng.below(if round % 20 == 0 { 1500 } else { 12 }) {
            if stamp > MAX_EXACT_MS {
                break;
            }
            let count = match rng.below(6) {
                0 => 1 + rng.below(MAX_ENTRIES / 16),
                1 | 2 => 2 + rng.below(5),
                _ => 1,
            };
            if runs.iter().map(|r: &(u64, u64)| r.1).sum::<u64>() + count > MAX_ENTRIES {
                break;
            }
            runs.push((stamp, count));
            let gap = [2, 64, 9000, 1 << 39, 1 << 41][rng.below(5) as usize];
            stamp += 1 + rng.below(gap);
        }
        let valid = if round % 2 == 0 {
            frame.window(&runs)
        } else {
            frame.window_v1(&runs)
        };
        if round % 4 < 2 {
            let expect = if round % 2 == 0 {
                Expect::Loaded
            } else {
                Expect::LoadedAs(frame.window(&runs))
            };
            cases.push((
                format!("random window {round} (version {}): {} runs", 2 - round % 2, runs.len()),
                valid,
                expect,
            ));
            continue;
        }
        // Mutate the body after the type byte, keep the version, recompute the CRC.
        let mut body = valid[..valid.len() - 10].to_vec();
        for _ in 0..1 + rng.below(3) {
            if body.len() < 2 {
                break;
            }
            let at = 1 + rng.below(body.len() as u64 - 1) as usize;
            match rng.below(6) {
                0 => body[at] ^= 1 << rng.below(8),
                1 => body[at] = rng.next() as u8,
                2 => body[at] = [0x00, 0x01, 0x7f, 0x80, 0xff][rng.below(5) as usize],
                3 => {
                    body.insert(at, rng.next() as u8);
                }
                4 if body.len() > 2 => {
                    body.remove(at);
                }
                _ => body.truncate(at.max(1)),
            }
        }
        cases.push((
            format!("mutation {round} (version {}) of {} runs", 2 - round % 2, runs.len()),
            frame.seal(body),
            Expect::Either,
        ));
    }
    cases
}

/// Runs every case on one server; returns (case, loaded) in order.
fn run_cases(sanitize: bool) -> Vec<(String, bool)> {
    let server = compact_server(sanitize);
    let mut conn = server.client();
    populate(&mut conn);
    let frame = learn_frame(&mut conn);
    let baseline = digest(&mut conn);
    let mut outcomes = Vec::new();
    let mut cases = crafted_v1(&frame);
    cases.extend(crafted_v2(&frame));
    cases.extend(random_cases(&frame));
    for (case, payload, expect) in &cases {
        let case = format!("{case} (sanitize-dump-payload {})", if sanitize { "yes" } else { "no" });
        let loaded = try_case(&server, &mut conn, &baseline, &case, payload, expect);
        if *expect == Expect::Either && !case.starts_with("mutation") {
            eprintln!("{case}: {}", if loaded { "loaded" } else { "refused" });
        }
        outcomes.push((case, loaded));
    }

    // Encoding version 3 (a later module's) is refused with a log line naming the version.
    let before = server.log().matches("encoding version is 3").count();
    let payload = frame
        .with_encver(3)
        .payload(&[Field::Uint(1), Field::Str(canonical(&[(T, 1)]))]);
    assert!(!try_case(
        &server,
        &mut conn,
        &baseline,
        "encoding version 3",
        &payload,
        &Expect::Refused
    ));
    let log = server.log();
    assert_eq!(
        log.matches("encoding version is 3").count(),
        before + 1,
        "no log line for version 3:\n{log}"
    );
    assert!(log.contains("xcloaklog"), "the log line names the type:\n{log}");

    let mutations_loaded = outcomes
        .iter()
        .filter(|(case, loaded)| *loaded && case.starts_with("mutation"))
        .count();
    eprintln!(
        "sanitize-dump-payload {sanitize}: {} cases, {mutations_loaded} mutations loaded",
        outcomes.len()
    );
    outcomes
}

#[test]
fn crafted_restore_payloads_are_refused_or_fully_usable() {
    let plain = run_cases(false);
    let sanitized = run_cases(true);
    // The server's sanitization does not change a single outcome: the module
    // decides alone.
    assert_eq!(plain.len(), sanitized.len());
    for ((case, a), (_, b)) in plain.iter().zip(&sanitized) {
        assert_eq!(a, b, "{case}: outcome differs with sanitize-dump-payload yes");
    }
}

/// `XCLOAK.APPLY` is for the replication link and the AOF only: refused
/// plainly, inside MULTI and from a script, and nothing changes.
#[test]
fn apply_is_refused_to_clients() {
    let server = compact_server(false);
    let mut conn = server.client();
    populate(&mut conn);
    let baseline = digest(&mut conn);
    let load = canonical_v1(&[(T, 1)]);
    let calls: Vec<Vec<Vec<u8>>> = vec![
        vec![b"rl:one".to_vec(), b"A5*1".to_vec()],
        vec![b"rl:one".to_vec(), format!("T{MAX_EXACT_MS}").into_bytes()],
        vec![b"fresh".to_vec(), b"L".to_vec(), load.clone()],
        vec![b"string".to_vec(), b"L".to_vec(), load.clone()],
        vec![b"fresh".to_vec(), b"L".to_vec(), vec![0x80]],
    ];
    // The error, as a top-level error or inside EXEC's reply.
    let refused = |result: redis::RedisResult<Value>, how: &str| {
        let text = format!("{result:?}");
        assert!(text.contains("XCLOAK.APPLY is internal"), "{how}: {text}");
    };
    for args in &calls {
        let how = format!(
            "XCLOAK.APPLY {:?}",
            args.iter().map(|a| String::from_utf8_lossy(a)).collect::<Vec<_>>()
        );
        // Plain.
        let mut cmd = redis::cmd("XCLOAK.APPLY");
        for arg in args {
            cmd.arg(arg.as_slice());
        }
        refused(cmd.query::<Value>(&mut conn), &how);
        assert_eq!(digest(&mut conn), baseline, "{how}");
        // Inside MULTI: queued, then refused at EXEC.
        let mut pipe = redis::pipe();
        pipe.atomic().add_command(cmd.clone()).cmd("PING");
        refused(pipe.query::<Value>(&mut conn), &format!("MULTI {how}"));
        assert_eq!(digest(&mut conn), baseline, "MULTI {how}");
        // From a script, with redis.pcall (the error returned) and redis.call (raised).
        for call in ["pcall", "call"] {
            let script = format!("return redis.{call}('XCLOAK.APPLY', KEYS[1], unpack(ARGV))");
            let mut eval = redis::cmd("EVAL");
            eval.arg(&script).arg(1);
            for arg in args {
                eval.arg(arg.as_slice());
            }
            refused(eval.query::<Value>(&mut conn), &format!("EVAL redis.{call} {how}"));
            assert_eq!(digest(&mut conn), baseline, "EVAL redis.{call} {how}");
        }
    }
    let exists: i64 = redis::cmd("EXISTS").arg("fresh").query(&mut conn).unwrap();
    assert_eq!(exists, 0);
    ping(&server, &mut conn, "APPLY");
}
