//! RESP over a raw socket, for what a client library hides: a reply that has
//! not arrived yet (a paused client), push messages (client-side caching),
//! the replication stream (`stream.rs`), and a reply that arrives after the
//! caller gave up (`RespConn`, the fault harness's writers).
//!
//! One reader of RESP2 and RESP3 (`read_value`); `parse` applies it to a
//! buffer that may hold an incomplete reply.

use std::io::{self, BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// One RESP2/RESP3 value. Maps come as flat arrays of keys and values.
#[derive(Clone, Debug, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Resp>),
    /// A RESP3 push message (`>`): invalidations, pub/sub.
    Push(Vec<Resp>),
}

impl Resp {
    pub fn int(&self) -> i64 {
        match self {
            Resp::Int(i) => *i,
            other => panic!("not an integer: {other:?}"),
        }
    }

    pub fn text(&self) -> String {
        match self {
            Resp::Simple(s) | Resp::Error(s) => s.clone(),
            Resp::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Resp::Int(i) => i.to_string(),
            other => panic!("not text: {other:?}"),
        }
    }

    pub fn items(&self) -> &[Resp] {
        match self {
            Resp::Array(items) | Resp::Push(items) => items,
            other => panic!("not an array: {other:?}"),
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }
}

/// A command as RESP (an array of bulk strings).
pub fn encode(words: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for word in words {
        out.extend_from_slice(format!("${}\r\n", word.len()).as_bytes());
        out.extend_from_slice(word);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// One line without its CRLF; an error at the end of the stream.
pub fn read_line(reader: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        // Nothing, or a line cut short: the stream (or the buffer) ended.
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
    }
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    Ok(line)
}

fn number(bytes: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not a number: {:?}", String::from_utf8_lossy(bytes)),
            )
        })
}

fn read_items(reader: &mut impl BufRead, count: i64) -> io::Result<Vec<Resp>> {
    (0..count.max(0)).map(|_| read_value(reader)).collect()
}

/// Reads one value.
pub fn read_value(reader: &mut impl BufRead) -> io::Result<Resp> {
    let line = read_line(reader)?;
    let (kind, rest) = line
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "empty line"))?;
    let text = || String::from_utf8_lossy(rest).into_owned();
    Ok(match kind {
        b'+' => Resp::Simple(text()),
        b'-' => Resp::Error(text()),
        b':' => Resp::Int(number(rest)?),
        b'$' | b'=' => {
            let len = number(rest)?;
            if len < 0 {
                Resp::Nil
            } else {
                let mut bytes = vec![0; len as usize + 2];
                reader.read_exact(&mut bytes)?;
                bytes.truncate(len as usize);
                Resp::Bulk(bytes)
            }
        }
        b'*' | b'~' => match number(rest)? {
            n if n < 0 => Resp::Nil,
            n => Resp::Array(read_items(reader, n)?),
        },
        b'%' => Resp::Array(read_items(reader, number(rest)? * 2)?),
        b'>' => Resp::Push(read_items(reader, number(rest)?)?),
        b'_' => Resp::Nil,
        b'#' => Resp::Int((rest == b"t") as i64),
        b',' => Resp::Simple(text()),
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown RESP type {:?}", *other as char),
            ))
        }
    })
}

/// One complete value at the start of `buf` and its length in bytes; `None`
/// while `buf` holds only part of one (more bytes are to come).
pub fn parse(buf: &[u8]) -> io::Result<Option<(Resp, usize)>> {
    let mut rest = buf;
    match read_value(&mut rest) {
        Ok(value) => Ok(Some((value, buf.len() - rest.len()))),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// The error code of a reply (`READONLY`, `MOVED`, ...), if it is an error.
pub fn error_code(value: &Resp) -> Option<String> {
    match value {
        Resp::Error(text) => Some(text.split(' ').next().unwrap_or("").to_string()),
        _ => None,
    }
}

/// The text of an error reply.
pub fn error_text(value: &Resp) -> Option<String> {
    match value {
        Resp::Error(text) => Some(text.clone()),
        _ => None,
    }
}

/// A connection speaking RESP directly.
pub struct Raw {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Raw {
    pub fn connect(port: u16) -> Raw {
        let writer = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect to {port}: {e}"));
        writer.set_nodelay(true).unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        let mut raw = Raw { reader, writer };
        raw.set_timeout(Some(Duration::from_secs(60)));
        raw
    }

    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.writer.set_read_timeout(timeout).unwrap();
    }

    /// Sends a command without waiting for its reply.
    pub fn send(&mut self, words: &[&str]) {
        let words: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        self.writer.write_all(&encode(&words)).unwrap();
    }

    /// The next value: a reply or a push message.
    pub fn read(&mut self) -> io::Result<Resp> {
        read_value(&mut self.reader)
    }

    /// True if nothing arrives within `wait` (what arrives stays buffered
    /// for the next `read`; a closed connection is not "nothing").
    pub fn nothing_within(&mut self, wait: Duration) -> bool {
        self.set_timeout(Some(wait));
        let outcome = match self.reader.fill_buf() {
            Ok(_) => false,
            Err(e) => matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
        };
        self.set_timeout(Some(Duration::from_secs(60)));
        outcome
    }

    /// Sends a command and reads its reply (skipping push messages).
    pub fn call(&mut self, words: &[&str]) -> Resp {
        self.send(words);
        loop {
            match self.read().unwrap_or_else(|e| panic!("{words:?}: {e}")) {
                Resp::Push(_) => continue,
                reply => return reply,
            }
        }
    }
}

/// A connection that keeps what a client library hides: a reply that arrives
/// after the client gave up. Commands are encoded by the `redis` crate
/// (`Cmd::get_packed_command`); replies are read into a buffer and parsed
/// (`parse`), so a read that times out leaves the connection intact, and the
/// late reply can still be read from it (by the fault harness's drainer).
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
    pub fn recv(&mut self, deadline: Instant) -> Result<Resp, RecvError> {
        let mut chunk = [0u8; 4096];
        loop {
            match parse(&self.buf) {
                Ok(Some((value, used))) => {
                    self.buf.drain(..used);
                    return Ok(value);
                }
                Ok(None) => {}
                Err(e) => return Err(RecvError::Closed(format!("unreadable reply from {}: {e}", self.addr))),
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
    pub fn call(&mut self, command: &redis::Cmd, timeout: Duration) -> Result<Resp, String> {
        self.send(&[command])?;
        self.recv(Instant::now() + timeout).map_err(|e| format!("{e:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_complete_replies_only() {
        assert_eq!(parse(b":17\r\n").unwrap(), Some((Resp::Int(17), 5)));
        assert_eq!(parse(b":17\r").unwrap(), None);
        let (value, used) = parse(b"*2\r\n:1\r\n$3\r\nabc\r\n:9\r\n").unwrap().unwrap();
        assert_eq!(value, Resp::Array(vec![Resp::Int(1), Resp::Bulk(b"abc".to_vec())]));
        assert_eq!(used, 17);
        assert_eq!(parse(b"*2\r\n:1\r\n$3\r\nab").unwrap(), None);
        let (error, _) = parse(b"-READONLY You can't write against a read only replica.\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(error_code(&error).as_deref(), Some("READONLY"));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Some((Resp::Nil, 5)));
        assert_eq!(
            parse(b">2\r\n+invalidate\r\n*1\r\n$1\r\nk\r\n")
                .unwrap()
                .map(|(v, _)| v),
            Some(Resp::Push(vec![
                Resp::Simple("invalidate".into()),
                Resp::Array(vec![Resp::Bulk(b"k".to_vec())])
            ]))
        );
        assert!(parse(b"?what\r\n").is_err(), "an unknown type is an error, not a reply");
    }
}
