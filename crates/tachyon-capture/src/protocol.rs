//! The handshake: what a capture and a program say before the trace flows.
//!
//! ```text
//! capture → program   MAGIC (8) | version u32 | token_len u16 | token (≤ MAX_TOKEN)
//!                     | capabilities u32                       (version 2 on)
//! program → capture   MAGIC (8) | version u32 | status u8 | body_len u32 | body (≤ MAX_BODY)
//!                     welcome body: Hello | granted capabilities u32 (version 2 on)
//! ```
//!
//! Versions: this crate speaks [`MIN_PROTOCOL_VERSION`] to [`PROTOCOL_VERSION`]. The capture
//! states the version it wants; the program reads the magic and version first and refuses a
//! version it does not speak before reading anything else (a later version may lay out the rest
//! differently), with a message naming what each side speaks. A welcome is in the capture's
//! version; a refusal states the program's newest, so a capture meeting an older program can
//! ask again in the program's version ([`crate::client::Connection::connect`] does). Version 1
//! has no capabilities: a version 1 peer on either side gets LZ4 frames, as before.
//!
//! Capabilities (version 2): the capture asks, the program grants a subset, and each side
//! holds the other to the grant. [`CAP_RAW_FRAMES`]: uncompressed data frames
//! ([`crate::frame::KIND_RAW`]), which a capture asks for only over loopback and a program
//! grants only to a loopback peer.
//!
//! `status` is a [`Status`]; a welcome's body is a [`Hello`] (and the grant), a refusal's is a
//! UTF-8 message. All integers are little-endian. After a welcome the program sends frames
//! ([`crate::frame`]) and the capture may send one-byte commands ([`CMD_STOP`]).

use std::io::{self, Read, Write};

/// The first bytes of both sides of the handshake.
pub const MAGIC: [u8; 8] = *b"TACHYCAP";
/// The newest protocol version this crate speaks (what a capture asks for first).
pub const PROTOCOL_VERSION: u32 = 2;
/// The oldest protocol version this crate still speaks (no capabilities, LZ4 frames only).
pub const MIN_PROTOCOL_VERSION: u32 = 1;
/// Capability (version 2 on): uncompressed data frames ([`crate::frame::KIND_RAW`]).
pub const CAP_RAW_FRAMES: u32 = 1;
/// The capabilities this crate knows; a program grants no others.
pub const KNOWN_CAPS: u32 = CAP_RAW_FRAMES;

/// Whether this crate speaks protocol `version`.
pub fn speaks(version: u32) -> bool {
    (MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version)
}

/// The versions this crate speaks, for messages.
pub fn versions_spoken() -> String {
    if MIN_PROTOCOL_VERSION == PROTOCOL_VERSION {
        format!("version {PROTOCOL_VERSION}")
    } else {
        format!("versions {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}")
    }
}
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

    /// Parses a welcome's body (untrusted), version 1's layout: the hello alone (bytes after
    /// it are ignored).
    pub fn decode(body: &[u8]) -> Result<Hello, ProtocolError> {
        Hello::decode_from(&mut Cursor { b: body })
    }

    fn decode_from(r: &mut Cursor<'_>) -> Result<Hello, ProtocolError> {
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
    /// Its token (empty: none). Present only when this crate speaks the version.
    pub token: Vec<u8>,
    /// The capabilities it asks for (0 before version 2; bits this crate does not know are
    /// kept here, and never granted).
    pub caps: u32,
}

/// A welcome, as the capture read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    /// What the program says about itself.
    pub hello: Hello,
    /// The version of the conversation (the one the capture asked for).
    pub version: u32,
    /// The capabilities the program granted (a subset of those asked for).
    pub caps: u32,
}

/// Capture side: sends the request, asking for no capabilities.
pub fn write_request(w: &mut impl Write, version: u32, token: &[u8]) -> io::Result<()> {
    write_request_with(w, version, token, 0)
}

/// Capture side: sends the request, asking for `caps` (sent from version 2 on; a version 1
/// request has no room for them).
pub fn write_request_with(
    w: &mut impl Write,
    version: u32,
    token: &[u8],
    caps: u32,
) -> io::Result<()> {
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
    if version >= 2 {
        b.extend_from_slice(&caps.to_le_bytes());
    }
    w.write_all(&b)?;
    w.flush()
}

/// Program side: reads a capture's request (untrusted: give the socket a read timeout). A
/// version this crate does not speak ([`speaks`]) is returned with an empty token, without
/// reading further.
pub fn read_request(r: &mut impl Read) -> Result<Request, ProtocolError> {
    let mut head = [0u8; 12];
    r.read_exact(&mut head)?;
    if head[..8] != MAGIC {
        return Err(ProtocolError::NotTachyon);
    }
    let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    if !speaks(version) {
        return Ok(Request {
            version,
            token: Vec::new(),
            caps: 0,
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
    let mut caps = 0;
    if version >= 2 {
        let mut c = [0u8; 4];
        r.read_exact(&mut c)?;
        caps = u32::from_le_bytes(c);
    }
    Ok(Request {
        version,
        token,
        caps,
    })
}

/// Program side: sends a refusal (`body`: the message) stating this crate's newest version.
pub fn write_reply(w: &mut impl Write, status: Status, body: &[u8]) -> io::Result<()> {
    write_reply_as(w, PROTOCOL_VERSION, status, body)
}

/// Program side: welcomes a capture that asked for `version` (one this crate speaks), with
/// the hello and, from version 2 on, the capabilities granted.
pub fn write_welcome(w: &mut impl Write, version: u32, hello: &Hello, caps: u32) -> io::Result<()> {
    let mut body = hello.encode();
    if version >= 2 {
        body.extend_from_slice(&caps.to_le_bytes());
    }
    write_reply_as(w, version, Status::Welcome, &body)
}

fn write_reply_as(w: &mut impl Write, version: u32, status: Status, body: &[u8]) -> io::Result<()> {
    let body = &body[..body.len().min(MAX_BODY)];
    let mut b = Vec::with_capacity(17 + body.len());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&version.to_le_bytes());
    b.push(status as u8);
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(body);
    w.write_all(&b)?;
    w.flush()
}

/// Capture side: reads the program's reply to a request for [`PROTOCOL_VERSION`] with no
/// capabilities (untrusted). A welcome gives its [`Hello`]; a refusal or a version we do not
/// speak is an error whose message names the reason (both versions for a mismatch).
pub fn read_reply(r: &mut impl Read) -> Result<Hello, ProtocolError> {
    read_welcome(r, PROTOCOL_VERSION, 0).map(|w| w.hello)
}

/// Capture side: reads the program's reply to a request for `version` asking for `caps`
/// (untrusted). A welcome must be in `version` and grant no capability beyond `caps`; a
/// refusal is [`ProtocolError::Refused`] with the program's message (on a version mismatch,
/// one that names both sides' versions).
pub fn read_welcome(r: &mut impl Read, version: u32, caps: u32) -> Result<Welcome, ProtocolError> {
    let reply = read_raw_reply(r)?;
    reply.into_welcome(version, caps)
}

/// A reply's parts, before they are interpreted.
#[derive(Debug)]
pub(crate) struct RawReply {
    /// The version the program stated.
    pub(crate) version: u32,
    pub(crate) status: Status,
    body: Vec<u8>,
}

pub(crate) fn read_raw_reply(r: &mut impl Read) -> Result<RawReply, ProtocolError> {
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
    Ok(RawReply {
        version,
        status,
        body,
    })
}

impl RawReply {
    pub(crate) fn into_welcome(self, asked: u32, caps: u32) -> Result<Welcome, ProtocolError> {
        let RawReply {
            version,
            status,
            body,
        } = self;
        let mismatch = || {
            ProtocolError::Refused {
            status: Status::VersionMismatch,
            message: format!(
                "protocol version mismatch: the capture asked for version {asked} (it speaks {}), the program speaks version {version}",
                versions_spoken()
            ),
        }
        };
        if status == Status::VersionMismatch {
            // The program's own message names both sides; a program without one gets ours.
            let message = String::from_utf8_lossy(&body).into_owned();
            if message.is_empty() {
                return Err(mismatch());
            }
            return Err(ProtocolError::Refused { status, message });
        }
        if status != Status::Welcome {
            return Err(ProtocolError::Refused {
                status,
                message: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        if version != asked {
            return Err(mismatch());
        }
        let mut r = Cursor { b: &body };
        let hello = Hello::decode_from(&mut r)?;
        let granted = if version >= 2 {
            u32::from_le_bytes(r.take_array()?)
        } else {
            0
        };
        if granted & !caps != 0 {
            return Err(ProtocolError::Malformed(
                "the program granted a capability the capture did not ask for",
            ));
        }
        Ok(Welcome {
            hello,
            version,
            caps: granted,
        })
    }
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

    fn hello() -> Hello {
        Hello {
            program: "demo".into(),
            pid: 7,
            host: "box".into(),
            start_unix_ns: 1,
            clock: "tsc".into(),
            on_demand: false,
        }
    }

    #[test]
    fn capabilities_are_asked_for_and_granted_from_version_2() {
        // Version 2: the request carries the capabilities, the welcome the grant.
        let mut b = Vec::new();
        write_request_with(&mut b, 2, b"t", CAP_RAW_FRAMES | 0x80).unwrap();
        let req = read_request(&mut &b[..]).unwrap();
        assert_eq!((req.version, req.caps), (2, CAP_RAW_FRAMES | 0x80));
        assert_eq!(req.token, b"t");
        let mut r = Vec::new();
        write_welcome(&mut r, 2, &hello(), CAP_RAW_FRAMES).unwrap();
        let w = read_welcome(&mut &r[..], 2, CAP_RAW_FRAMES).unwrap();
        assert_eq!((w.version, w.caps, w.hello), (2, CAP_RAW_FRAMES, hello()));
        // A grant beyond what was asked is refused.
        assert!(matches!(
            read_welcome(&mut &r[..], 2, 0),
            Err(ProtocolError::Malformed(_))
        ));
        // A welcome whose grant is cut short is malformed.
        let mut cut = r.clone();
        cut.truncate(cut.len() - 2);
        let len = (cut.len() - 17) as u32;
        cut[13..17].copy_from_slice(&len.to_le_bytes());
        assert!(read_welcome(&mut &cut[..], 2, CAP_RAW_FRAMES).is_err());
        // Version 1: no capabilities on either side, byte for byte what a version 1 peer
        // writes and reads.
        let mut b = Vec::new();
        write_request_with(&mut b, 1, b"t", CAP_RAW_FRAMES).unwrap();
        assert_eq!(b.len(), 8 + 4 + 2 + 1);
        let req = read_request(&mut &b[..]).unwrap();
        assert_eq!((req.version, req.caps), (1, 0));
        let mut r = Vec::new();
        write_welcome(&mut r, 1, &hello(), CAP_RAW_FRAMES).unwrap();
        assert_eq!(&r[17..], &hello().encode()[..]);
        assert_eq!(r[8..12], 1u32.to_le_bytes());
        let w = read_welcome(&mut &r[..], 1, 0).unwrap();
        assert_eq!((w.version, w.caps), (1, 0));
        // A welcome in another version than the one asked for is a mismatch naming both.
        match read_welcome(&mut &r[..], 2, 0) {
            Err(ProtocolError::Refused { status, message }) => {
                assert_eq!(status, Status::VersionMismatch);
                assert!(
                    message.contains("version 2") && message.contains("version 1"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_version_nobody_speaks_is_refused_with_both_versions() {
        // The program's side: a version it does not speak is returned without reading on.
        let mut b = Vec::new();
        write_request_with(&mut b, 3, b"", CAP_RAW_FRAMES).unwrap();
        let req = read_request(&mut &b[..]).unwrap();
        assert_eq!((req.version, req.token.len(), req.caps), (3, 0, 0));
        assert!(!speaks(3) && !speaks(0) && speaks(1) && speaks(2));
        // A refusal without a message still names both sides.
        let mut r = Vec::new();
        write_reply(&mut r, Status::VersionMismatch, b"").unwrap();
        match read_welcome(&mut &r[..], 3, 0) {
            Err(ProtocolError::Refused { message, .. }) => {
                assert!(
                    message.contains("version 3") && message.contains("version 2"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tokens_compare() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abc", b"abd"));
        assert!(!token_matches(b"abc", b"ab"));
    }
}
