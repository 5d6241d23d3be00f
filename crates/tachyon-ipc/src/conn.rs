//! A framed connection over a Unix stream socket, with file descriptors passed alongside frames
//! (`SCM_RIGHTS`) and the peer's credentials (`SO_PEERCRED`).
//!
//! A descriptor belongs to the frame it was sent with: the sender sends the frame and the
//! descriptor in one `sendmsg`, so the kernel attaches the descriptor to the frame's first
//! socket buffer. A `recvmsg` may return bytes queued *before* that buffer together with it, but
//! it always stops right after the first buffer that carries descriptors (or inside it, when it
//! does not fit). So the last byte of the read that brings a descriptor lies inside the frame
//! it belongs to. Descriptors no frame claims are closed. At most [`MAX_FDS_PER_READ`] may arrive at once; more (or a
//! truncated control message) is a protocol violation.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::frame::{FrameBuffer, HEADER_SIZE, MAX_FRAME_SIZE};

/// Descriptors accepted in one read.
pub const MAX_FDS_PER_READ: usize = 2;
/// Descriptors waiting for their frame.
const MAX_PENDING_FDS: usize = 4;
/// Bytes asked for per read.
const READ_SIZE: usize = 64 * 1024;

/// Who is at the other end of a socket, as the kernel says (not as the peer claims).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// The kernel's view of the peer of `socket`.
pub fn peer_credentials(socket: &UnixStream) -> io::Result<PeerCredentials> {
    let cred = rustix::net::sockopt::socket_peercred(socket)?;
    Ok(PeerCredentials {
        pid: rustix::process::Pid::as_raw(Some(cred.pid)),
        uid: cred.uid.as_raw(),
        gid: cred.gid.as_raw(),
    })
}

/// One frame received, with the descriptor that came with it.
#[derive(Debug)]
pub struct Received {
    /// The frame body (an encoded `IPCFrame`).
    pub body: Vec<u8>,
    /// A descriptor sent with the frame.
    pub fd: Option<OwnedFd>,
}

/// The sending half: cheap to clone, one frame at a time (a frame is never interleaved with
/// another thread's).
#[derive(Clone, Debug)]
pub struct FrameSender {
    stream: Arc<UnixStream>,
    lock: Arc<Mutex<()>>,
}

impl FrameSender {
    /// Sends one frame (length prefix added here), with `fd` if given. Blocks until written or
    /// until the socket's write timeout ([`UnixStream::set_write_timeout`]) expires, which is
    /// reported as [`io::ErrorKind::TimedOut`] and leaves the stream unusable (a frame may be
    /// half written). Never raises `SIGPIPE`.
    pub fn send(&self, body: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        if body.is_empty() || body.len() > MAX_FRAME_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("IPC frame of {} bytes is out of bounds", body.len()),
            ));
        }
        // The length prefix and the body go out as two iovecs: no copy of the body per frame.
        let header = (body.len() as u32).to_le_bytes();
        let total = HEADER_SIZE + body.len();
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut sent = 0;
        let fds;
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if let Some(fd) = fd {
            fds = [fd];
            control.push(SendAncillaryMessage::ScmRights(&fds));
        }
        while sent < total {
            let rest = [
                IoSlice::new(&header[sent.min(HEADER_SIZE)..]),
                IoSlice::new(&body[sent.saturating_sub(HEADER_SIZE)..]),
            ];
            let iov = if sent < HEADER_SIZE {
                &rest[..]
            } else {
                &rest[1..]
            };
            match rustix::net::sendmsg(&*self.stream, iov, &mut control, SendFlags::NOSIGNAL) {
                Ok(n) => {
                    sent += n;
                    // The descriptor went with the first bytes.
                    control.clear();
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "IPC peer did not read in time",
                    ))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Shuts both directions down, waking a thread blocked reading the other half.
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// The socket.
    pub fn socket(&self) -> &UnixStream {
        &self.stream
    }
}

/// The receiving half: one reader at a time.
#[derive(Debug)]
pub struct FrameReceiver {
    stream: Arc<UnixStream>,
    frames: FrameBuffer,
    /// Descriptors with the stream offset of the last byte of the read they came with.
    fds: VecDeque<(u64, OwnedFd)>,
    /// Stream offset of the end of the bytes read so far.
    received: u64,
    read_buf: Vec<u8>,
}

impl FrameReceiver {
    /// The next frame. `Ok(None)` at a clean end of stream (between frames). Errors: I/O, a
    /// length prefix out of bounds, too many descriptors, or an end of stream inside a frame
    /// ([`io::ErrorKind::InvalidData`] / [`io::ErrorKind::UnexpectedEof`]); after an error the
    /// connection must be dropped.
    pub fn recv(&mut self) -> io::Result<Option<Received>> {
        loop {
            let start = self.frames.consumed();
            match self.frames.next_frame() {
                Ok(Some(body)) => {
                    let body = body.to_vec();
                    let end = self.frames.consumed();
                    return Ok(Some(Received {
                        body,
                        fd: self.take_fd(start, end),
                    }));
                }
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            if !self.read_more()? {
                return if self.frames.pending() == 0 {
                    Ok(None)
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "IPC stream ended inside a frame",
                    ))
                };
            }
        }
    }

    /// The socket (shared with the sending half).
    pub fn socket(&self) -> &UnixStream {
        &self.stream
    }

    /// The descriptor that arrived with the frame at `start..end`; earlier strays close.
    fn take_fd(&mut self, start: u64, end: u64) -> Option<OwnedFd> {
        while let Some((off, _)) = self.fds.front() {
            if *off < start {
                self.fds.pop_front();
            } else {
                break;
            }
        }
        match self.fds.front() {
            Some((off, _)) if *off < end => self.fds.pop_front().map(|(_, fd)| fd),
            _ => None,
        }
    }

    /// One `recvmsg`. `false` at end of stream.
    fn read_more(&mut self) -> io::Result<bool> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_READ))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let n = loop {
            let mut iov = [IoSliceMut::new(&mut self.read_buf)];
            match rustix::net::recvmsg(
                &*self.stream,
                &mut iov,
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(r) => {
                    if r.flags.contains(ReturnFlags::CTRUNC) {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "IPC peer sent too many file descriptors",
                        ));
                    }
                    break r.bytes;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        };
        let at = (self.received + n as u64).saturating_sub(1);
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                for fd in fds {
                    if self.fds.len() >= MAX_PENDING_FDS {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "IPC peer sent too many file descriptors",
                        ));
                    }
                    self.fds.push_back((at, fd));
                }
            }
        }
        if n == 0 {
            return Ok(false);
        }
        self.received += n as u64;
        self.frames.extend(&self.read_buf[..n]);
        Ok(true)
    }
}

/// Splits a connected stream into its halves.
pub fn split(stream: UnixStream) -> (FrameSender, FrameReceiver) {
    let stream = Arc::new(stream);
    (
        FrameSender {
            stream: stream.clone(),
            lock: Arc::new(Mutex::new(())),
        },
        FrameReceiver {
            stream,
            frames: FrameBuffer::new(),
            fds: VecDeque::new(),
            received: 0,
            read_buf: vec![0; READ_SIZE],
        },
    )
}

/// Connects to `path` with a bounded write timeout.
pub fn connect(path: &std::path::Path, write_timeout: Duration) -> io::Result<UnixStream> {
    let stream = UnixStream::connect(path)?;
    stream.set_write_timeout(Some(write_timeout))?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    #[test]
    fn frames_and_descriptors_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let (tx, _rx_a) = split(a);
        let (_tx_b, mut rx) = split(b);
        let mut file = tempfile_with(b"payload");
        tx.send(b"first", None).unwrap();
        tx.send(b"second", Some(file.as_fd())).unwrap();
        tx.send(&vec![9u8; 100_000], None).unwrap();
        let r1 = rx.recv().unwrap().unwrap();
        assert_eq!(r1.body, b"first");
        assert!(r1.fd.is_none());
        let r2 = rx.recv().unwrap().unwrap();
        assert_eq!(r2.body, b"second");
        let mut got = std::fs::File::from(r2.fd.expect("fd travels with its frame"));
        let mut s = String::new();
        got.rewind().unwrap();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "payload");
        let r3 = rx.recv().unwrap().unwrap();
        assert_eq!(r3.body.len(), 100_000);
        assert!(r3.fd.is_none());
        drop(tx);
        drop(_rx_a);
        assert!(rx.recv().unwrap().is_none(), "clean end of stream");
        file.flush().unwrap();
    }

    #[test]
    fn descriptors_land_on_their_frames_under_load() {
        let (a, b) = UnixStream::pair().unwrap();
        let (tx, _rx_a) = split(a);
        let (_tx_b, mut rx) = split(b);
        let file = tempfile_with(b"x");
        let sender = std::thread::spawn(move || {
            for i in 0..300u32 {
                let body = vec![i as u8; 1 + (i as usize * 977) % 90_000];
                let fd = (i % 7 == 3).then(|| file.as_fd());
                tx.send(&body, fd).unwrap();
            }
        });
        for i in 0..300u32 {
            // Read slowly at times so that several frames queue up before a read.
            if i % 50 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            let r = rx.recv().unwrap().unwrap();
            assert_eq!(r.body.len(), 1 + (i as usize * 977) % 90_000, "frame {i}");
            assert_eq!(r.fd.is_some(), i % 7 == 3, "frame {i}");
        }
        sender.join().unwrap();
    }

    #[test]
    fn garbage_lengths_and_truncation_are_errors() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (_tx, mut rx) = split(b);
        a.write_all(&u32::MAX.to_le_bytes()).unwrap();
        let e = rx.recv().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);

        let (mut a, b) = UnixStream::pair().unwrap();
        let (_tx, mut rx) = split(b);
        a.write_all(&10u32.to_le_bytes()).unwrap();
        a.write_all(b"abc").unwrap();
        drop(a);
        let e = rx.recv().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn peer_credentials_are_ours() {
        let (a, _b) = UnixStream::pair().unwrap();
        let c = peer_credentials(&a).unwrap();
        assert_eq!(c.pid, std::process::id() as i32);
    }

    #[test]
    fn writing_to_a_closed_peer_is_an_error_not_a_signal() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let (tx, _rx) = split(a);
        assert!(tx.send(b"x", None).is_err());
    }

    fn tempfile_with(bytes: &[u8]) -> std::fs::File {
        let fd = rustix::fs::memfd_create("test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut f = std::fs::File::from(fd);
        f.write_all(bytes).unwrap();
        f
    }
}
