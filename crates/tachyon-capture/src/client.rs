//! The capture side of a connection: connect, shake hands, read frames, ask the program to stop.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::frame::{Frame, FrameError, FrameReader};
use crate::protocol::{self, Hello, ProtocolError, CMD_STOP, PROTOCOL_VERSION};

/// How long the handshake may take once connected.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A capture connected to a program.
#[derive(Debug)]
pub struct Connection {
    reader: FrameReader<TcpStream>,
    writer: TcpStream,
    hello: Hello,
}

impl Connection {
    /// Connects to `addr` (waiting at most `timeout` for the TCP connection), sends our version
    /// and `token`, and reads the program's answer. A refusal is
    /// [`ProtocolError::Refused`] with the program's message.
    pub fn connect(
        addr: SocketAddr,
        token: &[u8],
        timeout: Duration,
    ) -> Result<Connection, ProtocolError> {
        Self::connect_with_version(addr, token, timeout, PROTOCOL_VERSION)
    }

    /// [`connect`](Self::connect) claiming another protocol version (for tests of the
    /// program's refusal).
    pub fn connect_with_version(
        addr: SocketAddr,
        token: &[u8],
        timeout: Duration,
        version: u32,
    ) -> Result<Connection, ProtocolError> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let mut w = &stream;
        protocol::write_request(&mut w, version, token)?;
        let hello = protocol::read_reply(&mut &stream)?;
        stream.set_read_timeout(None)?;
        let writer = stream.try_clone()?;
        Ok(Connection {
            reader: FrameReader::new(stream),
            writer,
            hello,
        })
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
