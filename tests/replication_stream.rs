//! The replication stream, pinned command by command (as Redis's own
//! `propagate.tcl` pins the core's): a raw replica (`SYNC`) reads what the
//! primary propagates for each call, on both storage forms, and the test
//! compares it with exactly what docs/design.md says a call replicates:
//!
//! - an admission: `ZADD key t member...` and, when the expiry is re-armed,
//!   `PEXPIREAT key <server ms + window + 1000>`; on the compact form one
//!   `XCLOAK.APPLY key A<t>*<n>E<ms>`;
//! - a trim: `ZREMRANGEBYSCORE key -inf <cutoff>` / `T<cutoff>`, also when it
//!   empties the window (and nothing else: the replica deletes the key when
//!   its last entry goes);
//! - a refund: `ZREM key <the highest slots first>` / `R<stamp>*<n>`;
//! - a convert: `DEL`, the new form's content, `PEXPIREAT` of the same expiry;
//! - a rejection and a PEEK: nothing at all;
//! - the same calls inside MULTI/EXEC, EVAL and FCALL (7.0+): the same
//!   effects, in call order, in the server's one transaction.
//!
//! No XCLOAK.ALLOW, PEEK, REFUND or CONVERT ever reaches the stream.
//!
//! How the server frames them, measured on the four servers of the matrix:
//! - Redis 7.0+ and Valkey wrap what one command execution (a call, an EXEC,
//!   an EVAL, an FCALL) propagated in MULTI/EXEC when it is more than one
//!   command, and send a single command bare;
//! - Redis 6.2 wraps every module call or transaction that replicates in
//!   MULTI/EXEC, even a single command; and it opens a script's MULTI at the
//!   script's first *write-flagged* call, so an EVAL whose only write is a
//!   rejection propagates an empty `MULTI`/`EXEC` pair. That pair is the
//!   server's (it changes nothing on the replica); the module propagates
//!   nothing for the rejection there either.
use crate::common;
use common::stream::{mark, ReplicationStream};
use common::*;

use redis::Connection;

const T: i64 = 1_700_000_012_345;
const MINUTE: i64 = 60_000;

/// One word of an expected command.
#[derive(Clone, Debug)]
enum W {
    Is(String),
    /// A number in `lo..=hi` (an absolute expiry taken on the server clock).
    Between(i64, i64),
    /// `prefix` then a number in `lo..=hi` (the compact effect's `E<ms>`).
    PrefixBetween(String, i64, i64),
    /// Any non-empty word (the canonical bytes of a compact load, pinned by
    /// tests/hostile_restore.rs, not here).
    NonEmpty,
}

impl W {
    fn matches(&self, word: &str) -> bool {
        let in_range = |text: &str, lo: i64, hi: i64| text.parse::<i64>().is_ok_and(|n| (lo..=hi).contains(&n));
        match self {
            W::Is(expected) => expected == word,
            W::Between(lo, hi) => in_range(word, *lo, *hi),
            W::PrefixBetween(prefix, lo, hi) => word
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| in_range(rest, *lo, *hi)),
            W::NonEmpty => !word.is_empty(),
        }
    }
}

fn is(word: impl ToString) -> W {
    W::Is(word.to_string())
}

type Expected = Vec<Vec<W>>;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Form {
    Zset,
    Compact,
}

/// The member the module writes for the `k`-th entry at `t` (docs/design.md:
/// the stamp's last 11 digits, times 1000, plus `k`).
fn member(t: i64, k: i64) -> String {
    ((t % 100_000_000_000) * 1000 + k).to_string()
}

/// What one call did to one key, rendered in each form's commands.
#[derive(Default, Clone)]
struct Effect {
    key: String,
    trim: Option<i64>,
    /// (stamp, the slots removed, in the order they go).
    remove: Option<(i64, Vec<i64>)>,
    /// (stamp, first slot, count).
    add: Option<(i64, i64, i64)>,
    /// The expiry re-armed, as a range on the server clock.
    expire: Option<(i64, i64)>,
}

impl Effect {
    fn on(key: &str) -> Effect {
        Effect {
            key: key.to_string(),
            ..Effect::default()
        }
    }
    fn trim(mut self, cutoff: i64) -> Effect {
        self.trim = Some(cutoff);
        self
    }
    fn remove(mut self, stamp: i64, slots: &[i64]) -> Effect {
        self.remove = Some((stamp, slots.to_vec()));
        self
    }
    fn add(mut self, stamp: i64, first_slot: i64, count: i64) -> Effect {
        self.add = Some((stamp, first_slot, count));
        self
    }
    fn expire(mut self, range: (i64, i64)) -> Effect {
        self.expire = Some(range);
        self
    }

    fn commands(&self, form: Form) -> Expected {
        let key = || is(&self.key);
        match form {
            Form::Zset => {
                let mut out = Vec::new();
                if let Some(cutoff) = self.trim {
                    out.push(vec![is("ZREMRANGEBYSCORE"), key(), is("-inf"), is(cutoff)]);
                }
                if let Some((stamp, slots)) = &self.remove {
                    let mut zrem = vec![is("ZREM"), key()];
                    zrem.extend(slots.iter().map(|&k| is(member(*stamp, k))));
                    out.push(zrem);
                }
                if let Some((stamp, first, count)) = self.add {
                    let mut zadd = vec![is("ZADD"), key()];
                    for k in first..first + count {
                        zadd.push(is(stamp));
                        zadd.push(is(member(stamp, k)));
                    }
                    out.push(zadd);
                }
                if let Some((lo, hi)) = self.expire {
                    out.push(vec![is("PEXPIREAT"), key(), W::Between(lo, hi)]);
                }
                out
            }
            Form::Compact => {
                let mut text = String::new();
                if let Some(cutoff) = self.trim {
                    text += &format!("T{cutoff}");
                }
                if let Some((stamp, slots)) = &self.remove {
                    text += &format!("R{stamp}*{}", slots.len());
                }
                if let Some((stamp, _, count)) = self.add {
                    text += &format!("A{stamp}*{count}");
                }
                let effect = match self.expire {
                    Some((lo, hi)) => W::PrefixBetween(format!("{text}E"), lo, hi),
                    None => is(text),
                };
                vec![vec![is("XCLOAK.APPLY"), key(), effect]]
            }
        }
    }
}

/// How one command execution's propagation is framed (see the file docs).
#[derive(Clone, Copy, PartialEq)]
enum Frame {
    /// A module call on its own.
    Call,
    /// EXEC.
    Transaction,
    /// EVAL or FCALL, calling at least one write-flagged command.
    Script,
}

fn framed(body: Expected, frame: Frame) -> Expected {
    let redis_6 = !at_least_7_0();
    let wrap = match frame {
        Frame::Call | Frame::Transaction => body.len() > 1 || redis_6 && !body.is_empty(),
        // 6.2 opens a script's MULTI at its first write-flagged call, whatever it did.
        Frame::Script => body.len() > 1 || redis_6,
    };
    if !wrap {
        return body;
    }
    let mut out = vec![vec![is("MULTI")]];
    out.extend(body);
    out.push(vec![is("EXEC")]);
    out
}

fn matches(expected: &Expected, got: &[Vec<String>]) -> bool {
    expected.len() == got.len()
        && expected.iter().zip(got).all(|(e, g)| {
            e.len() == g.len()
                && e.iter().zip(g).enumerate().all(|(i, (w, word))| {
                    if i == 0 {
                        w.matches(&word.to_ascii_uppercase())
                    } else {
                        w.matches(word)
                    }
                })
        })
}

/// The server clock in ms (TIME), to bracket the expiry a call sets.
fn server_ms(conn: &mut Connection) -> i64 {
    let (seconds, micros): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    seconds * 1000 + micros / 1000
}

fn allow(conn: &mut Connection, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd("XCLOAK.ALLOW");
    for arg in args {
        cmd.arg(*arg);
    }
    cmd.query(conn).unwrap_or_else(|e| panic!("XCLOAK.ALLOW {args:?}: {e}"))
}

fn call(conn: &mut Connection, words: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(words[0]);
    for arg in &words[1..] {
        cmd.arg(*arg);
    }
    cmd.query(conn).unwrap_or_else(|e| panic!("{words:?}: {e}"))
}

/// One server, one form: attaches a raw replica, runs every case, compares
/// what each propagated.
struct Pinned {
    form: Form,
    conn: Connection,
    stream: ReplicationStream,
    marks: u64,
    checked: usize,
}

impl Pinned {
    fn new(server: &Server, form: Form) -> Pinned {
        let stream = ReplicationStream::attach(server.port);
        let mut pinned = Pinned {
            form,
            conn: server.client(),
            stream,
            marks: 0,
            checked: 0,
        };
        pinned.settle();
        pinned
    }

    /// Writes a mark and reads up to it: what was propagated since the last.
    fn since_last_mark(&mut self) -> Vec<Vec<String>> {
        self.marks += 1;
        mark(&mut self.conn, self.marks);
        self.stream.until_mark(self.marks)
    }

    /// Ends a setup: its propagation is not a case's.
    fn settle(&mut self) {
        self.since_last_mark();
    }

    /// Checks that what the calls since the last mark propagated is `expected`.
    fn check(&mut self, case: &str, expected: Expected) {
        let got = self.since_last_mark();
        assert!(
            matches(&expected, &got),
            "{case} ({:?} form): propagated\n  {got:?}\nexpected\n  {expected:?}",
            self.form
        );
        self.checked += 1;
    }
}

/// Every case on one server.
fn pin_every_case(server: &Server, form: Form) {
    let mut p = Pinned::new(server, form);
    let ttl = MINUTE + 1000;
    let bracket = |p: &mut Pinned, f: &mut dyn FnMut(&mut Connection)| -> (i64, i64) {
        let before = server_ms(&mut p.conn);
        f(&mut p.conn);
        let after = server_ms(&mut p.conn);
        (before, after)
    };

    // An admission on a new key: the entry and the expiry.
    let (before, after) = bracket(&mut p, &mut |c| {
        assert_eq!(
            allow(c, &["a", "60000", "5", "NOW", &T.to_string()]),
            redis::Value::Int(1)
        )
    });
    p.check(
        "admission",
        framed(
            Effect::on("a")
                .add(T, 0, 1)
                .expire((before + ttl, after + ttl))
                .commands(form),
            Frame::Call,
        ),
    );

    // An admission on a key whose expiry is still far: the entry alone.
    call(&mut p.conn, &["PEXPIRE", "a", "100000000"]);
    p.settle();
    allow(&mut p.conn, &["a", "60000", "5", "NOW", &(T + 1).to_string()]);
    allow(
        &mut p.conn,
        &["a", "60000", "5", "NOW", &(T + 1).to_string(), "DETAILS", "STAMP"],
    );
    let body = [
        Effect::on("a").add(T + 1, 0, 1).commands(form),
        Effect::on("a").add(T + 1, 1, 1).commands(form),
    ];
    let expected: Expected = body.into_iter().flat_map(|b| framed(b, Frame::Call)).collect();
    p.check("admission, expiry not re-armed", expected);

    // COST and TIER: the entries at one stamp; the TTL follows the longest window.
    let (before, after) = bracket(&mut p, &mut |c| {
        allow(
            c,
            &[
                "c",
                "1000",
                "10",
                "TIER",
                "60000",
                "20",
                "COST",
                "3",
                "NOW",
                &T.to_string(),
                "DETAILS",
            ],
        );
    });
    p.check(
        "COST 3 with a TIER",
        framed(
            Effect::on("c")
                .add(T, 0, 3)
                .expire((before + ttl, after + ttl))
                .commands(form),
            Frame::Call,
        ),
    );

    // A rejection, in every reply shape, and PEEKs: nothing.
    for _ in 0..2 {
        allow(&mut p.conn, &["r", "60000", "2", "NOW", &T.to_string()]);
    }
    p.settle();
    let later = (T + 5).to_string();
    assert_eq!(
        allow(&mut p.conn, &["r", "60000", "2", "NOW", &later]),
        redis::Value::Int(0)
    );
    allow(&mut p.conn, &["r", "60000", "2", "NOW", &later, "DETAILS"]);
    allow(&mut p.conn, &["r", "60000", "2", "NOW", &later, "STAMP"]);
    allow(
        &mut p.conn,
        &["r", "60000", "2", "TIER", "1000", "1", "NOW", &later, "COST", "2"],
    );
    allow(&mut p.conn, &["never", "60000", "0"]);
    p.check("rejections", Vec::new());
    call(&mut p.conn, &["XCLOAK.PEEK", "r", "60000", "2", "NOW", &later]);
    call(
        &mut p.conn,
        &[
            "XCLOAK.PEEK",
            "r",
            "1000",
            "2",
            "TIER",
            "60000",
            "9",
            "NOW",
            &(T + 999_999).to_string(),
        ],
    );
    call(&mut p.conn, &["XCLOAK.PEEK", "nothing-here", "60000", "2"]);
    p.check("PEEKs", Vec::new());

    // A refund: the highest slots of the stamp first; one that empties the
    // window; one that finds nothing.
    allow(&mut p.conn, &["f", "60000", "5", "NOW", &T.to_string(), "COST", "3"]);
    p.settle();
    call(&mut p.conn, &["XCLOAK.REFUND", "f", &T.to_string(), "COST", "2"]);
    p.check(
        "refund",
        framed(Effect::on("f").remove(T, &[2, 1]).commands(form), Frame::Call),
    );
    call(&mut p.conn, &["XCLOAK.REFUND", "f", &T.to_string(), "COST", "5"]);
    p.check(
        "refund emptying the window",
        framed(Effect::on("f").remove(T, &[0]).commands(form), Frame::Call),
    );
    call(&mut p.conn, &["XCLOAK.REFUND", "f", &T.to_string()]);
    call(&mut p.conn, &["XCLOAK.REFUND", "r", &(T + 7).to_string()]);
    p.check("refunds that find nothing", Vec::new());

    // A trim that empties a window, in a rejected call: the trim alone.
    allow(&mut p.conn, &["e", "1000", "5", "NOW", &T.to_string(), "COST", "2"]);
    p.settle();
    assert_eq!(
        allow(&mut p.conn, &["e", "1000", "0", "NOW", &(T + 5000).to_string()]),
        redis::Value::Int(0)
    );
    p.check(
        "trim emptying a window",
        framed(Effect::on("e").trim(T + 4000).commands(form), Frame::Call),
    );
    assert_eq!(call(&mut p.conn, &["EXISTS", "e"]), redis::Value::Int(0));

    // A trim, then an admission into the emptied key (a new expiry).
    allow(&mut p.conn, &["g", "1000", "5", "NOW", &T.to_string()]);
    p.settle();
    let (before, after) = bracket(&mut p, &mut |c| {
        allow(c, &["g", "1000", "5", "NOW", &(T + 1500).to_string()]);
    });
    let ttl_second = 1000 + 1000;
    p.check(
        "trim then admission",
        framed(
            Effect::on("g")
                .trim(T + 500)
                .add(T + 1500, 0, 1)
                .expire((before + ttl_second, after + ttl_second))
                .commands(form),
            Frame::Call,
        ),
    );

    // CONVERT: DEL, the other form's content, PEXPIREAT of the same expiry.
    allow(&mut p.conn, &["v", "60000", "5", "NOW", &T.to_string(), "COST", "2"]);
    call(&mut p.conn, &["PEXPIREAT", "v", "4102444800000"]);
    p.settle();
    let expiry = W::Between(4_102_444_800_000 - 1, 4_102_444_800_000 + 1);
    match form {
        Form::Zset => {
            // No compact type on this server: refused, or already a sorted set.
            let refused = redis::cmd("XCLOAK.CONVERT")
                .arg("v")
                .arg("COMPACT")
                .query::<i64>(&mut p.conn);
            assert!(refused.is_err());
            assert_eq!(
                call(&mut p.conn, &["XCLOAK.CONVERT", "v", "ZSET"]),
                redis::Value::Int(0)
            );
            p.check("convert refused or a no-op", Vec::new());
        }
        Form::Compact => {
            assert_eq!(
                call(&mut p.conn, &["XCLOAK.CONVERT", "v", "ZSET"]),
                redis::Value::Int(1)
            );
            let mut to_zset = vec![vec![is("DEL"), is("v")]];
            to_zset.extend(Effect::on("v").add(T, 0, 2).commands(Form::Zset));
            to_zset.push(vec![is("PEXPIREAT"), is("v"), expiry.clone()]);
            p.check("convert to a sorted set", framed(to_zset, Frame::Call));
            assert_eq!(
                call(&mut p.conn, &["XCLOAK.CONVERT", "v", "COMPACT"]),
                redis::Value::Int(1)
            );
            let to_compact = vec![
                vec![is("DEL"), is("v")],
                vec![is("XCLOAK.APPLY"), is("v"), is("L"), W::NonEmpty],
                vec![is("PEXPIREAT"), is("v"), expiry.clone()],
            ];
            p.check("convert to the compact form", framed(to_compact, Frame::Call));
            assert_eq!(
                call(&mut p.conn, &["XCLOAK.CONVERT", "v", "COMPACT"]),
                redis::Value::Int(0)
            );
            p.check("convert to the same form", Vec::new());
        }
    }

    // The same calls inside MULTI/EXEC: their effects in order, in one transaction.
    for (key, limit) in [("m:full", "2"), ("m:trim", "5")] {
        allow(&mut p.conn, &[key, "60000", limit, "NOW", &T.to_string(), "COST", "2"]);
    }
    p.settle();
    let t = T.to_string();
    let (before, after) = bracket(&mut p, &mut |c| {
        let _: redis::Value = redis::pipe()
            .atomic()
            .cmd("XCLOAK.ALLOW")
            .arg("m:new")
            .arg(MINUTE)
            .arg(1)
            .arg("NOW")
            .arg(&t) // admitted
            .cmd("XCLOAK.ALLOW")
            .arg("m:new")
            .arg(MINUTE)
            .arg(1)
            .arg("NOW")
            .arg(&t) // rejected
            .cmd("XCLOAK.PEEK")
            .arg("m:full")
            .arg(MINUTE)
            .arg(2)
            .arg("NOW")
            .arg(&t)
            .cmd("XCLOAK.ALLOW")
            .arg("m:full")
            .arg(MINUTE)
            .arg(2)
            .arg("NOW")
            .arg(&t) // rejected
            .cmd("XCLOAK.REFUND")
            .arg("m:full")
            .arg(&t) // slot 1
            .cmd("XCLOAK.ALLOW")
            .arg("m:trim")
            .arg(1000)
            .arg(0)
            .arg("NOW")
            .arg(T + 5000) // trim empties
            .query(c)
            .unwrap();
    });
    let body: Expected = [
        Effect::on("m:new")
            .add(T, 0, 1)
            .expire((before + ttl, after + ttl))
            .commands(form),
        Effect::on("m:full").remove(T, &[1]).commands(form),
        Effect::on("m:trim").trim(T + 4000).commands(form),
    ]
    .concat();
    p.check("MULTI/EXEC", framed(body, Frame::Transaction));
    // A transaction whose calls change nothing.
    let _: redis::Value = redis::pipe()
        .atomic()
        .cmd("XCLOAK.ALLOW")
        .arg("m:new")
        .arg(MINUTE)
        .arg(1)
        .arg("NOW")
        .arg(&t)
        .cmd("XCLOAK.PEEK")
        .arg("m:new")
        .arg(MINUTE)
        .arg(1)
        .arg("NOW")
        .arg(&t)
        .query(&mut p.conn)
        .unwrap();
    p.check(
        "MULTI/EXEC of a rejection and a PEEK",
        framed(Vec::new(), Frame::Transaction),
    );
    let _: redis::Value = redis::pipe()
        .atomic()
        .cmd("XCLOAK.PEEK")
        .arg("m:new")
        .arg(MINUTE)
        .arg(1)
        .query(&mut p.conn)
        .unwrap();
    p.check("MULTI/EXEC of a PEEK", Vec::new());

    // EVAL: the same calls from a script.
    const SCRIPT: &str = "\
        local t = ARGV[1]
        local out = {}
        out[1] = redis.call('XCLOAK.ALLOW', KEYS[1], 60000, 1, 'NOW', t)
        out[2] = redis.call('XCLOAK.ALLOW', KEYS[1], 60000, 1, 'NOW', t)
        out[3] = redis.call('XCLOAK.PEEK', KEYS[2], 60000, 2, 'NOW', t)
        out[4] = redis.call('XCLOAK.REFUND', KEYS[2], t)
        out[5] = redis.call('XCLOAK.ALLOW', KEYS[3], 1000, 0, 'NOW', t + 5000)
        return out";
    let scripted = |p: &mut Pinned, prefix: &str, run: &mut dyn FnMut(&mut Connection, [String; 3])| {
        let keys = [
            format!("{prefix}:new"),
            format!("{prefix}:full"),
            format!("{prefix}:trim"),
        ];
        for key in &keys[1..] {
            allow(
                &mut p.conn,
                &[key.as_str(), "60000", "5", "NOW", &T.to_string(), "COST", "2"],
            );
        }
        p.settle();
        let (before, after) = bracket(p, &mut |c| run(c, keys.clone()));
        [
            Effect::on(&keys[0])
                .add(T, 0, 1)
                .expire((before + ttl, after + ttl))
                .commands(form),
            Effect::on(&keys[1]).remove(T, &[1]).commands(form),
            Effect::on(&keys[2]).trim(T + 4000).commands(form),
        ]
        .concat()
    };
    let body = scripted(&mut p, "s", &mut |c, keys| {
        let reply: Vec<redis::Value> = redis::cmd("EVAL")
            .arg(SCRIPT)
            .arg(3)
            .arg(&keys)
            .arg(T)
            .query(c)
            .unwrap();
        assert_eq!(reply.len(), 5);
    });
    p.check("EVAL", framed(body, Frame::Script));
    let _: redis::Value = redis::cmd("EVAL")
        .arg("redis.call('XCLOAK.ALLOW', KEYS[1], 60000, 1, 'NOW', ARGV[1]); return redis.call('XCLOAK.PEEK', KEYS[1], 60000, 1)")
        .arg(1).arg("s:new").arg(T)
        .query(&mut p.conn)
        .unwrap();
    p.check("EVAL of a rejection and a PEEK", framed(Vec::new(), Frame::Script));

    if !at_least_7_0() {
        eprintln!("skipped: FCALL and EVAL_RO need Redis 7.0+ (this server has no FUNCTION)");
    } else {
        let library = format!(
            "#!lua name=xcloakstream\n\
             redis.register_function('pin', function(KEYS, ARGV) {SCRIPT} end)\n\
             redis.register_function{{function_name='peek', callback=function(KEYS, ARGV) return redis.call('XCLOAK.PEEK', KEYS[1], 60000, 1) end, flags={{'no-writes'}}}}"
        );
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(&library)
            .query(&mut p.conn)
            .unwrap();
        p.settle();
        let body = scripted(&mut p, "fn", &mut |c, keys| {
            let reply: Vec<redis::Value> = redis::cmd("FCALL")
                .arg("pin")
                .arg(3)
                .arg(&keys)
                .arg(T)
                .query(c)
                .unwrap();
            assert_eq!(reply.len(), 5);
        });
        p.check("FCALL", framed(body, Frame::Script));
        let _: redis::Value = redis::cmd("FCALL_RO")
            .arg("peek")
            .arg(1)
            .arg("fn:new")
            .query(&mut p.conn)
            .unwrap();
        let _: redis::Value = redis::cmd("EVAL_RO")
            .arg("return redis.call('XCLOAK.PEEK', KEYS[1], 60000, 1)")
            .arg(1)
            .arg("fn:new")
            .query(&mut p.conn)
            .unwrap();
        p.check("FCALL_RO and EVAL_RO of a PEEK", Vec::new());
    }

    // Nothing but effects ever reached the stream.
    for command in &p.stream.all {
        let name = command[0].to_ascii_uppercase();
        assert!(
            !name.starts_with("XCLOAK.") || name == "XCLOAK.APPLY",
            "{name} reached the stream: {command:?}"
        );
    }
    if form == Form::Zset {
        assert!(
            p.stream.all.iter().all(|c| !c[0].eq_ignore_ascii_case("XCLOAK.APPLY")),
            "a sorted-set window replicated a compact effect"
        );
    }
    assert_eq!(p.stream.db, Some(0), "the stream selected database 0");
    eprintln!(
        "{form:?} form: {} cases pinned, {} commands read, {} PINGs dropped",
        p.checked,
        p.stream.all.len(),
        p.stream.pings
    );
}

fn primary(config: ServerConfig) -> Server {
    // The primary's own PINGs are dropped wherever they fall; an hour
    // between them keeps the stream short.
    config.arg("repl-ping-replica-period", "3600").start()
}

/// Fails if: a rejection or a PEEK propagates anything (the implicit
/// signal, an unconditional PEXPIREAT, a verbatim replication), an effect
/// carries a relative time or the wrong member or cutoff, the expiry is
/// re-armed when it should not be, a refund removes the wrong slots, the
/// effects of a transaction or script are reordered or unframed, or any
/// XCLOAK command but the compact form's effect reaches the stream.
#[test]
fn sorted_set_windows_propagate_exactly_their_effects() {
    pin_every_case(&primary(ServerConfig::default()), Form::Zset);
}

#[test]
fn compact_windows_propagate_exactly_their_effects() {
    pin_every_case(&primary(ServerConfig::compact()), Form::Compact);
}
