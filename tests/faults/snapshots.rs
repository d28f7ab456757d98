//! The snapshotter: every 250 ms, for every data node the test reaches, its
//! role, and for a primary the stamps of every window it serves. The checker
//! looks up, for each acknowledged admission, whether the node that serves
//! the key after the fault holds it.
//!
//! A sorted-set window is read with `ZRANGE ... WITHSCORES`; a compact one
//! through a copy converted to a sorted set in the key's slot
//! (`COPY` + `XCLOAK.CONVERT` + `ZRANGE` + `DEL`, as `common::stored_stamps`).
//! A key the node does not serve (`MOVED`) is left out.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::history::{Ms, Snapshot};
use super::load::{key_name, now_ms};
use crate::common::resp::{Resp, RespConn};

pub const PERIOD: Duration = Duration::from_millis(250);

pub struct Snapshotter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Snapshot>>>,
}

impl Snapshotter {
    pub fn start(nodes: Vec<String>, keys: u16, compact: bool) -> Snapshotter {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut conns: BTreeMap<String, RespConn> = BTreeMap::new();
            let mut taken = Vec::new();
            while !stop_flag.load(Ordering::SeqCst) {
                let started = std::time::Instant::now();
                for addr in &nodes {
                    if !conns.contains_key(addr) {
                        match RespConn::connect(addr, Duration::from_millis(200)) {
                            Ok(conn) => {
                                conns.insert(addr.clone(), conn);
                            }
                            Err(_) => continue,
                        }
                    }
                    let conn = conns.get_mut(addr).unwrap();
                    match snapshot(conn, keys, compact) {
                        Some((at_ms, read_by_ms, primary, stamps)) => taken.push(Snapshot {
                            node: addr.clone(),
                            at_ms,
                            read_by_ms,
                            primary,
                            stamps,
                        }),
                        None => {
                            conns.remove(addr);
                        }
                    }
                }
                let spent = started.elapsed();
                if spent < PERIOD {
                    std::thread::sleep(PERIOD - spent);
                }
            }
            taken
        });
        Snapshotter {
            stop,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) -> Vec<Snapshot> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().expect("snapshotter")
    }
}

const TIMEOUT: Duration = Duration::from_millis(500);

/// When the reads began and ended, whether the node is a primary, and its windows' stamps by key.
type Taken = (Ms, Ms, bool, BTreeMap<u16, Vec<Ms>>);

/// One node's role and (if primary) windows; `None` if it did not answer.
fn snapshot(conn: &mut RespConn, keys: u16, compact: bool) -> Option<Taken> {
    let role = conn.call(&redis::cmd("ROLE"), TIMEOUT).ok()?;
    let primary = matches!(&role, Resp::Array(parts) if matches!(parts.first(), Some(Resp::Bulk(r)) if r == b"master"));
    let at_ms = now_ms();
    let mut stamps = BTreeMap::new();
    if !primary {
        return Some((at_ms, now_ms(), false, stamps));
    }
    let mut commands = Vec::new();
    for key in 0..keys {
        let name = key_name(key);
        if compact {
            let copy = format!("{{{name}}}:snapshot");
            commands.push(redis::cmd("COPY").arg(&name).arg(&copy).arg("REPLACE").clone());
            commands.push(redis::cmd("XCLOAK.CONVERT").arg(&copy).arg("ZSET").clone());
            commands.push(redis::cmd("ZRANGE").arg(&copy).arg(0).arg(-1).arg("WITHSCORES").clone());
            commands.push(redis::cmd("DEL").arg(&copy).clone());
        } else {
            commands.push(redis::cmd("ZRANGE").arg(&name).arg(0).arg(-1).arg("WITHSCORES").clone());
        }
    }
    let refs: Vec<&redis::Cmd> = commands.iter().collect();
    conn.send(&refs).ok()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let per_key = if compact { 4 } else { 1 };
    for key in 0..keys {
        let mut replies = Vec::with_capacity(per_key);
        for _ in 0..per_key {
            replies.push(conn.recv(deadline).ok()?);
        }
        // The ZRANGE reply (a copy of a missing key copies nothing: empty).
        let range = if compact { &replies[2] } else { &replies[0] };
        if compact && matches!(&replies[0], Resp::Error(_)) {
            continue; // MOVED, or refused: not this node's key
        }
        let Resp::Array(flat) = range else { continue };
        let key_stamps = flat
            .chunks(2)
            .filter_map(|pair| match pair.get(1) {
                Some(Resp::Bulk(score)) => std::str::from_utf8(score).ok()?.parse::<f64>().ok().map(|s| s as Ms),
                _ => None,
            })
            .collect();
        stamps.insert(key, key_stamps);
    }
    Some((at_ms, now_ms(), true, stamps))
}
