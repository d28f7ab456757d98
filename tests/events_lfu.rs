//! OBJECT FREQ and LFU eviction, on both storage forms.
//!
//! - Every call on a window is one access, as a core command on a core key
//!   is: with `lfu-log-factor 0` (each access adds exactly 1) and
//!   `lfu-decay-time 0` (no decay), `OBJECT FREQ` of a window after N calls
//!   equals that of a sorted set after N core commands, whatever the calls
//!   (admissions, rejections, PEEKs, refunds), and DEBUG RELOAD keeps it.
//! - Under `allkeys-lfu`, memory pressure (until a quarter of the idle
//!   windows are gone) evicts the windows nobody calls and keeps the busy
//!   ones intact: an evicted window is a reset
//!   (docs/hardening.md, "Memory"), so the hot identities, the ones under
//!   attack, must be the last to go.
//!
//! The evictions are read from the server's own `evicted_keys`.
use crate::common;
use common::*;

use redis::Connection;

const T: i64 = 1_700_000_000_000;
const HOT: usize = 100;
const COLD: usize = 2000;
const HOT_CALLS: usize = 20;

fn freq(conn: &mut Connection, key: &str) -> i64 {
    redis::cmd("OBJECT")
        .arg("FREQ")
        .arg(key)
        .query(conn)
        .unwrap_or_else(|e| panic!("OBJECT FREQ {key}: {e}"))
}

fn stat(conn: &mut Connection, section: &str, field: &str) -> i64 {
    info_field(conn, section, field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} {field}"))
}

fn lfu_server(config: ServerConfig) -> Server {
    config
        .arg("maxmemory-policy", "allkeys-lfu")
        .arg("lfu-log-factor", "0")
        .arg("lfu-decay-time", "0")
        .arg("maxmemory-samples", "64")
        .start()
}

fn check_form(config: ServerConfig) {
    let server = lfu_server(config);
    let mut conn = server.client();
    let t = T.to_string();
    let call = |conn: &mut Connection, words: &[&str]| {
        let mut cmd = redis::cmd(words[0]);
        for word in &words[1..] {
            cmd.arg(*word);
        }
        let _: redis::Value = cmd.query(conn).unwrap_or_else(|e| panic!("{words:?}: {e}"));
    };

    // Creation, then one access per call, as for a core sorted set.
    call(&mut conn, &["XCLOAK.ALLOW", "w", "60000", "2", "NOW", &t]);
    call(&mut conn, &["ZADD", "reference", "1", "a"]);
    assert_eq!(
        freq(&mut conn, "w"),
        freq(&mut conn, "reference"),
        "a new window starts as a new key does"
    );
    let window_calls: [&[&str]; 6] = [
        &["XCLOAK.ALLOW", "w", "60000", "2", "NOW", &t],            // admitted
        &["XCLOAK.ALLOW", "w", "60000", "2", "NOW", &t, "DETAILS"], // rejected
        &["XCLOAK.PEEK", "w", "60000", "2", "NOW", &t],
        &["XCLOAK.PEEK", "w", "60000", "2", "TIER", "1000", "1"],
        &["XCLOAK.REFUND", "w", &t],
        &["XCLOAK.REFUND", "w", "5"], // finds nothing: still an access
    ];
    for (i, words) in window_calls.iter().enumerate() {
        let before = freq(&mut conn, "w");
        call(&mut conn, words);
        call(&mut conn, &["ZSCORE", "reference", "a"]);
        assert_eq!(freq(&mut conn, "w"), before + 1, "call {i} {words:?} is one access");
        assert_eq!(freq(&mut conn, "w"), freq(&mut conn, "reference"));
    }
    let before = freq(&mut conn, "w");
    call(&mut conn, &["DEBUG", "RELOAD"]);
    assert_eq!(freq(&mut conn, "w"), before, "DEBUG RELOAD keeps the access frequency");

    // Hot windows (called often) and cold ones (called once).
    let calls: Vec<String> = (0..COLD)
        .map(|k| format!("cold:{k}"))
        .chain((0..HOT).flat_map(|k| std::iter::repeat_n(format!("hot:{k}"), HOT_CALLS)))
        .collect();
    for batch in calls.chunks(500) {
        let mut pipe = redis::pipe();
        for key in batch {
            pipe.cmd("XCLOAK.ALLOW")
                .arg(key)
                .arg(3_600_000)
                .arg(100)
                .arg("NOW")
                .arg(T)
                .ignore();
        }
        let () = pipe.query(&mut conn).unwrap();
    }
    assert_eq!(
        freq(&mut conn, "hot:0") - freq(&mut conn, "cold:0"),
        HOT_CALLS as i64 - 1
    );

    // Squeeze memory in steps of 8 KB until a quarter of the cold windows
    // are gone (counted by the server's evicted_keys, so the client's and
    // the server's buffers, which eviction cannot free, do not matter).
    let evicted_before = stat(&mut conn, "stats", "evicted_keys");
    let mut limit = stat(&mut conn, "memory", "used_memory");
    let mut steps = 0;
    loop {
        let evicted = stat(&mut conn, "stats", "evicted_keys") - evicted_before;
        if evicted >= (COLD / 4) as i64 {
            break;
        }
        steps += 1;
        assert!(steps < 2000, "{evicted} evictions after squeezing to {limit} bytes");
        limit -= 8 * 1024;
        call(&mut conn, &["CONFIG", "SET", "maxmemory", &limit.to_string()]);
        let _: String = redis::cmd("PING").query(&mut conn).unwrap();
    }
    // (Counted once no eviction can follow: the CONFIG SET itself may evict.)
    call(&mut conn, &["CONFIG", "SET", "maxmemory", "0"]);
    let evicted = stat(&mut conn, "stats", "evicted_keys") - evicted_before;

    // EXISTS does not touch the access frequency.
    let exists = |conn: &mut Connection, prefix: &str, n: usize| -> usize {
        let mut cmd = redis::cmd("EXISTS");
        for k in 0..n {
            cmd.arg(format!("{prefix}:{k}"));
        }
        cmd.query::<usize>(conn).unwrap()
    };
    let (hot_left, cold_left) = (exists(&mut conn, "hot", HOT), exists(&mut conn, "cold", COLD));
    assert_eq!(
        hot_left, HOT,
        "a busy window was evicted ({evicted} evictions, {cold_left} of {COLD} cold windows left)"
    );
    assert_eq!(COLD - cold_left, evicted as usize, "every eviction took a cold window");
    for k in 0..HOT {
        let peek: Vec<i64> = redis::cmd("XCLOAK.PEEK")
            .arg(format!("hot:{k}"))
            .arg(3_600_000)
            .arg(100)
            .arg("NOW")
            .arg(T)
            .query(&mut conn)
            .unwrap();
        assert_eq!(peek[2], 100 - HOT_CALLS as i64, "hot:{k} kept its entries");
    }
    eprintln!("{evicted} cold windows evicted, every hot one kept");
}

#[test]
fn object_freq_and_lfu_eviction_on_sorted_set_windows() {
    check_form(ServerConfig::default());
}

#[test]
fn object_freq_and_lfu_eviction_on_compact_windows() {
    check_form(ServerConfig::compact());
}
