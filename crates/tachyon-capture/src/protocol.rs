//! The handshake: what a capture and a program say before the trace flows.
//!
//! ```text
//! capture → program   MAGIC (8) | version u32 | token_len u16 | token (≤ MAX_TOKEN)
//! program → capture   MAGIC (8) | version u32 | status u8 | body_len u32 | body (≤ MAX_BODY)
//! ```
//!
//! The program reads the capture's magic and version first and refuses a version it does not
//! speak before reading anything else (a later version may lay out the rest differently); its
//! reply always states its own version, so both sides can name both. `status` is a [`Status`];
//! a welcome's body is a [`Hello`], a refusal's is a UTF-8 message. All integers are
//! little-endian. After a welcome the program sends frames ([`crate::frame`]) and the capture
//! may send one-byte commands ([`CMD_STOP`]).

use std::io::{self, Read, Write};

/// The first bytes of both sides of the handshake.
pub const MAGIC: [u8; 8] = *b"TACHYCAP";
/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// The port a program listens on when no port is configured (Tracy's is 8086; Tachyon's own
/// is 8110). When it is taken, the next [`PORT_ATTEMPTS`]` - 1` ports are tried.
pub const DEFAULT_PORT: u16 = 8110;
/// How many ports from [`DEFAULT_PORT`] up a program tries.
pub const PORT_ATTEMPTS: u16 = 20;
/// Longest token a capture may send.
pub const MAX_TOKEN: usize = 1024;
/// Longest reply body a program may send.
pub const MAX_BODY: usize = 64 * 1024;
/// Longest string in a [`Hello`].
pub const MAX_STRING: usize = 4096;
/// Capture → program after the handshake: end the trace (the program sends what it has, the
/// final stats and an end frame, then closes).
pub const CMD_STOP: u8 = b'S';

/// The program's answer to a capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Accepted: a [`Hello`] follows, then the trace.
    Welcome = 0,
    /// The capture speaks another protocol version.
    VersionMismatch = 1,
    /// The token is missing or wrong.
    BadToken = 2,
    /// Another capture is attached.
    Busy = 3,
    /// Refused for another reason (the program is exiting, ...).
    Refused = 4,
}

impl Status {
    fn from_u8(v: u8) -> Option<Status> {
        Some(match v {
            0 => Status::Welcome,
            1 => Status::VersionMismatch,
            2 => Status::BadToken,
            3 => Status::Busy,
            4 => Status::Refused,
            _ => return None,
        })
    }
}

/// What a program says about itself when it welcomes a capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The program's name (as on the trace).
    pub program: String,
    /// Its process id.
    pub pid: u32,
    /// The host it runs on.
    pub host: String,
    /// When the program started tracing, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    /// How its timestamps are taken (e.g. `tsc 2.9 GHz → boottime ns`).
    pub clock: String,
    /// On-demand mode: the trace starts at this connection.
    pub on_demand: bool,
}

impl Hello {
    /// The body of a welcome.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.program.len() + self.host.len());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.start_unix_ns.to_le_bytes());
        b.push(u8::from(self.on_demand));
        for s in [&self.program, &self.host, &self.clock] {
            let s = truncate(s, MAX_STRING);
            b.extend_from_slice(&(s.len() as u16).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        }
        b
    }

    /// Parses a welcome's body (untrusted).
    pub fn decode(body: &[u8]) -> Result<Hello, ProtocolError> {
        let mut r = Cursor { b: body };
        let pid = u32::from_le_bytes(r.take_array()?);
        let start_unix_ns = u64::from_le_bytes(r.take_array()?);
        let on_demand = r.take_array::<1>()?[0] != 0;
        let mut s = || -> Result<String, ProtocolError> {
            let n = u16::from_le_bytes(r.take_array()?) as usize;
            if n > MAX_STRING {
                return Err(ProtocolError::Malformed(
                    "a string in the hello is too long",
                ));
            }
            Ok(String::from_utf8_lossy(r.take(n)?).into_owned())
        };
        Ok(Hello {
            pid,
            start_unix_ns,
            on_demand,
            program: s()?,
            host: s()?,
            clock: s()?,
        })
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        if self.b.len() < n {
            return Err(ProtocolError::Malformed("the hello is truncated"));
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Ok(head)
    }
    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], ProtocolError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
}

/// A handshake that failed.
#[derive(Debug)]
pub enum ProtocolError {
    /// The socket failed (or timed out).
    Io(io::Error),
    /// The peer does not speak this protocol at all.
    NotTachyon,
    /// The peer speaks another version.
    VersionMismatch {
        /// Ours.
        ours: u32,
        /// Theirs.
        theirs: u32,
    },
    /// The program refused the capture.
    Refused {
        /// Why (its status).
        status: Status,
        /// Its message.
        message: String,
    },
    /// Bytes that break the protocol.
    Malformed(&'static str),
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtocolError::Io(e) => write!(f, "{e}"),
            ProtocolError::NotTachyon => f.write_str("the peer does not speak Tachyon's capture protocol (wrong magic)"),
            ProtocolError::VersionMismatch { ours, theirs } => write!(
                f,
                "protocol version mismatch: this side speaks version {ours}, the peer version {theirs}"
            ),
            ProtocolError::Refused { message, .. } => f.write_str(message),
            ProtocolError::Malformed(why) => write!(f, "malformed handshake: {why}"),
        }
    }
}

impl std::error::Error for ProtocolError {}

impl From<io::Error> for ProtocolError {
    fn from(e: io::Error) -> Self {
        ProtocolError::Io(e)
    }
}

/// The capture's request, as the program read it.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    /// The capture's protocol version.
    pub version: u32,
    /// Its token (empty: none). Present only when the version is ours.
    pub token: Vec<u8>,
}

/// Capture side: sends the request.
pub fn write_request(w: &mut impl Write, version: u32, token: &[u8]) -> io::Result<()> {
    if token.len() > MAX_TOKEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the token is longer than {MAX_TOKEN} bytes"),
        ));
    }
    let mut b = Vec::with_capacity(14 + token.len());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&(token.len() as u16).to_le_bytes());
    b.extend_from_slice(token);
    w.write_all(&b)?;
    w.flush()
}

/// Program side: reads a capture's request (untrusted: give the socket a read timeout). A
/// version other than ours is returned with an empty token, without reading further.
pub fn read_request(r: &mut impl Read) -> Result<Request, ProtocolError> {
    let mut head = [0u8; 12];
    r.read_exact(&mut head)?;
    if head[..8] != MAGIC {
        return Err(ProtocolError::NotTachyon);
    }
    let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    if version != PROTOCOL_VERSION {
        return Ok(Request {
            version,
            token: Vec::new(),
        });
    }
    let mut len = [0u8; 2];
    r.read_exact(&mut len)?;
    let len = u16::from_le_bytes(len) as usize;
    if len > MAX_TOKEN {
        return Err(ProtocolError::Malformed("the token is too long"));
    }
    let mut token = vec![0u8; len];
    r.read_exact(&mut token)?;
    Ok(Request { version, token })
}

/// Program side: sends the reply (a welcome with `body` = [`Hello::encode`], or a refusal
/// with a message).
pub fn write_reply(w: &mut impl Write, status: Status, body: &[u8]) -> io::Result<()> {
    let body = &body[..body.len().min(MAX_BODY)];
    let mut b = Vec::with_capacity(17 + body.len());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    b.push(status as u8);
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(body);
    w.write_all(&b)?;
    w.flush()
}

/// Capture side: reads the program's reply (untrusted). A welcome gives its [`Hello`]; a
/// refusal or a version we do not speak is an error whose message names the reason (both
/// versions for a mismatch).
pub fn read_reply(r: &mut impl Read) -> Result<Hello, ProtocolError> {
    let mut head = [0u8; 17];
    r.read_exact(&mut head)?;
    if head[..8] != MAGIC {
        return Err(ProtocolError::NotTachyon);
    }
    let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    let status = head[12];
    let len = u32::from_le_bytes(head[13..17].try_into().expect("4 bytes")) as usize;
    if len > MAX_BODY {
        return Err(ProtocolError::Malformed("the reply body is too long"));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let status = Status::from_u8(status).ok_or(ProtocolError::Malformed("unknown status"))?;
    if status == Status::VersionMismatch || version != PROTOCOL_VERSION {
        return Err(ProtocolError::Refused {
            status: Status::VersionMismatch,
            message: format!(
                "protocol version mismatch: the capture speaks version {PROTOCOL_VERSION}, the program version {version}"
            ),
        });
    }
    if status != Status::Welcome {
        return Err(ProtocolError::Refused {
            status,
            message: String::from_utf8_lossy(&body).into_owned(),
        });
    }
    Hello::decode(&body)
}

/// Compares a token without leaking where it differs through timing.
pub fn token_matches(expected: &[u8], given: &[u8]) -> bool {
    if expected.len() != given.len() {
        return false;
    }
    expected
        .iter()
        .zip(given)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_truncated_bodies_fail() {
        let h = Hello {
            program: "demo".into(),
            pid: 42,
            host: "box".into(),
            start_unix_ns: 1_700_000_000_000_000_000,
            clock: "tsc".into(),
            on_demand: true,
        };
        let b = h.encode();
        assert_eq!(Hello::decode(&b).unwrap(), h);
        for n in 0..b.len() {
            assert!(Hello::decode(&b[..n]).is_err(), "{n}");
        }
    }

    #[test]
    fn request_and_reply_round_trip() {
        let mut b = Vec::new();
        write_request(&mut b, PROTOCOL_VERSION, b"secret").unwrap();
        let req = read_request(&mut &b[..]).unwrap();
        assert_eq!(req.token, b"secret");
        let mut b = Vec::new();
        write_request(&mut b, 99, b"secret").unwrap();
        assert_eq!(read_request(&mut &b[..]).unwrap().version, 99);
        let mut r = Vec::new();
        write_reply(&mut r, Status::Busy, b"busy").unwrap();
        match read_reply(&mut &r[..]) {
            Err(ProtocolError::Refused { status, message }) => {
                assert_eq!(status, Status::Busy);
                assert_eq!(message, "busy");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read_request(&mut &b"GARBAGE!\x01\0\0\0"[..]),
            Err(ProtocolError::NotTachyon)
        ));
    }

    #[test]
    fn tokens_compare() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abc", b"abd"));
        assert!(!token_matches(b"abc", b"ab"));
    }
}
