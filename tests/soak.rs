//! Sustained load, exactly: 200 concurrent connections for 30 seconds across
//! 1,000 keys at full speed, on the server's own clock. Afterwards, from the
//! scores themselves, no key ever held more than its limit inside ANY sliding
//! window.
//!
//! Every admitted entry is seen, even the ones trimmed mid-run: the test reads
//! the server's replication stream as a replica would (`SYNC`), and the module
//! replicates each admission as `ZADD key <score> <member>...` with the exact
//! score it recorded. For each key, over all of its admitted scores sorted,
//! every window `(s - window, s]` ending at a score holds at most `limit`
//! (windows ending elsewhere hold no more than one ending at a score).
//! The clients' own tally of admitted units per key must equal the stream's,
//! so no admission escapes the check, and the entries still stored at the end
//! must all be ones the stream announced.
use crate::common;
use common::*;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const CONNECTIONS: usize = 200;
const KEYS: usize = 1_000;
const DURATION: Duration = Duration::from_secs(30);
/// Per-connection bound on calls, whatever the speed.
const MAX_CALLS_PER_CONNECTION: u64 = 5_000_000;
const DONE_KEY: &str = "soak:done";

/// Limit 5..=50 and window 100..=2000 ms, fixed per key.
fn shape(key: usize) -> (i64, i64) {
    (5 + (key as i64 * 7) % 46, 100 + (key as i64 * 131) % 1901)
}

fn key_name(key: usize) -> String {
    format!("soak:{key}")
}

/// Admitted entries per key, read from the replication stream.
#[derive(Default)]
struct Stream {
    entries: HashMap<Vec<u8>, Vec<(Vec<u8>, i64)>>,
    bytes: u64,
}

fn read_line(reader: &mut impl BufRead) -> Vec<u8> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line).expect("replication stream");
    assert!(!line.is_empty(), "replication stream closed");
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    line
}

fn number(bytes: &[u8]) -> i64 {
    std::str::from_utf8(bytes)
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {bytes:?}"))
}

/// Connects as a replica with `SYNC`, skips the RDB payload, then collects
/// every `ZADD` until the `SET soak:done` sentinel arrives.
fn follow_replication(port: u16, ready: Arc<Barrier>) -> Stream {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    socket.write_all(b"*1\r\n$4\r\nSYNC\r\n").unwrap();
    let mut reader = BufReader::with_capacity(1 << 20, socket);
    // The payload: "$<len>\r\n<rdb>" (after "\n" keep-alives while the RDB is made).
    let header = loop {
        let line = read_line(&mut reader);
        if !line.is_empty() {
            break line;
        }
    };
    assert_eq!(
        header[0],
        b'$',
        "unexpected SYNC reply {:?}",
        String::from_utf8_lossy(&header)
    );
    let length = number(&header[1..]) as u64;
    std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink()).unwrap();
    ready.wait();

    let mut stream = Stream::default();
    loop {
        let line = read_line(&mut reader);
        if line.is_empty() {
            continue;
        }
        assert_eq!(
            line[0],
            b'*',
            "unexpected line in the stream: {:?}",
            String::from_utf8_lossy(&line)
        );
        let words: Vec<Vec<u8>> = (0..number(&line[1..]))
            .map(|_| {
                let header = read_line(&mut reader);
                let mut word = vec![0; number(&header[1..]) as usize + 2];
                reader.read_exact(&mut word).unwrap();
                word.truncate(word.len() - 2);
                stream.bytes += word.len() as u64 + header.len() as u64 + 4;
                word
            })
            .collect();
        if words[0].eq_ignore_ascii_case(b"ZADD") {
            let list = stream.entries.entry(words[1].clone()).or_default();
            for pair in words[2..].chunks(2) {
                let score: f64 = std::str::from_utf8(&pair[0]).unwrap().parse().unwrap();
                list.push((pair[1].clone(), score as i64));
            }
        } else if words[0].eq_ignore_ascii_case(b"SET") && words[1] == DONE_KEY.as_bytes() {
            return stream;
        }
    }
}

/// What one connection saw.
#[derive(Default)]
struct Tally {
    calls: u64,
    admitted_units: Vec<u64>,
    admitted_calls: u64,
    rejected_calls: u64,
    peeks: u64,
}

/// Calls each connection sends per round trip. Every call still runs on its
/// own; pipelining only keeps the 200 client threads from being the bottleneck.
const DEPTH: usize = 8;

enum Kind {
    Plain,
    Details(u64),
    Peek,
}

/// One reply: an integer, or an array of integers.
fn read_reply(reader: &mut impl BufRead, line: &mut Vec<u8>) -> Vec<i64> {
    line.clear();
    reader.read_until(b'\n', line).unwrap();
    let text = std::str::from_utf8(&line[1..line.len() - 2]).unwrap().to_string();
    match line[0] {
        b':' => vec![text.parse().unwrap()],
        b'*' => (0..text.parse::<usize>().unwrap())
            .map(|_| read_reply(reader, line)[0])
            .collect(),
        _ => panic!("unexpected reply {:?}", String::from_utf8_lossy(line)),
    }
}

fn push_command(out: &mut Vec<u8>, words: &[&str]) {
    out.extend_from_slice(format!("*{}\r\n", words.len()).as_bytes());
    for word in words {
        out.extend_from_slice(format!("${}\r\n{word}\r\n", word.len()).as_bytes());
    }
}

fn client_loop(port: u16, id: usize, start: Arc<Barrier>, stop: Arc<AtomicBool>) -> Tally {
    let socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket.set_nodelay(true).unwrap();
    let mut writer = socket.try_clone().unwrap();
    let mut reader = BufReader::new(socket);
    let (mut out, mut line, mut sent) = (Vec::new(), Vec::new(), Vec::with_capacity(DEPTH));
    let mut tally = Tally {
        admitted_units: vec![0; KEYS],
        ..Tally::default()
    };
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (id as u64).wrapping_mul(0x2545_F491_4F6C_DD1D);
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    start.wait();
    while !stop.load(Ordering::Relaxed) && tally.calls < MAX_CALLS_PER_CONNECTION {
        out.clear();
        sent.clear();
        for _ in 0..DEPTH {
            let r = next();
            // A fifth of the calls hammer ten hot keys; the rest spread over all.
            let key = if r % 5 == 0 {
                (r >> 8) as usize % 10
            } else {
                (r >> 8) as usize % KEYS
            };
            let (limit, window) = shape(key);
            let (name, limit_text, window_text) = (key_name(key), limit.to_string(), window.to_string());
            let kind = match (r >> 40) % 10 {
                0 => Kind::Details(1 + (r >> 48) % 3),
                1 => Kind::Peek,
                _ => Kind::Plain,
            };
            match kind {
                Kind::Details(cost) => push_command(
                    &mut out,
                    &[
                        "XCLOAK.ALLOW",
                        &name,
                        &window_text,
                        &limit_text,
                        "COST",
                        &cost.to_string(),
                        "DETAILS",
                    ],
                ),
                Kind::Peek => push_command(&mut out, &["XCLOAK.PEEK", &name, &window_text, &limit_text]),
                Kind::Plain => push_command(&mut out, &["XCLOAK.ALLOW", &name, &window_text, &limit_text]),
            }
            sent.push((key, limit, kind));
        }
        writer.write_all(&out).unwrap();
        for (key, limit, kind) in sent.drain(..) {
            let d = read_reply(&mut reader, &mut line);
            tally.calls += 1;
            match kind {
                Kind::Details(cost) => {
                    assert_eq!(d.len(), 5);
                    assert!(d[0] == 0 || d[0] == 1);
                    assert_eq!(d[1], limit);
                    assert!((0..=limit).contains(&d[2]), "{d:?}");
                    assert!(d[3] >= 0 && d[4] >= 0, "{d:?}");
                    if d[0] == 1 {
                        assert_eq!(d[3], 0);
                        tally.admitted_units[key] += cost;
                        tally.admitted_calls += 1;
                    } else {
                        assert!(d[3] >= 1, "a rejected call waits: {d:?}");
                        tally.rejected_calls += 1;
                    }
                }
                Kind::Peek => {
                    assert!((0..=limit).contains(&d[2]) && d[3] >= 0 && d[4] >= 0, "{d:?}");
                    tally.peeks += 1;
                }
                Kind::Plain => {
                    if d == [1] {
                        tally.admitted_units[key] += 1;
                        tally.admitted_calls += 1;
                    } else {
                        assert_eq!(d, [0]);
                        tally.rejected_calls += 1;
                    }
                }
            }
        }
    }
    tally
}

/// The largest number of scores inside any window `(s - window, s]`.
fn densest_window(scores: &mut [i64], window: i64) -> (usize, i64) {
    scores.sort_unstable();
    let (mut worst, mut at, mut low) = (0, 0, 0);
    let mut i = 0;
    while i < scores.len() {
        let mut high = i;
        while high + 1 < scores.len() && scores[high + 1] == scores[i] {
            high += 1;
        }
        while scores[low] <= scores[i] - window {
            low += 1;
        }
        if high + 1 - low > worst {
            (worst, at) = (high + 1 - low, scores[i]);
        }
        i = high + 1;
    }
    (worst, at)
}

#[test]
fn two_hundred_connections_for_thirty_seconds_never_exceed_any_window() {
    let mut config = ServerConfig::default()
        .arg("repl-diskless-sync", "no")
        .arg("maxclients", "1000");
    // No output-buffer limit for the stream reader (separate words: 6.2 does not split one).
    config
        .extra
        .extend(["--client-output-buffer-limit", "replica", "0", "0", "0"].map(String::from));
    let server = config.start();

    let replica_ready = Arc::new(Barrier::new(2));
    let follower = {
        let (port, ready) = (server.port, replica_ready.clone());
        std::thread::spawn(move || follow_replication(port, ready))
    };
    replica_ready.wait();

    let start = Arc::new(Barrier::new(CONNECTIONS + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|id| {
            let (port, start, stop) = (server.port, start.clone(), stop.clone());
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || client_loop(port, id, start, stop))
                .unwrap()
        })
        .collect();
    start.wait();
    let began = Instant::now();
    std::thread::sleep(DURATION);
    stop.store(true, Ordering::Relaxed);
    let tallies: Vec<Tally> = workers
        .into_iter()
        .map(|w| w.join().expect("a client thread failed"))
        .collect();
    let elapsed = began.elapsed();

    let mut conn = server.client();
    let _: () = redis::cmd("SET").arg(DONE_KEY).arg(1).query(&mut conn).unwrap();
    let stream = follower.join().expect("replication reader failed");

    let calls: u64 = tallies.iter().map(|t| t.calls).sum();
    let admitted_calls: u64 = tallies.iter().map(|t| t.admitted_calls).sum();
    let rejected_calls: u64 = tallies.iter().map(|t| t.rejected_calls).sum();
    let peeks: u64 = tallies.iter().map(|t| t.peeks).sum();
    let mut admitted_units = vec![0u64; KEYS];
    for tally in &tallies {
        for (key, units) in tally.admitted_units.iter().enumerate() {
            admitted_units[key] += units;
        }
    }
    eprintln!(
        "soak: {calls} calls from {CONNECTIONS} connections ({DEPTH} in flight each) in {:.1}s = {:.0} calls/s \
         ({admitted_calls} admitted, {rejected_calls} rejected, {peeks} peeks); \
         replication stream {:.1} MB",
        elapsed.as_secs_f64(),
        calls as f64 / elapsed.as_secs_f64(),
        stream.bytes as f64 / 1e6
    );
    assert!(
        admitted_calls > 1_000 && rejected_calls > 1_000,
        "the load reaches both outcomes"
    );

    let mut failures = Vec::new();
    let mut checked_entries = 0usize;
    for (key, &admitted) in admitted_units.iter().enumerate() {
        let (limit, window) = shape(key);
        let name = key_name(key);
        let announced = stream.entries.get(name.as_bytes()).map(Vec::as_slice).unwrap_or(&[]);
        if announced.len() as u64 != admitted {
            failures.push(format!(
                "{name}: clients were admitted {} units, the stream added {}",
                admitted,
                announced.len()
            ));
        }
        let members: HashSet<(&[u8], i64)> = announced.iter().map(|(m, s)| (m.as_slice(), *s)).collect();
        let unique: HashSet<&[u8]> = announced.iter().map(|(m, _)| m.as_slice()).collect();
        if unique.len() != announced.len() {
            failures.push(format!(
                "{name}: {} members added twice",
                announced.len() - unique.len()
            ));
        }
        let mut scores: Vec<i64> = announced.iter().map(|(_, s)| *s).collect();
        checked_entries += scores.len();
        let (worst, at) = densest_window(&mut scores, window);
        if worst > limit as usize {
            failures.push(format!(
                "{name}: {worst} entries in ({} , {at}] with limit {limit}",
                at - window
            ));
        }
        // What is still stored was announced, with the same score.
        for (member, score) in entries(&mut conn, &name) {
            if !members.contains(&(member.as_bytes(), score as i64)) {
                failures.push(format!("{name}: stored {member}@{score} never replicated"));
            }
        }
    }
    eprintln!("soak: checked {checked_entries} admitted entries over {KEYS} keys, every sliding window");
    assert!(
        failures.is_empty(),
        "{} problems:\n{}",
        failures.len(),
        failures.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn densest_window_counts_every_sliding_window() {
    // (s - 10, s]: 0 and 10 are never together; (-1, 9] and (0, 10] both hold 5.
    assert_eq!(densest_window(&mut [0, 10, 1, 5, 5, 9], 10), (5, 9));
    assert_eq!(densest_window(&mut [0, 10, 1, 5, 5, 9, 10], 10), (6, 10));
    assert_eq!(densest_window(&mut [0, 10, 20], 10), (1, 0));
    assert_eq!(densest_window(&mut [3, 3, 3], 1), (3, 3));
    assert_eq!(densest_window(&mut [], 5), (0, 0));
}
