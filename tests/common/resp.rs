//! RESP over a raw socket, for what a client library hides: a reply that has
//! not arrived yet (a paused client), push messages (client-side caching),
//! and the replication stream (`stream.rs`).

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

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
    if line.is_empty() {
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
