//! What a run records: every call each writer made and how it ended, the
//! late replies of calls that timed out, snapshots of what the primaries
//! held, and the fault segments. Plain data, read by `checker.rs`.

use std::collections::BTreeMap;

/// Server time, ms since the epoch (the module's stamps).
pub type Ms = i64;

/// How one call ended, as its client saw it.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Reported allowed: an acknowledged admission, with its server stamp.
    Admitted {
        stamp: Ms,
    },
    Rejected,
    /// Durable mode: the server admitted at `stamp` but `WAIT` counted only
    /// `acked` replicas; reported per the error policy (here: rejected, via
    /// "error"), and refunded by its stamp when `refunded`.
    NotReplicated {
        stamp: Ms,
        acked: i64,
        refunded: bool,
    },
    /// An error reply (`READONLY`, `NOREPLICAS`, `MOVED`, `CLUSTERDOWN`, ...):
    /// the server did not run the call.
    Refused(String),
    /// The client gave up waiting: the call may have run (see `Late`).
    Timeout,
    /// The connection failed before a reply: outcome unknown.
    Dropped(String),
}

/// One call.
#[derive(Clone, Debug)]
pub struct Op {
    /// Unique in the run: writer << 32 | sequence number.
    pub id: u64,
    pub key: u16,
    /// Client wall clock when sent (the machine of the servers: their clock).
    pub sent_ms: Ms,
    /// How long the call took, as the client measured it.
    pub latency_us: u64,
    pub outcome: Outcome,
}

/// What arrived, later, on the connection of a call that timed out.
#[derive(Clone, Debug, PartialEq)]
pub enum Late {
    /// The server ran it after all and admitted (stamp), or rejected it.
    Admitted(Ms),
    Rejected,
    /// The server ran it and answered an error.
    Error(String),
    /// The connection closed with no reply, or nothing came within the wait.
    NoReply,
}

/// What one node held at one moment: its role, and (if a primary) the
/// stamps of every window it serves, by key.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub node: String,
    /// When the reads began, and when the last reply came: an entry is
    /// only sure to be there if it is still in the window at `read_by_ms`.
    pub at_ms: Ms,
    pub read_by_ms: Ms,
    pub primary: bool,
    pub stamps: BTreeMap<u16, Vec<Ms>>,
}

/// A stretch of the run around one fault (or none, for the steady state).
#[derive(Clone, Debug)]
pub struct Segment {
    pub kind: String,
    pub start_ms: Ms,
    pub end_ms: Ms,
    /// The node serving each key at the segment's end (after the fault
    /// settled): the primary whose windows count.
    pub final_primary: BTreeMap<u16, String>,
}

/// Everything a run recorded.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub window_ms: Ms,
    pub limit: i64,
    pub keys: u16,
    pub ops: Vec<Op>,
    pub late: BTreeMap<u64, Late>,
    pub snapshots: Vec<Snapshot>,
    pub segments: Vec<Segment>,
}
