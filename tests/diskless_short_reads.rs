//! Short reads during a diskless replica load (as Redis's `testrdb.tcl`
//! does to its test module): a replica with `repl-diskless-load swapdb`, and
//! one with `on-empty-db`, loads a primary holding 20,000 compact windows
//! and a few very large ones (100,000 runs each) straight from the socket,
//! and the link is cut at a random byte of the payload, 100 times per mode.
//!
//! The replica reaches the primary through a small TCP proxy in the test,
//! which forwards the handshake, finds the start of the RDB payload and
//! closes both sockets after a chosen number of its bytes: a short read at
//! an arbitrary offset, inside the windows' counts and runs (the module's
//! `rdb_load` sees `RedisModule_IsIOError`), inside keys, or between them.
//! Each attempt goes through a fresh proxy port, and `REPLICAOF` to it makes
//! the replica retry at once instead of at its next once-a-second cron. The
//! proxy forwards every connection the replica opens: Redis 8 loads the RDB
//! over a second one (its "rdb channel"), and that is the one cut there.
//!
//! After every cut the replica is up, has stopped loading, and holds what it
//! held before: with `swapdb` its own earlier dataset, restored (DEBUG DIGEST
//! unchanged); with `on-empty-db` nothing. Then one transfer is let through:
//! the replica ends identical to the primary (DEBUG DIGEST) and follows its
//! writes.
use crate::common;
use common::*;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use redis::Connection;

const SMALL_WINDOWS: usize = 20_000;
const LARGE_WINDOWS: usize = 4;
const LARGE_RUNS: i64 = 100_000;
const CUTS_PER_MODE: usize = 100;
const T: i64 = 1_700_000_000_000;

/// A proxy between a replica and the primary, for one attempt: it forwards
/// every connection the replica opens (Redis 8 loads the RDB over a second
/// one, its "rdb channel"), and closes the first connection that carries an
/// RDB payload after `cut_at` bytes of it (never, with `None`), reporting on
/// `done`. After the cut, and once dropped, it lets no connection through.
struct Proxy {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(primary_port: u16, cut_at: Option<u64>, done: mpsc::Sender<u64>) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", free_port())).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let cut_claimed = Arc::new(AtomicBool::new(false));
        let cut_made = Arc::new(AtomicBool::new(false));
        let accepting = stop.clone();
        std::thread::spawn(move || {
            while !accepting.load(Ordering::Relaxed) {
                match listener.accept() {
                    // The replica retrying after the cut (its once-a-second
                    // cron) must not get through before the test moves on.
                    Ok(_) if cut_made.load(Ordering::SeqCst) => {}
                    Ok((replica, _)) => {
                        replica.set_nonblocking(false).unwrap();
                        let (cut_claimed, cut_made, done) = (cut_claimed.clone(), cut_made.clone(), done.clone());
                        std::thread::spawn(move || forward(replica, primary_port, cut_at, cut_claimed, cut_made, done));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Proxy { port, stop }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Forwards one connection both ways; cuts its payload if it is the first
/// to carry one (see `Proxy`).
fn forward(
    replica: TcpStream,
    primary_port: u16,
    cut_at: Option<u64>,
    cut_claimed: Arc<AtomicBool>,
    cut_made: Arc<AtomicBool>,
    done: mpsc::Sender<u64>,
) {
    let Ok(primary) = TcpStream::connect(("127.0.0.1", primary_port)) else {
        return;
    };
    let (mut from_replica, mut to_primary) = (replica.try_clone().unwrap(), primary.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_replica, &mut to_primary);
        let _ = to_primary.shutdown(Shutdown::Both);
    });
    let (mut from_primary, mut to_replica) = (primary, replica);
    let mut head: Vec<u8> = Vec::new();
    // Some(bytes of payload sent) once the payload started on this connection
    // and it holds the cut; None before, or when it is not cut.
    let mut cutting: Option<u64> = None;
    let mut scanning = true;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from_primary.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut chunk = &buffer[..n];
        if scanning {
            head.extend_from_slice(chunk);
            match payload_start(&head) {
                Scan::More => {
                    if to_replica.write_all(chunk).is_err() {
                        break;
                    }
                    continue;
                }
                Scan::NoPayload => scanning = false,
                Scan::At(start) => {
                    scanning = false;
                    if cut_at.is_some() && !cut_claimed.swap(true, Ordering::SeqCst) {
                        let header_in_chunk = start - (head.len() - n);
                        if to_replica.write_all(&chunk[..header_in_chunk]).is_err() {
                            break;
                        }
                        chunk = &chunk[header_in_chunk..];
                        cutting = Some(0);
                    }
                }
            }
        }
        let (Some(sent), Some(cut)) = (cutting, cut_at) else {
            if to_replica.write_all(chunk).is_err() {
                break;
            }
            continue;
        };
        let allowed = (cut - sent).min(chunk.len() as u64) as usize;
        if to_replica.write_all(&chunk[..allowed]).is_err() {
            break;
        }
        let sent = sent + allowed as u64;
        cutting = Some(sent);
        if sent == cut {
            // Before the replica can see the cut, so that its retry is refused.
            cut_made.store(true, Ordering::SeqCst);
            let _ = to_replica.shutdown(Shutdown::Both);
            let _ = from_primary.shutdown(Shutdown::Both);
            let _ = done.send(sent);
            return;
        }
    }
    let _ = to_replica.shutdown(Shutdown::Both);
}

enum Scan {
    /// Not decided yet: the lines so far are the handshake's.
    More,
    /// The payload starts at this offset.
    At(usize),
    /// A command stream, not a payload.
    NoPayload,
}

/// Where an RDB payload starts in what the primary sent on a connection:
/// after the first line starting with `$` (`$EOF:<40 bytes>` or
/// `$<length>`) that follows only simple replies (`+FULLRESYNC ...`,
/// `+OK`...) and empty keep-alive lines.
fn payload_start(head: &[u8]) -> Scan {
    let mut at = 0;
    loop {
        let Some(&first) = head.get(at) else { return Scan::More };
        let Some(end) = head[at..].iter().position(|&b| b == b'\n') else {
            return Scan::More;
        };
        match first {
            b'\n' | b'\r' | b'+' | b'-' => at += end + 1,
            b'$' => return Scan::At(at + end + 1),
            _ => return Scan::NoPayload,
        }
    }
}

fn info(conn: &mut Connection, section: &str, field: &str) -> Option<String> {
    info_field(conn, section, field)
}

/// The replica has given up the transfer: not loading, no sync in progress.
fn settled(replica: &Server) -> bool {
    let Ok(mut conn) =
        redis::Client::open(replica.url()).and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
    else {
        return false;
    };
    info(&mut conn, "replication", "master_sync_in_progress").as_deref() == Some("0")
        && info(&mut conn, "replication", "master_link_status").as_deref() == Some("down")
        && info(&mut conn, "persistence", "loading").as_deref() == Some("0")
        && info(&mut conn, "persistence", "async_loading")
            .as_deref()
            .unwrap_or("0")
            == "0"
}

/// 20,000 small compact windows, a few hundred sorted-set ones, and
/// `LARGE_WINDOWS` windows of `LARGE_RUNS` runs each.
fn populate(conn: &mut Connection) {
    let mut rng = Rng(0x5EED_D15C_1E55);
    for batch in 0..SMALL_WINDOWS / 1000 {
        let mut pipe = redis::pipe();
        for k in batch * 1000..(batch + 1) * 1000 {
            let mut now = T + rng.below(1 << 30) as i64;
            for _ in 0..1 + rng.below(4) {
                pipe.cmd("XCLOAK.ALLOW")
                    .arg(format!("w:{k}"))
                    .arg(1i64 << 40)
                    .arg(100)
                    .arg("COST")
                    .arg(1 + rng.below(3))
                    .arg("NOW")
                    .arg(now)
                    .ignore();
                now += 1 + rng.below(100_000) as i64;
            }
        }
        let () = pipe.query(conn).unwrap();
    }
    let mut pipe = redis::pipe();
    for k in 0..300 {
        pipe.cmd("XCLOAK.CONVERT").arg(format!("w:{k}")).arg("ZSET").ignore();
    }
    let () = pipe.query(conn).unwrap();
    let mut now = T;
    for batch in 0..LARGE_RUNS / 10_000 {
        let mut pipe = redis::pipe();
        for _ in 0..10_000 {
            pipe.cmd("XCLOAK.ALLOW")
                .arg("large:0")
                .arg(1i64 << 50)
                .arg(1_000_000)
                .arg("NOW")
                .arg(now)
                .ignore();
            now += 1 + rng.below(20_000) as i64;
        }
        let () = pipe.query(conn).unwrap();
        assert!(batch < 10);
    }
    for k in 1..LARGE_WINDOWS {
        let copied: i64 = redis::cmd("COPY")
            .arg("large:0")
            .arg(format!("large:{k}"))
            .query(conn)
            .unwrap();
        assert_eq!(copied, 1);
    }
}

fn replicaof(replica: &mut Connection, port: u16) {
    let _: String = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(port)
        .query(replica)
        .unwrap();
}

fn cut_transfers(primary: &Server, mode: &str, rdb_size: u64) {
    let replica = ServerConfig::compact().arg("repl-diskless-load", mode).start();
    let mut conn = replica.client();
    // With swapdb the replica keeps serving (and restores) what it held.
    if mode == "swapdb" {
        let mut pipe = redis::pipe();
        for k in 0..500 {
            pipe.cmd("XCLOAK.ALLOW")
                .arg(format!("own:{k}"))
                .arg(1i64 << 40)
                .arg(10)
                .arg("NOW")
                .arg(T + k)
                .ignore();
        }
        let () = pipe.query(&mut conn).unwrap();
    }
    let own_digest = digest(&mut conn);
    let mut rng = Rng(0x5EED_0C07 ^ rdb_size);
    let refusals_before = replica.log().matches("xcloak: refusing a compact window").count();
    let started = std::time::Instant::now();
    for cut in 0..CUTS_PER_MODE {
        let (done, cut_done) = mpsc::channel();
        // Anywhere in the first 90% of the payload (the diskless stream is
        // the RDB file give or take a few aux fields).
        let cut_at = 1 + rng.below(rdb_size * 9 / 10);
        let proxy = Proxy::start(primary.port, Some(cut_at), done);
        replicaof(&mut conn, proxy.port);
        let cut_after = cut_done.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
            panic!(
                "{mode}: cut {cut}: the transfer never reached byte {cut_at}:\n{}",
                replica.log()
            )
        });
        assert_eq!(cut_after, cut_at);
        drop(proxy);
        assert!(
            eventually(Duration::from_secs(60), || settled(&replica)),
            "{mode}: cut {cut} at byte {cut_at}: the replica did not give up the load:\n{}",
            replica.log()
        );
        let mut check = replica.client();
        let _: String = redis::cmd("PING")
            .query(&mut check)
            .unwrap_or_else(|e| panic!("{mode}: cut {cut}: replica down: {e}\n{}", replica.log()));
        if mode == "swapdb" {
            assert_eq!(
                digest(&mut check),
                own_digest,
                "{mode}: cut {cut} at byte {cut_at}: the old dataset was not restored"
            );
        } else {
            assert_eq!(
                redis::cmd("DBSIZE").query::<u64>(&mut check).unwrap(),
                0,
                "{mode}: cut {cut} at byte {cut_at}: a partial load was left"
            );
        }
    }
    let cuts_took = started.elapsed();
    let refusals = replica.log().matches("xcloak: refusing a compact window").count() - refusals_before;
    assert!(refusals > 0, "{mode}: no cut landed inside a compact window's value");

    // One transfer through: the replica ends identical and follows.
    let (done, _never) = mpsc::channel();
    let proxy = Proxy::start(primary.port, None, done);
    replicaof(&mut conn, proxy.port);
    let mut on_primary = primary.client();
    let _: i64 = redis::cmd("XCLOAK.ALLOW")
        .arg("after")
        .arg(60_000)
        .arg(5)
        .query(&mut on_primary)
        .unwrap();
    let target: u64 = info(&mut on_primary, "replication", "master_repl_offset")
        .unwrap()
        .parse()
        .unwrap();
    let synced = eventually(Duration::from_secs(120), || {
        let Ok(mut c) =
            redis::Client::open(replica.url()).and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        else {
            return false;
        };
        info(&mut c, "replication", "master_link_status").as_deref() == Some("up")
            && info(&mut c, "replication", "slave_repl_offset")
                .and_then(|o| o.parse::<u64>().ok())
                .is_some_and(|o| o >= target)
    });
    assert!(
        synced,
        "{mode}: the uncut transfer did not complete:\n{}",
        replica.log()
    );
    assert_eq!(
        digest(&mut replica.client()),
        digest(&mut on_primary),
        "{mode}: the replica is identical to the primary"
    );
    eprintln!("{mode}: {CUTS_PER_MODE} cuts in {cuts_took:.1?} ({refusals} inside a compact window's value), then a full load; identical");
    let mut replica = replica;
    assert!(replica.alive());
    drop(proxy);
}

#[test]
fn cut_diskless_loads_never_crash_the_replica_and_it_ends_identical() {
    let primary = ServerConfig::compact()
        .arg("repl-diskless-sync", "yes")
        .arg("repl-diskless-sync-delay", "0")
        // A new sync waits for the last one's fork child to be reaped, which
        // serverCron does: at 100 Hz instead of 10, a cut costs 10 ms, not 100.
        .arg("hz", "100")
        .start();
    let mut conn = primary.client();
    let started = std::time::Instant::now();
    populate(&mut conn);
    eprintln!("populated in {:?}", started.elapsed());
    let keys: u64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert_eq!(keys as usize, SMALL_WINDOWS + LARGE_WINDOWS);
    let _: String = redis::cmd("SAVE").query(&mut conn).unwrap();
    let rdb_size = std::fs::metadata(primary.dir.join("dump.rdb")).unwrap().len();
    eprintln!("primary: {keys} windows, RDB {rdb_size} bytes");
    for mode in ["swapdb", "on-empty-db"] {
        cut_transfers(&primary, mode, rdb_size);
    }
    let mut primary = primary;
    assert!(primary.alive());
}
