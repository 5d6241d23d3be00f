//! Perfetto's IPC layer: `IPCFrame`s carrying service binding, method invocations and replies.
//!
//! A client binds a service by name ([`Msg::BindService`]); the host replies with the service id
//! and its method table, and the client invokes methods by id with the request proto-encoded in
//! `args`. Replies carry the same `request_id`; a streaming method (`GetAsyncCommand`,
//! `ReadBuffers`) replies many times with `has_more` set on all but the last.
//!
//! Every field of a decoded frame comes from an untrusted peer: [`Frame::decode`] returns
//! borrowed slices, checks the one-of shape (exactly one message kind), and bounds the method
//! table. Anything else is a [`ProtocolError`]; the caller closes the connection.

use std::collections::HashMap;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protozero::HeapBuffered;
use tachyon_protos::{IPCFrame, IPCFrameView};

use crate::conn::{self, FrameReceiver, FrameSender, Received};

/// Methods a service may list.
pub const MAX_METHODS: usize = 64;

/// The producer service and its methods, with the ids this host assigns (clients look them up
/// by name, as Perfetto's do; the host dispatches on the constants).
pub mod producer_port {
    /// Service name.
    pub const NAME: &str = "ProducerPort";
    /// Method id of `InitializeConnection`.
    pub const INITIALIZE_CONNECTION: u32 = 1;
    /// Method id of `RegisterDataSource`.
    pub const REGISTER_DATA_SOURCE: u32 = 2;
    /// Method id of `UnregisterDataSource`.
    pub const UNREGISTER_DATA_SOURCE: u32 = 3;
    /// Method id of `CommitData`.
    pub const COMMIT_DATA: u32 = 4;
    /// Method id of `GetAsyncCommand`.
    pub const GET_ASYNC_COMMAND: u32 = 5;
    /// Method id of `RegisterTraceWriter`.
    pub const REGISTER_TRACE_WRITER: u32 = 6;
    /// Method id of `UnregisterTraceWriter`.
    pub const UNREGISTER_TRACE_WRITER: u32 = 7;
    /// Method id of `NotifyDataSourceStarted`.
    pub const NOTIFY_DATA_SOURCE_STARTED: u32 = 8;
    /// Method id of `NotifyDataSourceStopped`.
    pub const NOTIFY_DATA_SOURCE_STOPPED: u32 = 9;
    /// Method id of `Sync`.
    pub const SYNC: u32 = 10;
    /// `(id, name)` of every method.
    pub const METHODS: &[(u32, &str)] = &[
        (INITIALIZE_CONNECTION, "InitializeConnection"),
        (REGISTER_DATA_SOURCE, "RegisterDataSource"),
        (UNREGISTER_DATA_SOURCE, "UnregisterDataSource"),
        (COMMIT_DATA, "CommitData"),
        (GET_ASYNC_COMMAND, "GetAsyncCommand"),
        (REGISTER_TRACE_WRITER, "RegisterTraceWriter"),
        (UNREGISTER_TRACE_WRITER, "UnregisterTraceWriter"),
        (NOTIFY_DATA_SOURCE_STARTED, "NotifyDataSourceStarted"),
        (NOTIFY_DATA_SOURCE_STOPPED, "NotifyDataSourceStopped"),
        (SYNC, "Sync"),
    ];
}

/// The consumer service and its methods.
pub mod consumer_port {
    /// Service name.
    pub const NAME: &str = "ConsumerPort";
    /// Method id of `EnableTracing`.
    pub const ENABLE_TRACING: u32 = 1;
    /// Method id of `DisableTracing`.
    pub const DISABLE_TRACING: u32 = 2;
    /// Method id of `ReadBuffers`.
    pub const READ_BUFFERS: u32 = 3;
    /// Method id of `FreeBuffers`.
    pub const FREE_BUFFERS: u32 = 4;
    /// Method id of `Flush`.
    pub const FLUSH: u32 = 5;
    /// Method id of `GetTraceStats`.
    pub const GET_TRACE_STATS: u32 = 6;
    /// `(id, name)` of every method.
    pub const METHODS: &[(u32, &str)] = &[
        (ENABLE_TRACING, "EnableTracing"),
        (DISABLE_TRACING, "DisableTracing"),
        (READ_BUFFERS, "ReadBuffers"),
        (FREE_BUFFERS, "FreeBuffers"),
        (FLUSH, "Flush"),
        (GET_TRACE_STATS, "GetTraceStats"),
    ];
}

/// A frame that breaks the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IPC protocol error: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

impl From<ProtocolError> for io::Error {
    fn from(e: ProtocolError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

fn bad(what: impl Into<String>) -> ProtocolError {
    ProtocolError(what.into())
}

/// The one message of a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg<'a> {
    /// Client → host.
    BindService {
        /// The service asked for.
        service_name: &'a str,
    },
    /// Host → client.
    BindServiceReply {
        /// Whether the service exists.
        success: bool,
        /// Its id, for [`Msg::InvokeMethod`].
        service_id: u32,
        /// `(id, name)` of its methods.
        methods: Vec<(u32, &'a str)>,
    },
    /// Client → host.
    InvokeMethod {
        /// From the bind reply.
        service_id: u32,
        /// From the bind reply.
        method_id: u32,
        /// The encoded request.
        args: &'a [u8],
        /// The client wants no reply.
        drop_reply: bool,
    },
    /// Host → client.
    InvokeMethodReply {
        /// Whether the method succeeded.
        success: bool,
        /// More replies follow (streaming methods).
        has_more: bool,
        /// The encoded response.
        reply: &'a [u8],
    },
    /// Host → client: the request could not be served.
    RequestError {
        /// Why.
        error: &'a str,
    },
}

/// One `IPCFrame`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Matches a reply to its request.
    pub request_id: u64,
    /// The message.
    pub msg: Msg<'a>,
}

impl<'a> Frame<'a> {
    /// Encodes the frame body (without the length prefix).
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = HeapBuffered::new();
        {
            let mut f: IPCFrame<'_> = buf.root();
            f.set_request_id(self.request_id);
            match &self.msg {
                Msg::BindService { service_name } => {
                    f.set_msg_bind_service().set_service_name(service_name);
                }
                Msg::BindServiceReply {
                    success,
                    service_id,
                    methods,
                } => {
                    let mut r = f.set_msg_bind_service_reply();
                    r.set_success(*success);
                    r.set_service_id(*service_id);
                    for (id, name) in methods {
                        let mut m = r.add_methods();
                        m.set_id(*id);
                        m.set_name(name);
                    }
                }
                Msg::InvokeMethod {
                    service_id,
                    method_id,
                    args,
                    drop_reply,
                } => {
                    let mut m = f.set_msg_invoke_method();
                    m.set_service_id(*service_id);
                    m.set_method_id(*method_id);
                    m.set_args_proto(args);
                    if *drop_reply {
                        m.set_drop_reply(true);
                    }
                }
                Msg::InvokeMethodReply {
                    success,
                    has_more,
                    reply,
                } => {
                    let mut r = f.set_msg_invoke_method_reply();
                    r.set_success(*success);
                    if *has_more {
                        r.set_has_more(true);
                    }
                    r.set_reply_proto(reply);
                }
                Msg::RequestError { error } => {
                    f.set_msg_request_error().set_error(error);
                }
            }
        }
        buf.serialize().expect("heap buffers do not fail")
    }

    /// Decodes a frame body from an untrusted peer.
    pub fn decode(body: &'a [u8]) -> Result<Frame<'a>, ProtocolError> {
        let v = IPCFrameView::decode(body).map_err(|e| bad(format!("malformed frame: {e}")))?;
        let kinds = [
            v.has_msg_bind_service(),
            v.has_msg_bind_service_reply(),
            v.has_msg_invoke_method(),
            v.has_msg_invoke_method_reply(),
            v.has_msg_request_error(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(bad("a frame must carry exactly one message"));
        }
        let m = |e: protozero::DecodeError| bad(format!("malformed frame: {e}"));
        let msg = if v.has_msg_bind_service() {
            let b = v.msg_bind_service().map_err(m)?;
            Msg::BindService {
                service_name: b.service_name().map_err(m)?,
            }
        } else if v.has_msg_bind_service_reply() {
            let r = v.msg_bind_service_reply().map_err(m)?;
            let mut methods = Vec::new();
            for method in r.methods() {
                let method = method.map_err(m)?;
                if methods.len() == MAX_METHODS {
                    return Err(bad("too many methods in a bind reply"));
                }
                methods.push((method.id(), method.name().map_err(m)?));
            }
            Msg::BindServiceReply {
                success: r.success(),
                service_id: r.service_id(),
                methods,
            }
        } else if v.has_msg_invoke_method() {
            let i = v.msg_invoke_method().map_err(m)?;
            Msg::InvokeMethod {
                service_id: i.service_id(),
                method_id: i.method_id(),
                args: i.args_proto(),
                drop_reply: i.drop_reply(),
            }
        } else if v.has_msg_invoke_method_reply() {
            let r = v.msg_invoke_method_reply().map_err(m)?;
            Msg::InvokeMethodReply {
                success: r.success(),
                has_more: r.has_more(),
                reply: r.reply_proto(),
            }
        } else {
            let e = v.msg_request_error().map_err(m)?;
            Msg::RequestError {
                error: e.error().map_err(m)?,
            }
        };
        Ok(Frame {
            request_id: v.request_id(),
            msg,
        })
    }
}

/// Bytes of an `InvokeMethod` frame around its `args`: keep `args` within
/// `MAX_FRAME_SIZE - INVOKE_OVERHEAD`.
pub const INVOKE_OVERHEAD: usize = 64;

/// The calling side of a bound service; clone it to call from several threads.
#[derive(Clone, Debug)]
pub struct Caller {
    tx: FrameSender,
    service_id: u32,
    methods: Arc<HashMap<String, u32>>,
    next_request: Arc<AtomicU64>,
}

/// A reply received by a client.
#[derive(Debug)]
pub struct Reply {
    /// The request it answers.
    pub request_id: u64,
    /// `false` for a failed method or a [`Msg::RequestError`].
    pub success: bool,
    /// More replies to this request follow.
    pub has_more: bool,
    /// The encoded response (or the error text for a request error).
    pub payload: Vec<u8>,
    /// A descriptor sent with the reply (the SMB with `SetupTracing`).
    pub fd: Option<std::os::fd::OwnedFd>,
}

/// The receiving side of a client.
#[derive(Debug)]
pub struct Replies {
    rx: FrameReceiver,
}

impl Replies {
    /// Bounds how long [`recv`](Self::recv) waits (`None`: no limit). A wait that runs out is an
    /// [`io::ErrorKind::WouldBlock`] error that leaves a partly received frame buffered: the
    /// next `recv` resumes it.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.rx.socket().set_read_timeout(timeout)
    }

    /// The next reply; `Ok(None)` when the host closed the connection.
    pub fn recv(&mut self) -> io::Result<Option<Reply>> {
        let Some(Received { body, fd }) = self.rx.recv()? else {
            return Ok(None);
        };
        let frame = Frame::decode(&body)?;
        let (success, has_more, payload) = match frame.msg {
            Msg::InvokeMethodReply {
                success,
                has_more,
                reply,
            } => (success, has_more, reply.to_vec()),
            Msg::RequestError { error } => (false, false, error.as_bytes().to_vec()),
            _ => return Err(bad("unexpected message from the host").into()),
        };
        Ok(Some(Reply {
            request_id: frame.request_id,
            success,
            has_more,
            payload,
            fd,
        }))
    }
}

impl Caller {
    /// Sends a request; returns its id. `drop_reply` asks the host not to answer.
    pub fn invoke(
        &self,
        method: &str,
        args: &[u8],
        fd: Option<BorrowedFd<'_>>,
        drop_reply: bool,
    ) -> io::Result<u64> {
        let &method_id = self.methods.get(method).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the service has no method {method}"),
            )
        })?;
        let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let body = Frame {
            request_id,
            msg: Msg::InvokeMethod {
                service_id: self.service_id,
                method_id,
                args,
                drop_reply,
            },
        }
        .encode();
        self.tx.send(&body, fd)?;
        Ok(request_id)
    }

    /// Shuts the connection down (wakes the reader with an end of stream).
    pub fn shutdown(&self) {
        self.tx.shutdown();
    }
}

/// Connects to the socket at `path` and binds `service`; every write gives up after
/// `write_timeout`, and the bind reply must come within `reply_timeout`.
pub fn connect(
    path: &Path,
    service: &str,
    write_timeout: Duration,
    reply_timeout: Duration,
) -> io::Result<(Caller, Replies)> {
    let stream = conn::connect(path, write_timeout)?;
    stream.set_read_timeout(Some(reply_timeout))?;
    let (tx, mut rx) = conn::split(stream);
    let body = Frame {
        request_id: 0,
        msg: Msg::BindService {
            service_name: service,
        },
    }
    .encode();
    tx.send(&body, None)?;
    let reply = rx.recv()?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the host closed the connection",
        )
    })?;
    let frame = Frame::decode(&reply.body)?;
    let Msg::BindServiceReply {
        success: true,
        service_id,
        methods,
    } = frame.msg
    else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("the host does not offer {service}"),
        ));
    };
    let methods = methods
        .into_iter()
        .map(|(id, name)| (name.to_owned(), id))
        .collect();
    tx.socket().set_read_timeout(None)?;
    Ok((
        Caller {
            tx,
            service_id,
            methods: Arc::new(methods),
            next_request: Arc::new(AtomicU64::new(1)),
        },
        Replies { rx },
    ))
}

/// A service a host offers: its name, its id, and its `(method id, name)` table.
pub type ServiceTable<'a> = (&'a str, u32, &'a [(u32, &'a str)]);

/// Host side: the reply to a bind request for one of `services`.
pub fn bind_reply(request_id: u64, service_name: &str, services: &[ServiceTable<'_>]) -> Vec<u8> {
    let found = services.iter().find(|(n, _, _)| *n == service_name);
    Frame {
        request_id,
        msg: match found {
            Some((_, id, methods)) => Msg::BindServiceReply {
                success: true,
                service_id: *id,
                methods: methods.to_vec(),
            },
            None => Msg::BindServiceReply {
                success: false,
                service_id: 0,
                methods: Vec::new(),
            },
        },
    }
    .encode()
}

/// Host side: a method's reply.
pub fn method_reply(request_id: u64, success: bool, has_more: bool, reply: &[u8]) -> Vec<u8> {
    Frame {
        request_id,
        msg: Msg::InvokeMethodReply {
            success,
            has_more,
            reply,
        },
    }
    .encode()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_message_round_trips() {
        let frames = [
            Frame {
                request_id: 0,
                msg: Msg::BindService {
                    service_name: "ProducerPort",
                },
            },
            Frame {
                request_id: 0,
                msg: Msg::BindServiceReply {
                    success: true,
                    service_id: 1,
                    methods: producer_port::METHODS.to_vec(),
                },
            },
            Frame {
                request_id: 7,
                msg: Msg::InvokeMethod {
                    service_id: 1,
                    method_id: 4,
                    args: &[1, 2, 3],
                    drop_reply: true,
                },
            },
            Frame {
                request_id: 7,
                msg: Msg::InvokeMethodReply {
                    success: true,
                    has_more: true,
                    reply: &[9; 100],
                },
            },
            Frame {
                request_id: 8,
                msg: Msg::RequestError { error: "nope" },
            },
        ];
        for f in &frames {
            let bytes = f.encode();
            assert_eq!(&Frame::decode(&bytes).unwrap(), f);
        }
    }

    #[test]
    fn frames_without_exactly_one_message_are_refused() {
        // request_id only.
        assert!(Frame::decode(&[0x10, 0x01]).is_err());
        // Two messages.
        let mut two = Frame {
            request_id: 1,
            msg: Msg::BindService { service_name: "a" },
        }
        .encode();
        two.extend(
            Frame {
                request_id: 1,
                msg: Msg::RequestError { error: "b" },
            }
            .encode(),
        );
        assert!(Frame::decode(&two).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Frame::decode(&bytes);
        }
    }
}
