//! The load: writer threads calling `XCLOAK.ALLOW key window limit STAMP`
//! over shared keys, as a client would, in plain or durable mode, and
//! recording every call in the history.
//!
//! A writer finds its node the way clients do: by asking the sentinels for
//! the primary (`SENTINEL get-master-addr-by-name`), or from the cluster's
//! slot map (`CLUSTER SLOTS`, updated on `MOVED`). It keeps its connection
//! until an error, and it never retries a call that may have run: after a
//! timeout the connection goes to a drainer thread, which waits for the late
//! reply (`Late`), and the writer opens a new one. A `MOVED` reply is the
//! only retry: the node did not run the call.
//!
//! Durable mode (the client contract of docs/clients.md): once the reply
//! says admitted, `WAIT replicas timeout_ms` goes on the same connection
//! (none after a rejection); an admission counts as allowed only if `WAIT`
//! returned at least `replicas`. Otherwise it goes to the error policy, here
//! `deny`: reported rejected, and refunded by its stamp (best effort, no
//! `WAIT`). A variant pipelines `WAIT` behind every call instead (one round
//! trip; rejections wait too), for the cost table.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::history::{Late, Ms, Op, Outcome};
use crate::common::netns::Host;
use crate::common::resp::{error_code, error_text, RecvError, Resp, RespConn};
use crate::common::Rng;

pub fn now_ms() -> Ms {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as Ms
}

pub fn key_name(key: u16) -> String {
    format!("rl:{key}")
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    Plain,
    /// `WAIT replicas timeout_ms` after each call; deny on fewer. Pipelined
    /// right after the call (one round trip, also after a rejection), or sent
    /// only once the reply says admitted (a second round trip).
    Durable {
        replicas: i64,
        timeout_ms: i64,
        pipelined: bool,
    },
}

impl Mode {
    pub fn name(&self) -> String {
        match self {
            Mode::Plain => "plain".into(),
            Mode::Durable {
                replicas,
                timeout_ms,
                pipelined: true,
            } => format!("durable (WAIT {replicas} {timeout_ms}, pipelined)"),
            Mode::Durable {
                replicas,
                timeout_ms,
                pipelined: false,
            } => format!("durable (WAIT {replicas} {timeout_ms} after an admission)"),
        }
    }
}

/// How writers find the node of a key.
#[derive(Clone, Debug)]
pub enum Topology {
    /// Ask these sentinel ports, at 127.0.0.1 or (inside a host's namespace)
    /// at the network's gateway.
    Sentinel { ports: Vec<u16>, gateway: Option<String> },
    /// Seed nodes (`host:port`) of a cluster.
    Cluster { seeds: Vec<String> },
    /// One node (`host:port`), no discovery.
    Direct { addr: String },
}

#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub writers: usize,
    pub keys: u16,
    pub window_ms: Ms,
    pub limit: i64,
    pub mode: Mode,
    /// How long a client waits for a reply (in durable mode, on top of WAIT's timeout).
    pub client_timeout: Duration,
    /// Calls per second per writer, at most.
    pub rate: u32,
}

/// What the harness tells a writer while it runs.
#[derive(Default)]
pub struct WriterControl {
    /// Move into this host's namespace (and connect from there), or back out.
    pub host: Mutex<Option<Arc<Host>>>,
}

pub struct Load {
    stop: Arc<AtomicBool>,
    writers: Vec<JoinHandle<Vec<Op>>>,
    pub controls: Vec<Arc<WriterControl>>,
    late: Arc<Mutex<BTreeMap<u64, Late>>>,
    drainers: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Load {
    pub fn start(config: &LoadConfig, topology: &Topology) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let late = Arc::new(Mutex::new(BTreeMap::new()));
        let drainers = Arc::new(Mutex::new(Vec::new()));
        let controls: Vec<Arc<WriterControl>> = (0..config.writers)
            .map(|_| Arc::new(WriterControl::default()))
            .collect();
        let writers = (0..config.writers)
            .map(|w| {
                let mut writer = Writer {
                    id: w as u64,
                    config: config.clone(),
                    topology: topology.clone(),
                    control: controls[w].clone(),
                    late: late.clone(),
                    drainers: drainers.clone(),
                    conns: BTreeMap::new(),
                    slots: Vec::new(),
                    in_host: None,
                    seq: 0,
                    ops: Vec::new(),
                    rng: Rng(0x9e37_79b9_7f4a_7c15 ^ ((w as u64 + 1) * 0x2545_f491)),
                };
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("writer-{w}"))
                    .spawn(move || {
                        writer.run(&stop);
                        writer.ops
                    })
                    .expect("writer thread")
            })
            .collect();
        Load {
            stop,
            writers,
            controls,
            late,
            drainers,
        }
    }

    /// Stops the writers and waits for the late replies (bounded by the
    /// drainers' own wait); returns the calls, sorted by send time, and the late replies.
    pub fn finish(self) -> (Vec<Op>, BTreeMap<u64, Late>) {
        self.stop.store(true, Ordering::SeqCst);
        let mut ops: Vec<Op> = self
            .writers
            .into_iter()
            .flat_map(|w| w.join().expect("writer"))
            .collect();
        ops.sort_by_key(|op| (op.sent_ms, op.id));
        let drainers: Vec<JoinHandle<()>> = std::mem::take(&mut *self.drainers.lock().unwrap());
        for drainer in drainers {
            let _ = drainer.join();
        }
        let late = std::mem::take(&mut *self.late.lock().unwrap());
        (ops, late)
    }
}

/// How long a drainer waits for a late reply.
const LATE_WAIT: Duration = Duration::from_secs(30);

struct Writer {
    id: u64,
    config: LoadConfig,
    topology: Topology,
    control: Arc<WriterControl>,
    late: Arc<Mutex<BTreeMap<u64, Late>>>,
    drainers: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// Open connections by node address.
    conns: BTreeMap<String, RespConn>,
    /// Cluster: the node of each slot.
    slots: Vec<String>,
    in_host: Option<(Arc<Host>, crate::common::netns::ThreadInNamespace)>,
    seq: u64,
    ops: Vec<Op>,
    rng: Rng,
}

fn connect_timeout() -> Duration {
    Duration::from_millis(300)
}

impl Writer {
    fn run(&mut self, stop: &AtomicBool) {
        let pace = Duration::from_secs_f64(1.0 / self.config.rate.max(1) as f64);
        let started = Instant::now();
        let mut next = started;
        while !stop.load(Ordering::SeqCst) {
            self.follow_control();
            // Key k joins k/keys of a window after the start: saturated windows
            // admit in a burst when their entries leave, so keys that start
            // together would admit together, once a window; staggered, the
            // admissions spread evenly over time.
            let elapsed_ms = started.elapsed().as_millis() as u64;
            let keys = self.config.keys as u64;
            let active = (elapsed_ms * keys / self.config.window_ms.max(1) as u64 + 1).min(keys);
            let key = self.rng.below(active) as u16;
            if let Some(op) = self.call(key) {
                self.ops.push(op);
            } else {
                // No node to send to (discovery failed): try again soon.
                std::thread::sleep(Duration::from_millis(50));
            }
            next += pace;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else if now - next > Duration::from_secs(1) {
                next = now; // fell behind (a fault): don't burst to catch up
            }
        }
        // Leave the namespace before the thread ends (the guard's drop).
        self.in_host = None;
    }

    /// Enters or leaves a host's namespace when told to, dropping every
    /// connection (sockets belong to the namespace they were opened in).
    fn follow_control(&mut self) {
        let wanted = self.control.host.lock().unwrap().clone();
        let current = self.in_host.as_ref().map(|(host, _)| host.ns.clone());
        if wanted.as_ref().map(|h| h.ns.clone()) == current {
            return;
        }
        self.conns.clear();
        self.slots.clear();
        self.in_host = None;
        if let Some(host) = wanted {
            let guard = host.enter_this_thread();
            self.in_host = Some((host, guard));
        }
    }

    fn sentinel_host(&self) -> String {
        match (&self.topology, &self.in_host) {
            (
                Topology::Sentinel {
                    gateway: Some(gateway), ..
                },
                Some(_),
            ) => gateway.clone(),
            _ => "127.0.0.1".into(),
        }
    }

    /// The node for `key`: the primary the first answering sentinel names,
    /// or the slot's node in the map (loaded when empty).
    fn route(&mut self, key: u16) -> Option<String> {
        match self.topology.clone() {
            Topology::Sentinel { ports, .. } => {
                if let Some(addr) = self.conns.keys().next() {
                    return Some(addr.clone());
                }
                let host = self.sentinel_host();
                let ask = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(crate::common::sentinel::MASTER_NAME)
                    .clone();
                for port in ports {
                    let Ok(mut conn) = RespConn::connect(&format!("{host}:{port}"), connect_timeout()) else {
                        continue;
                    };
                    if let Ok(Resp::Array(parts)) = conn.call(&ask, Duration::from_millis(300)) {
                        if let [Resp::Bulk(h), Resp::Bulk(p)] = parts.as_slice() {
                            return Some(format!("{}:{}", String::from_utf8_lossy(h), String::from_utf8_lossy(p)));
                        }
                    }
                }
                None
            }
            Topology::Direct { addr } => Some(addr),
            Topology::Cluster { seeds } => {
                if self.slots.is_empty() {
                    self.load_slots(&seeds);
                }
                let slot = redis::cluster_routing::get_slot(key_name(key).as_bytes()) as usize;
                self.slots.get(slot).filter(|addr| !addr.is_empty()).cloned()
            }
        }
    }

    /// `CLUSTER SLOTS` from the first seed that answers.
    fn load_slots(&mut self, seeds: &[String]) {
        let ask = redis::cmd("CLUSTER").arg("SLOTS").clone();
        for seed in seeds {
            let Ok(mut conn) = RespConn::connect(seed, connect_timeout()) else {
                continue;
            };
            let Ok(Resp::Array(ranges)) = conn.call(&ask, Duration::from_millis(500)) else {
                continue;
            };
            let mut slots = vec![String::new(); 16384];
            for range in ranges {
                let Resp::Array(parts) = range else { continue };
                let (Some(Resp::Int(start)), Some(Resp::Int(end)), Some(Resp::Array(primary))) =
                    (parts.first(), parts.get(1), parts.get(2))
                else {
                    continue;
                };
                let (Some(Resp::Bulk(host)), Some(Resp::Int(port))) = (primary.first(), primary.get(1)) else {
                    continue;
                };
                let addr = format!("{}:{port}", String::from_utf8_lossy(host));
                for slot in *start..=*end {
                    slots[slot as usize] = addr.clone();
                }
            }
            self.slots = slots;
            return;
        }
    }

    fn forget(&mut self, addr: &str) {
        self.conns.remove(addr);
        self.slots.clear();
    }

    /// One call on `key`, recorded; `None` when no node could be found or reached.
    fn call(&mut self, key: u16) -> Option<Op> {
        let name = key_name(key);
        // MOVED: the node did not run it, so ask the right one (a few times at most).
        for _ in 0..5 {
            let addr = self.route(key)?;
            if !self.conns.contains_key(&addr) {
                match RespConn::connect(&addr, connect_timeout()) {
                    Ok(conn) => {
                        self.conns.insert(addr.clone(), conn);
                    }
                    Err(_) => {
                        self.forget(&addr);
                        return None;
                    }
                }
            }
            let id = self.id << 32 | self.seq;
            self.seq += 1;
            let sent_ms = now_ms();
            let started = Instant::now();
            let outcome = self.exchange(&addr, &name, id);
            let latency_us = started.elapsed().as_micros() as u64;
            if let Outcome::Refused(code) = &outcome {
                if code.starts_with("MOVED") || code.starts_with("ASK") {
                    self.slots.clear();
                    continue;
                }
                // READONLY (a demoted primary), CLUSTERDOWN, LOADING, NOREPLICAS...: rediscover.
                self.forget(&addr);
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(outcome, Outcome::Dropped(_)) {
                self.forget(&addr);
            }
            return Some(Op {
                id,
                key,
                sent_ms,
                latency_us,
                outcome,
            });
        }
        None
    }

    /// Sends the call (and WAIT in durable mode) and reads the replies.
    fn exchange(&mut self, addr: &str, name: &str, id: u64) -> Outcome {
        let allow = redis::cmd("XCLOAK.ALLOW")
            .arg(name)
            .arg(self.config.window_ms)
            .arg(self.config.limit)
            .arg("STAMP")
            .clone();
        let (wait, wait_ms, pipelined) = match self.config.mode {
            Mode::Plain => (None, 0, false),
            Mode::Durable {
                replicas,
                timeout_ms,
                pipelined,
            } => (
                Some(redis::cmd("WAIT").arg(replicas).arg(timeout_ms).clone()),
                timeout_ms,
                pipelined,
            ),
        };
        let conn = self.conns.get_mut(addr).expect("connected");
        let mut commands = vec![&allow];
        if let (Some(wait), true) = (&wait, pipelined) {
            commands.push(wait);
        }
        if let Err(e) = conn.send(&commands) {
            return Outcome::Dropped(e);
        }
        let deadline = Instant::now() + self.config.client_timeout + Duration::from_millis(wait_ms as u64);
        let first = match conn.recv(deadline) {
            Ok(value) => value,
            Err(RecvError::Timeout) => {
                let conn = self.conns.remove(addr).expect("connected");
                self.drain(id, conn, commands.len());
                self.slots.clear();
                return Outcome::Timeout;
            }
            Err(RecvError::Closed(e)) => return Outcome::Dropped(e),
        };
        let stamp = match &first {
            Resp::Int(stamp) => *stamp,
            other => {
                let code = error_text(other).unwrap_or_else(|| format!("unexpected reply {other:?}"));
                if commands.len() > 1 {
                    let _ = conn.recv(deadline);
                }
                return Outcome::Refused(code);
            }
        };
        let (Mode::Durable { replicas, .. }, Some(wait)) = (self.config.mode, &wait) else {
            return if stamp > 0 {
                Outcome::Admitted { stamp }
            } else {
                Outcome::Rejected
            };
        };
        if !pipelined {
            if stamp < 0 {
                return Outcome::Rejected;
            }
            if conn.send(&[wait]).is_err() {
                // The admission ran; the connection broke before WAIT: not replicated, as far as we know.
                self.forget(addr);
                return Outcome::NotReplicated {
                    stamp,
                    acked: -1,
                    refunded: false,
                };
            }
        }
        let acked = match conn.recv(deadline) {
            Ok(Resp::Int(acked)) => acked,
            Ok(_) => -1,
            Err(RecvError::Timeout) => {
                // The admission ran (its reply came) but WAIT did not answer:
                // not replicated as far as the client knows; the connection is stuck.
                let conn = self.conns.remove(addr).expect("connected");
                self.drain(id, conn, 0);
                return if stamp > 0 {
                    Outcome::NotReplicated {
                        stamp,
                        acked: -1,
                        refunded: false,
                    }
                } else {
                    Outcome::Rejected
                };
            }
            Err(RecvError::Closed(_)) => -1,
        };
        if stamp < 0 {
            return Outcome::Rejected;
        }
        if acked >= replicas {
            return Outcome::Admitted { stamp };
        }
        // Not replicated: deny, and give the admission back (best effort).
        let refund = redis::cmd("XCLOAK.REFUND").arg(name).arg(stamp).clone();
        let reply = self
            .conns
            .get_mut(addr)
            .map(|conn| conn.call(&refund, self.config.client_timeout));
        if !matches!(reply, Some(Ok(_))) {
            // No reply in time: the connection may hold it still, so it can't carry the next call.
            self.forget(addr);
        }
        let refunded = matches!(reply, Some(Ok(Resp::Int(n))) if n >= 1);
        Outcome::NotReplicated { stamp, acked, refunded }
    }

    /// Hands a connection whose reply is late to a thread that waits for it.
    fn drain(&mut self, id: u64, mut conn: RespConn, replies: usize) {
        let late = self.late.clone();
        let handle = std::thread::spawn(move || {
            if replies == 0 {
                return;
            }
            let outcome = match conn.recv(Instant::now() + LATE_WAIT) {
                Ok(Resp::Int(stamp)) if stamp > 0 => Late::Admitted(stamp),
                Ok(Resp::Int(_)) => Late::Rejected,
                Ok(other) => Late::Error(error_code(&other).unwrap_or_else(|| format!("{other:?}"))),
                Err(_) => Late::NoReply,
            };
            late.lock().unwrap().insert(id, outcome);
        });
        self.drainers.lock().unwrap().push(handle);
    }
}
