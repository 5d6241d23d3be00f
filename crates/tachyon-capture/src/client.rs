//! The capture side of a connection: connect, shake hands, read frames, ask the program to stop.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::frame::{Frame, FrameError, FrameReader};
use crate::protocol::{
    self, Hello, ProtocolError, Status, CAP_RAW_FRAMES, CMD_STOP, PROTOCOL_VERSION,
};

/// How long the handshake may take once connected.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A capture connected to a program.
#[derive(Debug)]
pub struct Connection {
    reader: FrameReader<TcpStream>,
    writer: TcpStream,
    hello: Hello,
    version: u32,
    caps: u32,
}

impl Connection {
    /// Connects to `addr` (waiting at most `timeout` for the TCP connection), sends our newest
    /// version and `token`, and reads the program's answer. Over loopback it asks for
    /// uncompressed frames ([`CAP_RAW_FRAMES`]: on one machine LZ4 costs more CPU than the
    /// copy it saves). A program that speaks only an older version this crate still speaks is
    /// asked again in that version (a version 1 program sends LZ4 frames). A refusal is
    /// [`ProtocolError::Refused`] with the program's message.
    pub fn connect(
        addr: SocketAddr,
        token: &[u8],
        timeout: Duration,
    ) -> Result<Connection, ProtocolError> {
        let caps = if addr.ip().is_loopback() {
            CAP_RAW_FRAMES
        } else {
            0
        };
        Self::connect_with(addr, token, timeout, PROTOCOL_VERSION, caps)
    }

    /// One handshake claiming protocol `version`, asking for no capabilities and never asking
    /// again in another version (to act as a capture of another version: a version 1 capture,
    /// or one the program refuses).
    pub fn connect_with_version(
        addr: SocketAddr,
        token: &[u8],
        timeout: Duration,
        version: u32,
    ) -> Result<Connection, ProtocolError> {
        Self::attempt(addr, token, timeout, version, 0)?.map_err(|(_, refusal)| refusal)
    }

    /// Connects asking for protocol `version` and capabilities `caps`
    /// ([`protocol`](crate::protocol)). When the program refuses the version and states an
    /// older one that this crate speaks, the request is made again in that version (without
    /// capabilities before version 2).
    pub fn connect_with(
        addr: SocketAddr,
        token: &[u8],
        timeout: Duration,
        version: u32,
        caps: u32,
    ) -> Result<Connection, ProtocolError> {
        match Self::attempt(addr, token, timeout, version, caps)? {
            Ok(c) => Ok(c),
            Err((theirs, refusal)) => {
                if theirs < version && protocol::speaks(theirs) {
                    let caps = if theirs >= 2 { caps } else { 0 };
                    if let Ok(c) = Self::attempt(addr, token, timeout, theirs, caps)? {
                        return Ok(c);
                    }
                }
                Err(refusal)
            }
        }
    }

    /// One handshake: the connection, or (on a version mismatch) the program's version and
    /// its refusal.
    #[allow(clippy::type_complexity)]
    fn attempt(
        addr: SocketAddr,
        token: &[u8],
        timeout: Duration,
        version: u32,
        caps: u32,
    ) -> Result<Result<Connection, (u32, ProtocolError)>, ProtocolError> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let mut w = &stream;
        protocol::write_request_with(&mut w, version, token, caps)?;
        let reply = protocol::read_raw_reply(&mut &stream)?;
        let theirs = reply.version;
        let mismatch = reply.status == Status::VersionMismatch;
        let welcome = match reply.into_welcome(version, caps) {
            Ok(w) => w,
            Err(e) if mismatch => return Ok(Err((theirs, e))),
            Err(e) => return Err(e),
        };
        stream.set_read_timeout(None)?;
        let writer = stream.try_clone()?;
        let mut reader = FrameReader::new(stream);
        reader.accept_raw_frames(welcome.caps & CAP_RAW_FRAMES != 0);
        Ok(Ok(Connection {
            reader,
            writer,
            hello: welcome.hello,
            version: welcome.version,
            caps: welcome.caps,
        }))
    }

    /// The protocol version of the conversation.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The capabilities the program granted ([`protocol`](crate::protocol)).
    pub fn caps(&self) -> u32 {
        self.caps
    }

    /// What the program said about itself.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// Limits how long [`next_frame`](Self::next_frame) waits (`None`: forever); a wait that
    /// runs out is an `Io` error of kind `WouldBlock` or `TimedOut`, after which the
    /// connection is unusable if it happened inside a frame.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.reader.get_ref().set_read_timeout(t)
    }

    /// The next frame (validated lengths and block; records unchecked: see
    /// [`RecordScanner`](crate::frame::RecordScanner)). `Ok(None)`: the program closed.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, FrameError> {
        self.reader.next_frame()
    }

    /// Asks the program to end the trace: it sends what it has, its final stats and an end
    /// frame, then closes.
    pub fn request_stop(&self) -> io::Result<()> {
        (&self.writer).write_all(&[CMD_STOP])
    }

    /// Splits the connection for a reader thread and a controlling one: the frame reader, a
    /// handle to send [`CMD_STOP`] (and to shut the socket down), and the hello.
    pub fn split(self) -> (FrameReader<TcpStream>, TcpStream, Hello) {
        (self.reader, self.writer, self.hello)
    }

    /// Closes both directions now.
    pub fn shutdown(&self) {
        let _ = self.writer.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{FrameEncoder, KIND_RAW};
    use crate::protocol::MAGIC;
    use std::io::Read;
    use std::net::TcpListener;

    /// A program as version 1 wrote it: it speaks version 1 only and sends LZ4 frames.
    fn version_1_program(listener: TcpListener) -> std::thread::JoinHandle<Vec<u32>> {
        std::thread::spawn(move || {
            let mut asked = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = listener.accept().unwrap();
                let mut head = [0u8; 12];
                s.read_exact(&mut head).unwrap();
                let version = u32::from_le_bytes(head[8..12].try_into().unwrap());
                asked.push(version);
                let reply = |s: &mut TcpStream, status: u8, body: &[u8]| {
                    let mut b = MAGIC.to_vec();
                    b.extend_from_slice(&1u32.to_le_bytes());
                    b.push(status);
                    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
                    b.extend_from_slice(body);
                    s.write_all(&b).unwrap();
                };
                if version != 1 {
                    let m = format!("protocol version mismatch: the program speaks version 1, the capture version {version}");
                    reply(&mut s, 1, m.as_bytes());
                    continue;
                }
                let mut len = [0u8; 2];
                s.read_exact(&mut len).unwrap();
                let mut token = vec![0u8; u16::from_le_bytes(len) as usize];
                s.read_exact(&mut token).unwrap();
                let hello = Hello {
                    program: "old".into(),
                    pid: 1,
                    host: "h".into(),
                    start_unix_ns: 0,
                    clock: "c".into(),
                    on_demand: false,
                };
                reply(&mut s, 0, &hello.encode());
                s.write_all(FrameEncoder::new().data(&[0x0a, 0x02, 0x40, 0x01]))
                    .unwrap();
                s.write_all(&FrameEncoder::end()).unwrap();
                break;
            }
            asked
        })
    }

    #[test]
    fn a_capture_falls_back_to_an_older_program_s_version() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let program = version_1_program(listener);
        let mut c = Connection::connect(addr, b"", Duration::from_secs(5)).unwrap();
        assert_eq!((c.version(), c.caps()), (1, 0));
        assert_eq!(c.hello().program, "old");
        match c.next_frame().unwrap() {
            Some(Frame::Data { raw, .. }) => assert_eq!(raw, [0x0a, 0x02, 0x40, 0x01]),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.next_frame().unwrap(), Some(Frame::End));
        // It asked for its newest version first, then the program's.
        assert_eq!(program.join().unwrap(), [PROTOCOL_VERSION, 1]);
    }

    #[test]
    fn raw_frames_the_capture_did_not_get_are_refused() {
        // A program that welcomes a version 2 capture without granting raw frames, then
        // sends one anyway.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let program = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let req = protocol::read_request(&mut s).unwrap();
            assert_eq!(req.caps, CAP_RAW_FRAMES);
            let hello = Hello {
                program: "p".into(),
                pid: 1,
                host: "h".into(),
                start_unix_ns: 0,
                clock: "c".into(),
                on_demand: false,
            };
            protocol::write_welcome(&mut s, req.version, &hello, 0).unwrap();
            let (head, body) = FrameEncoder::raw_frames(&[0x0a, 0x00]).next().unwrap();
            s.write_all(&head).unwrap();
            s.write_all(body).unwrap();
        });
        let mut c = Connection::connect(addr, b"", Duration::from_secs(5)).unwrap();
        assert_eq!((c.version(), c.caps()), (PROTOCOL_VERSION, 0));
        assert!(matches!(
            c.next_frame(),
            Err(FrameError::NotNegotiated(KIND_RAW))
        ));
        program.join().unwrap();
    }
}
