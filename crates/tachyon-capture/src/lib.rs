//! Tachyon's live capture protocol: a program that traces with Tachyon listens on a TCP port
//! (`TACHYON_LISTEN`), and `tachyon capture` connects, shakes hands and receives the program's
//! Perfetto trace as it is recorded, in LZ4-compressed frames.
//!
//! - [`protocol`]: the handshake (magic, version negotiation, optional token, the program's
//!   [`Hello`](protocol::Hello), refusals such as "busy").
//! - [`frame`]: length-prefixed LZ4 frames, the validating [`FrameReader`](frame::FrameReader)
//!   and [`RecordScanner`](frame::RecordScanner) a capture runs over untrusted bytes.
//! - [`client`]: the capture side of a connection.
//! - [`registry`]: local discovery: each listening program registers itself (pid, name, port,
//!   version) in a private per-user directory.
//! - [`announce`]: discovery across machines, opt-in: UDP announcements of the same facts.
//!
//! The crate is linked by instrumented programs: it depends only on `lz4_flex` and `protozero`.
//!
//! ```
//! use tachyon_capture::frame::{validate_records, Frame, FrameEncoder, FrameReader};
//!
//! // One Trace.packet record holding a packet with timestamp 5.
//! let records = [0x0a, 0x02, 0x40, 0x05];
//! let mut encoder = FrameEncoder::new();
//! let wire = encoder.data(&records).to_vec();
//! let mut reader = FrameReader::new(&wire[..]);
//! let Some(Frame::Data { raw, .. }) = reader.next_frame()? else { panic!() };
//! assert_eq!(validate_records(raw)?.records, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod announce;
pub mod client;
pub mod frame;
pub mod protocol;
pub mod registry;
