//! The replication stream, read as a replica reads it: `SYNC` on a raw
//! socket, the RDB payload skipped, then every propagated command.
//!
//! The server adds commands of its own: `PING` every
//! `repl-ping-replica-period` seconds, and `SELECT <db>` before the first
//! command (and whenever the database changes). They are dealt with the same
//! way every time: a `PING` is dropped wherever it falls, and a `SELECT` is
//! remembered as the current database (`db`) and dropped, so what a test
//! compares is exactly what its calls propagated. Calls are told apart by a
//! mark (`mark`): a `SET` of a key no call touches, written after each group
//! of calls and read back with `until_mark`.

use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::resp::{self, Resp};

/// The key the marks are written to.
pub const MARK_KEY: &str = "xcloak:test:stream-mark";

pub struct ReplicationStream {
    reader: BufReader<TcpStream>,
    /// The database the stream last selected.
    pub db: Option<i64>,
    /// `PING`s dropped so far.
    pub pings: usize,
    /// Every command read so far (marks included), in order.
    pub all: Vec<Vec<String>>,
}

impl ReplicationStream {
    /// Attaches to the server on `port` as a replica and skips the RDB payload.
    pub fn attach(port: u16) -> ReplicationStream {
        let mut socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
        socket
            .set_read_timeout(Some(super::valgrind::patience(Duration::from_secs(30))))
            .unwrap();
        // SYNC gets the payload as `$<length>`: a replica that does not
        // announce `capa eof` is never sent a diskless `$EOF:` stream.
        socket.write_all(&resp::encode(&[b"SYNC"])).unwrap();
        let mut reader = BufReader::with_capacity(1 << 16, socket);
        let header = loop {
            // Empty lines are keep-alives while the primary writes the RDB.
            let line = resp::read_line(&mut reader).expect("the SYNC reply");
            if !line.is_empty() {
                break line;
            }
        };
        assert_eq!(
            header.first(),
            Some(&b'$'),
            "unexpected SYNC reply {:?}",
            String::from_utf8_lossy(&header)
        );
        let length: u64 = String::from_utf8_lossy(&header[1..])
            .parse()
            .expect("the payload length");
        io::copy(&mut (&mut reader).take(length), &mut io::sink()).unwrap();
        ReplicationStream {
            reader,
            db: None,
            pings: 0,
            all: Vec::new(),
        }
    }

    /// The next command the server propagated, PINGs and SELECTs dealt with.
    pub fn next_command(&mut self) -> Vec<String> {
        loop {
            let value = resp::read_value(&mut self.reader)
                .unwrap_or_else(|e| panic!("replication stream: {e}; read so far: {:?}", self.all));
            let words: Vec<String> = match value {
                Resp::Array(items) => items.iter().map(Resp::text).collect(),
                other => panic!("not a command in the replication stream: {other:?}"),
            };
            match words[0].to_ascii_uppercase().as_str() {
                "PING" => self.pings += 1,
                "SELECT" => self.db = Some(words[1].parse().expect("SELECT's database")),
                _ => {
                    self.all.push(words.clone());
                    return words;
                }
            }
        }
    }

    /// The commands propagated since the last mark, up to the mark `n`
    /// (which `mark` wrote), in order.
    pub fn until_mark(&mut self, n: u64) -> Vec<Vec<String>> {
        let mut commands = Vec::new();
        loop {
            let words = self.next_command();
            if words.len() == 3 && words[0].eq_ignore_ascii_case("SET") && words[1] == MARK_KEY {
                assert_eq!(
                    words[2],
                    n.to_string(),
                    "marks arrive in order; before it: {commands:?}"
                );
                return commands;
            }
            commands.push(words);
        }
    }
}

/// Writes mark `n` (read back by `until_mark`).
pub fn mark(conn: &mut redis::Connection, n: u64) {
    let _: () = redis::cmd("SET").arg(MARK_KEY).arg(n).query(conn).unwrap();
}
