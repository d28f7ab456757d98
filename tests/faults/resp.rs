//! A connection that keeps what a client library hides: a reply that arrives
//! after the client gave up. Commands are encoded by the `redis` crate
//! (`Cmd::get_packed_command`); replies are read into a buffer and parsed
//! here, so a read that times out leaves the connection intact, and the
//! late reply can still be read from it (by the drainer, `load.rs`).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A reply, as RESP2 sends it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Simple(String),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Value>),
    /// `-CODE message`.
    Error(String),
}

pub struct RespConn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Where this connection goes (`host:port`).
    pub addr: String,
}

/// Why a reply did not come.
#[derive(Debug)]
pub enum RecvError {
    /// Nothing (complete) arrived before the deadline: the call may still run.
    Timeout,
    /// The connection closed or failed: the call's outcome is unknown.
    Closed(String),
}

impl RespConn {
    pub fn connect(addr: &str, timeout: Duration) -> Result<RespConn, String> {
        let socket: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
        let stream = TcpStream::connect_timeout(&socket, timeout).map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(RespConn {
            stream,
            buf: Vec::with_capacity(256),
            addr: addr.to_string(),
        })
    }

    /// Writes the commands in one go (a pipeline).
    pub fn send(&mut self, commands: &[&redis::Cmd]) -> Result<(), String> {
        let mut bytes = Vec::with_capacity(128 * commands.len());
        for command in commands {
            bytes.extend_from_slice(&command.get_packed_command());
        }
        self.stream
            .write_all(&bytes)
            .map_err(|e| format!("write to {}: {e}", self.addr))
    }

    /// The next reply, waiting until `deadline` at most.
    pub fn recv(&mut self, deadline: Instant) -> Result<Value, RecvError> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some((value, used)) = parse(&self.buf) {
                self.buf.drain(..used);
                return Ok(value);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RecvError::Timeout);
            }
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(|e| RecvError::Closed(e.to_string()))?;
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(RecvError::Closed("closed by the server".into())),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if Instant::now() >= deadline {
                        return Err(RecvError::Timeout);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(RecvError::Closed(e.to_string())),
            }
        }
    }

    /// One command, one reply.
    pub fn call(&mut self, command: &redis::Cmd, timeout: Duration) -> Result<Value, String> {
        self.send(&[command])?;
        self.recv(Instant::now() + timeout).map_err(|e| format!("{e:?}"))
    }
}

/// One complete RESP2 reply at the start of `buf`, and its length.
pub fn parse(buf: &[u8]) -> Option<(Value, usize)> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[1..line_end]).ok()?;
    let after = line_end + 2;
    match *buf.first()? {
        b'+' => Some((Value::Simple(line.to_string()), after)),
        b'-' => Some((Value::Error(line.to_string()), after)),
        b':' => Some((Value::Int(line.parse().ok()?), after)),
        b'$' => {
            let len: i64 = line.parse().ok()?;
            if len < 0 {
                return Some((Value::Nil, after));
            }
            let end = after + len as usize;
            if buf.len() < end + 2 {
                return None;
            }
            Some((Value::Bulk(buf[after..end].to_vec()), end + 2))
        }
        b'*' => {
            let count: i64 = line.parse().ok()?;
            if count < 0 {
                return Some((Value::Nil, after));
            }
            let mut items = Vec::with_capacity(count as usize);
            let mut at = after;
            for _ in 0..count {
                let (item, used) = parse(&buf[at..])?;
                items.push(item);
                at += used;
            }
            Some((Value::Array(items), at))
        }
        _ => Some((Value::Error(format!("ERR unparsable reply {line}")), after)),
    }
}

/// The error code of a reply (`READONLY`, `MOVED`, ...), if it is an error.
pub fn error_code(value: &Value) -> Option<String> {
    match value {
        Value::Error(text) => Some(text.split(' ').next().unwrap_or("").to_string()),
        _ => None,
    }
}

/// The text of an error reply.
pub fn error_text(value: &Value) -> Option<String> {
    match value {
        Value::Error(text) => Some(text.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_complete_replies_only() {
        assert_eq!(parse(b":17\r\n"), Some((Value::Int(17), 5)));
        assert_eq!(parse(b":17\r"), None);
        let (value, used) = parse(b"*2\r\n:1\r\n$3\r\nabc\r\n:9\r\n").unwrap();
        assert_eq!(value, Value::Array(vec![Value::Int(1), Value::Bulk(b"abc".to_vec())]));
        assert_eq!(used, 17);
        assert_eq!(parse(b"*2\r\n:1\r\n$3\r\nab"), None);
        let (error, _) = parse(b"-READONLY You can't write against a read only replica.\r\n").unwrap();
        assert_eq!(error_code(&error).as_deref(), Some("READONLY"));
        assert_eq!(parse(b"$-1\r\n"), Some((Value::Nil, 5)));
    }
}
