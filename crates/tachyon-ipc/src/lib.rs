//! Tachyon's inter-process plumbing for system mode: how producers and consumers talk to the
//! `tachyon traced` daemon.
//!
//! - [`frame`]: a 4-byte little-endian length, then an `IPCFrame` (Perfetto's wire protocol),
//!   every length bounded by [`frame::MAX_FRAME_SIZE`].
//! - [`conn`]: framed Unix stream sockets with a descriptor passed alongside a frame
//!   (`SCM_RIGHTS`) and the peer's kernel-checked credentials (`SO_PEERCRED`).
//! - [`rpc`]: Perfetto's service binding and method invocation over those frames, with the
//!   `ProducerPort` and `ConsumerPort` method tables; the request and response messages are the
//!   ones of `tachyon-protos` (`perfetto/ipc/*.proto`).
//! - [`commit`]: `CommitDataRequest` encoding (split to fit frames) and untrusted decoding.
//! - [`shm`]: the per-producer shared memory buffer, a sealed memfd mapped by both sides.
//! - [`paths`]: where the sockets live, and the environment variables that move them.
//!
//! ```
//! use tachyon_ipc::rpc::{Frame, Msg};
//!
//! let body = Frame { request_id: 1, msg: Msg::BindService { service_name: "ProducerPort" } }
//!     .encode();
//! let framed = tachyon_ipc::frame::frame(&body).unwrap();
//! assert_eq!(u32::from_le_bytes(framed[..4].try_into().unwrap()) as usize, body.len());
//! assert_eq!(Frame::decode(&body).unwrap().msg, Msg::BindService { service_name: "ProducerPort" });
//! ```

pub mod commit;
pub mod conn;
pub mod frame;
pub mod paths;
pub mod rpc;
pub mod shm;
