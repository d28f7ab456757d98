//! Memory: no leak over two million calls (every path: admit, reject, trim,
//! DETAILS, PEEK, compact and string members), and behaviour at `maxmemory`.
use crate::common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

fn used_memory(conn: &mut Connection) -> i64 {
    info_field(conn, "memory", "used_memory").unwrap().parse().unwrap()
}

fn dbsize(conn: &mut Connection) -> i64 {
    redis::cmd("DBSIZE").query(conn).unwrap()
}

/// Total calls of the leak test, sent in pipelines of `BATCH`.
const CALLS: usize = 2_000_000;
const BATCH: usize = 2_000;
const KEYS: usize = 1_000;

/// Appends one call of the mix, by its sequence number, as RESP.
fn add_call(out: &mut Vec<u8>, n: usize, fixed_now: i64) {
    let key = format!("mem:{}", n % KEYS);
    let (now, bulk_now) = ((fixed_now + (n / 100) as i64).to_string(), fixed_now.to_string());
    let (now_key, bulk_key) = (format!("now:{}", n % 100), format!("bulk:{}", n % 5));
    let words: Vec<&str> = match n % 1000 {
        // Server clock, short window, limit 2: admissions, rejections and trims.
        0..=699 => vec!["XCLOAK.ALLOW", &key, "500", "2"],
        700..=799 => vec!["XCLOAK.ALLOW", &key, "500", "2", "COST", "1", "DETAILS"],
        800..=899 => vec!["XCLOAK.PEEK", &key, "500", "2", "COST", "2"],
        // Client clock moving forward: trims of the NOW path, DETAILS over the range iterator.
        900..=998 => vec!["XCLOAK.ALLOW", &now_key, "50", "10", "NOW", &now, "DETAILS"],
        // Many entries in one millisecond: members past the compact form ("{t}:{k:010}").
        _ => vec![
            "XCLOAK.ALLOW",
            &bulk_key,
            "500",
            "2002",
            "COST",
            "1001",
            "NOW",
            &bulk_now,
            "DETAILS",
        ],
    };
    out.extend_from_slice(format!("*{}\r\n", words.len()).as_bytes());
    for word in words {
        out.extend_from_slice(format!("${}\r\n{word}\r\n", word.len()).as_bytes());
    }
}

/// Reads one reply (integer or array of integers); panics on an error reply.
fn read_reply(reader: &mut impl BufRead, line: &mut Vec<u8>) {
    line.clear();
    reader.read_until(b'\n', line).unwrap();
    match line.first() {
        Some(b':') => {}
        Some(b'*') => {
            let count: usize = std::str::from_utf8(&line[1..line.len() - 2]).unwrap().parse().unwrap();
            for _ in 0..count {
                read_reply(reader, line);
            }
        }
        _ => panic!("unexpected reply {:?}", String::from_utf8_lossy(line)),
    }
}

#[test]
fn millions_of_calls_leave_no_memory_behind() {
    let server = ServerConfig::default().arg("hz", "100").start();
    let mut conn = server.client();
    // Warm the server's own structures (client buffers, command table lookups).
    let _: i64 = redis::cmd("XCLOAK.ALLOW")
        .arg("warm")
        .arg(1)
        .arg(1)
        .query(&mut conn)
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || dbsize(&mut conn) == 0));
    let baseline = used_memory(&mut conn);

    let started = Instant::now();
    let fixed_now = 1_700_000_000_000i64;
    let mut peak = 0;
    // Raw RESP over one socket: the load is the server's, not a debug-built client's.
    let socket = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let mut writer = socket.try_clone().unwrap();
    let mut reader = BufReader::with_capacity(1 << 16, socket);
    let (mut out, mut line) = (Vec::with_capacity(BATCH * 64), Vec::new());
    for batch in 0..CALLS / BATCH {
        out.clear();
        for n in batch * BATCH..(batch + 1) * BATCH {
            add_call(&mut out, n, fixed_now);
        }
        writer.write_all(&out).unwrap();
        for _ in 0..BATCH {
            read_reply(&mut reader, &mut line);
        }
        if batch % 50 == 0 {
            peak = peak.max(used_memory(&mut conn));
        }
    }
    let elapsed = started.elapsed();
    let admitted: i64 = info_field(&mut conn, "xcloak", "xcloak_admitted")
        .unwrap()
        .parse()
        .unwrap();
    let rejected: i64 = info_field(&mut conn, "xcloak", "xcloak_rejected")
        .unwrap()
        .parse()
        .unwrap();
    let keys_at_end = dbsize(&mut conn);

    // Every window passes (TTL = last admission + window + 1 s), keys expire.
    let emptied = eventually(Duration::from_secs(60), || dbsize(&mut conn) == 0);
    assert!(emptied, "DBSIZE stuck at {}", dbsize(&mut conn));
    // Let the server cron shrink its dictionaries, then compare.
    let tolerance = 256 * 1024;
    let settled = eventually(Duration::from_secs(20), || {
        used_memory(&mut conn) - baseline <= tolerance
    });
    let after = used_memory(&mut conn);
    eprintln!(
        "memory: {CALLS} calls in {:.1}s ({:.0} calls/s pipelined), admitted {admitted}, rejected {rejected}, \
         {keys_at_end} keys at the end; used_memory baseline {baseline} B, peak >= {peak} B, after {after} B (delta {} B)",
        elapsed.as_secs_f64(),
        CALLS as f64 / elapsed.as_secs_f64(),
        after - baseline
    );
    assert!(
        admitted > 100_000 && rejected > 100_000,
        "the mix reaches both outcomes"
    );
    assert!(
        keys_at_end >= 100 && peak > baseline,
        "the load did hold memory: {keys_at_end} keys, peak {peak}, baseline {baseline}"
    );
    assert!(
        settled,
        "used_memory {after} B did not return to baseline {baseline} B (+{tolerance})"
    );
}

#[test]
fn at_maxmemory_under_noeviction_allow_is_refused_and_peek_answers() {
    let server = ServerConfig::default().arg("maxmemory-policy", "noeviction").start();
    let mut conn = server.client();
    for t in 0..3 {
        assert_eq!(allow_at(&mut conn, "rl:a", 86_400_000, 5, 1_700_000_000_000 + t), 1);
    }
    // Some bulk so that half of the used memory is well below the dataset.
    for i in 0..200 {
        let _: () = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg("x".repeat(10_000))
            .query(&mut conn)
            .unwrap();
    }
    let used = used_memory(&mut conn);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used / 2)
        .query(&mut conn)
        .unwrap();
    let before = digest(&mut conn);

    for cmd in [
        redis::cmd("XCLOAK.ALLOW")
            .arg("rl:a")
            .arg(86_400_000)
            .arg(5)
            .arg("NOW")
            .arg(1_700_000_000_010i64)
            .clone(),
        redis::cmd("XCLOAK.ALLOW").arg("rl:new").arg(1000).arg(5).clone(),
        redis::cmd("XCLOAK.ALLOW")
            .arg("rl:a")
            .arg(86_400_000)
            .arg(5)
            .arg("COST")
            .arg(2)
            .arg("DETAILS")
            .clone(),
    ] {
        let err = cmd
            .query::<Value>(&mut conn)
            .expect_err("ALLOW must be refused at maxmemory");
        assert_eq!(err.code(), Some("OOM"), "{err}");
        assert!(err.to_string().contains("maxmemory"), "{err}");
    }
    assert_eq!(digest(&mut conn), before, "a refused ALLOW wrote something");

    let seen: Vec<i64> = redis::cmd("XCLOAK.PEEK")
        .arg("rl:a")
        .arg(86_400_000)
        .arg(5)
        .arg("NOW")
        .arg(1_700_000_000_010i64)
        .query(&mut conn)
        .unwrap();
    assert_eq!(seen, [1, 5, 2, 0, 86_400_000 - 8], "PEEK answers at maxmemory");
    assert_eq!(digest(&mut conn), before);

    // Memory back: ALLOW works again, from the intact window.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut conn)
        .unwrap();
    let seen: Vec<i64> = redis::cmd("XCLOAK.ALLOW")
        .arg("rl:a")
        .arg(86_400_000)
        .arg(5)
        .arg("NOW")
        .arg(1_700_000_000_010i64)
        .arg("DETAILS")
        .query(&mut conn)
        .unwrap();
    assert_eq!(&seen[..3], &[1, 5, 1]);
}

/// Under an eviction policy a window is an ordinary key: evicting it resets it
/// (the limiter fails open for that key). This pins the documented behaviour
/// (docs/hardening.md) for `allkeys-lru`.
#[test]
fn under_allkeys_lru_an_evicted_window_is_a_reset() {
    let server = ServerConfig::default().arg("maxmemory-policy", "allkeys-lru").start();
    let mut conn = server.client();
    for t in 0..5 {
        assert_eq!(
            allow_at(&mut conn, "rl:victim", 86_400_000, 5, 1_700_000_000_000 + t),
            1
        );
    }
    assert_eq!(
        allow_at(&mut conn, "rl:victim", 86_400_000, 5, 1_700_000_000_005),
        0,
        "full"
    );
    let used = used_memory(&mut conn);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used + 2_000_000)
        .query(&mut conn)
        .unwrap();

    // Newer keys push memory over the limit until the untouched window is evicted.
    let mut evicted = false;
    for batch in 0..200 {
        let mut pipe = redis::pipe();
        for i in 0..500 {
            pipe.cmd("SET")
                .arg(format!("filler:{batch}:{i}"))
                .arg("x".repeat(1000))
                .ignore();
        }
        let _: () = pipe.query(&mut conn).unwrap();
        let exists: i64 = redis::cmd("EXISTS").arg("rl:victim").query(&mut conn).unwrap();
        if exists == 0 {
            evicted = true;
            break;
        }
    }
    assert!(evicted, "the least recently used window was never evicted");
    let evictions: i64 = info_field(&mut conn, "stats", "evicted_keys").unwrap().parse().unwrap();
    assert!(evictions > 0);
    // The window is gone: the same caller is admitted again at once.
    assert_eq!(
        allow_at(&mut conn, "rl:victim", 86_400_000, 5, 1_700_000_000_006),
        1,
        "evicted = reset"
    );
}
