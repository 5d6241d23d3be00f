//! The producer port: what a producer connection may ask, and the commands it is sent.
//!
//! Nothing a producer says about itself is trusted: its identity is the kernel's
//! (`SO_PEERCRED`), its buffer is created here, every name and count is bounded, and a request
//! that does not decode, a method invoked before binding, or a second `InitializeConnection`
//! or `GetAsyncCommand` closes the connection ([`Service::violation`]). Requests that are
//! well-formed but refused (a duplicate or overlong data source name, too many data sources)
//! get an error reply and are counted.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use protozero::HeapBuffered;
use tachyon_abi::{PageSize, ServiceView};
use tachyon_ipc::commit::decode_commit;
use tachyon_ipc::conn::{FrameSender, PeerCredentials};
use tachyon_ipc::rpc::{bind_reply, method_reply, producer_port, Frame, Msg};
use tachyon_ipc::shm::SharedMemory;
use tachyon_protos::{
    initialize_connection_request::ProducerSMBScrapingMode, InitializeConnectionRequestView,
    NotifyDataSourceStoppedRequestView, RegisterDataSourceRequestView, RegisterDataSourceResponse,
    RegisterTraceWriterRequestView, UnregisterDataSourceRequestView,
    UnregisterTraceWriterRequestView,
};
use tachyon_service::ProducerIdentity;

use super::{ConnId, ConnShared, Service, Who};
use crate::config::limits;
use crate::wire;

/// The service id of `ProducerPort` on the producer socket.
const SERVICE_ID: u32 = 1;

/// A registered data source.
#[derive(Clone, Debug)]
pub(super) struct Descriptor {
    pub(super) name: String,
    pub(super) will_notify_on_stop: bool,
    pub(super) handles_incremental_state_clear: bool,
}

/// A command for the producer's `GetAsyncCommand` stream.
#[derive(Debug)]
pub(super) enum Command {
    /// `setup_tracing`, sent with the SMB's descriptor.
    SetupTracing,
    /// An encoded `GetAsyncCommandResponse`.
    Encoded(Vec<u8>),
}

/// One producer connection.
#[derive(Debug)]
pub(super) struct Producer {
    tx: FrameSender,
    pub(super) shared: Arc<ConnShared>,
    pub(super) identity: ProducerIdentity,
    bound: bool,
    /// Set by `InitializeConnection`: the SMB's size and page size.
    smb_spec: Option<(usize, PageSize)>,
    /// `InitializeConnection.producer_name` (bounded), matched by `producer_name_filter`.
    pub(super) name: String,
    /// Created when the first data source instance starts.
    smb: Option<SharedMemory>,
    setup_sent: bool,
    /// Scrape the SMB on flush, stop and disconnect (unless the producer opted out).
    pub(super) scraping: bool,
    pub(super) data_sources: Vec<Descriptor>,
    /// Writer id → global target buffer, from `RegisterTraceWriter` (for scraping writers that
    /// never committed). At most one entry per writer id (32767).
    pub(super) writer_buffers: HashMap<u16, u16>,
    /// Its SMB may hold chunks of more than one session: it was a member of two sessions at
    /// once, or it joined a session while its SMB still held chunks (left by an earlier
    /// session, say one freed before the producer committed them). A writer that never
    /// committed and was never registered cannot be attributed to a session any more, so it
    /// is not scraped.
    pub(super) ambiguous_writers: bool,
    /// The `GetAsyncCommand` request the commands answer.
    command_stream: Option<u64>,
    /// Commands waiting for the stream to open.
    queued: VecDeque<Command>,
}

impl Producer {
    pub(super) fn new(tx: FrameSender, creds: PeerCredentials, shared: Arc<ConnShared>) -> Self {
        Producer {
            tx,
            shared,
            identity: ProducerIdentity {
                pid: creds.pid,
                uid: creds.uid as i32,
            },
            bound: false,
            smb_spec: None,
            name: String::new(),
            smb: None,
            setup_sent: false,
            scraping: true,
            data_sources: Vec::new(),
            writer_buffers: HashMap::new(),
            ambiguous_writers: false,
            command_stream: None,
            queued: VecDeque::new(),
        }
    }

    /// Closes the socket and stops the reader.
    pub(super) fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.tx.shutdown();
    }

    /// The service's view of the SMB, once it exists.
    pub(super) fn service_view(&self) -> Option<ServiceView<'_>> {
        let (_, page) = self.smb_spec?;
        self.smb.as_ref()?.service_view(page).ok()
    }

    /// Whether its SMB holds a chunk a writer took (being written, or complete and not yet
    /// read): what a scrape would copy.
    pub(super) fn smb_holds_chunks(&self) -> bool {
        let Some(view) = self.service_view() else {
            return false;
        };
        (0..view.num_pages()).any(|page| {
            view.page_layout(page).is_ok_and(|layout| {
                (0..layout.num_chunks())
                    .any(|chunk| !matches!(view.scrape_chunk(page, chunk), Ok(None)))
            })
        })
    }

    pub(super) fn descriptor(&self, name: &str) -> Option<&Descriptor> {
        self.data_sources.iter().find(|d| d.name == name)
    }

    /// Creates the SMB if needed (queueing `setup_tracing` once). False when the producer has
    /// not initialized or the buffer cannot be created.
    pub(super) fn ensure_smb(&mut self) -> Result<(), ()> {
        let Some((size, _)) = self.smb_spec else {
            return Err(());
        };
        if self.smb.is_none() {
            self.smb = Some(SharedMemory::create("tachyon-smb", size).map_err(|_| ())?);
        }
        if !self.setup_sent {
            self.setup_sent = true;
            self.queued.push_back(Command::SetupTracing);
        }
        Ok(())
    }
}

/// What a method call comes to.
enum Outcome {
    /// Reply with this response.
    Reply(Vec<u8>),
    /// Reply, `success = false`.
    Fail,
    /// No reply now (the command stream).
    Deferred,
    /// Close the connection.
    Violation,
}

fn empty() -> Outcome {
    Outcome::Reply(Vec::new())
}

impl Service {
    pub(super) fn on_producer_frame(&mut self, conn: ConnId, body: &[u8]) {
        let Ok(frame) = Frame::decode(body) else {
            self.stats.frames_rejected += 1;
            self.violation(conn);
            return;
        };
        let request_id = frame.request_id;
        match frame.msg {
            Msg::BindService { service_name } => {
                let reply = bind_reply(
                    request_id,
                    service_name,
                    &[(producer_port::NAME, SERVICE_ID, producer_port::METHODS)],
                );
                let p = self
                    .producers
                    .get_mut(&conn)
                    .expect("handled for a known producer");
                p.bound |= service_name == producer_port::NAME;
                if let Err(e) = p.tx.send(&reply, None) {
                    self.send_failed(conn, &e);
                }
            }
            Msg::InvokeMethod {
                service_id,
                method_id,
                args,
                drop_reply,
            } => {
                let bound = self.producers[&conn].bound;
                if !bound || service_id != SERVICE_ID {
                    self.violation(conn);
                    return;
                }
                let outcome = self.invoke(conn, request_id, method_id, args);
                let reply = match outcome {
                    Outcome::Violation => {
                        self.violation(conn);
                        return;
                    }
                    Outcome::Deferred => None,
                    Outcome::Reply(r) => Some(method_reply(request_id, true, false, &r)),
                    Outcome::Fail => Some(method_reply(request_id, false, false, &[])),
                };
                if let (Some(reply), false) = (reply, drop_reply) {
                    self.send_to_producer(conn, &reply);
                }
                // A registration starts instances only now, after its reply.
                if method_id == producer_port::REGISTER_DATA_SOURCE {
                    self.start_pending_instances(conn);
                }
            }
            // Replies and errors only travel from the daemon to its clients.
            _ => {
                self.stats.frames_rejected += 1;
                self.violation(conn);
            }
        }
    }

    fn invoke(&mut self, conn: ConnId, request_id: u64, method_id: u32, args: &[u8]) -> Outcome {
        use producer_port::*;
        match method_id {
            INITIALIZE_CONNECTION => self.initialize_connection(conn, args),
            REGISTER_DATA_SOURCE => self.register_data_source(conn, args),
            UNREGISTER_DATA_SOURCE => self.unregister_data_source(conn, args),
            COMMIT_DATA => {
                let Ok(decoded) = decode_commit(args) else {
                    return Outcome::Violation;
                };
                self.stats.invalid_commit_entries += decoded.invalid_entries;
                self.apply_commit(Who::Conn(conn), &decoded.request);
                if let Some(id) = decoded.request.flush_request_id {
                    self.on_flush_ack(Who::Conn(conn), id);
                }
                empty()
            }
            GET_ASYNC_COMMAND => {
                let p = self.producers.get_mut(&conn).expect("known producer");
                if p.command_stream.is_some() {
                    return Outcome::Violation;
                }
                p.command_stream = Some(request_id);
                self.flush_commands(conn);
                Outcome::Deferred
            }
            NOTIFY_DATA_SOURCE_STOPPED => {
                let Ok(v) = NotifyDataSourceStoppedRequestView::decode(args) else {
                    return Outcome::Violation;
                };
                self.on_instance_stopped(Who::Conn(conn), v.data_source_id());
                empty()
            }
            REGISTER_TRACE_WRITER => {
                let Ok(v) = RegisterTraceWriterRequestView::decode(args) else {
                    return Outcome::Violation;
                };
                let (writer, target) = (v.trace_writer_id(), v.target_buffer());
                if writer == 0 || writer > tachyon_abi::MAX_WRITER_ID as u32 || target > 0xffff {
                    self.stats.requests_refused += 1;
                    return Outcome::Fail;
                }
                let p = self.producers.get_mut(&conn).expect("known producer");
                p.writer_buffers.insert(writer as u16, target as u16);
                empty()
            }
            UNREGISTER_TRACE_WRITER => {
                let Ok(v) = UnregisterTraceWriterRequestView::decode(args) else {
                    return Outcome::Violation;
                };
                let p = self.producers.get_mut(&conn).expect("known producer");
                if let Ok(writer) = u16::try_from(v.trace_writer_id()) {
                    p.writer_buffers.remove(&writer);
                }
                empty()
            }
            // Nothing to do.
            NOTIFY_DATA_SOURCE_STARTED | SYNC => empty(),
            _ => Outcome::Fail,
        }
    }

    fn initialize_connection(&mut self, conn: ConnId, args: &[u8]) -> Outcome {
        let p = self.producers.get_mut(&conn).expect("known producer");
        if p.smb_spec.is_some() {
            return Outcome::Violation;
        }
        let Ok(v) = InitializeConnectionRequestView::decode(args) else {
            return Outcome::Violation;
        };
        let page = PageSize::from_bytes(v.shared_memory_page_size_hint_bytes() as usize)
            .unwrap_or(PageSize::Kib4);
        let size = match v.shared_memory_size_hint_bytes() as usize {
            0 => limits::DEFAULT_SMB_SIZE,
            hint => hint.clamp(limits::MIN_SMB_SIZE, limits::MAX_SMB_SIZE),
        };
        let size = size.div_ceil(page.bytes()) * page.bytes();
        p.smb_spec = Some((size, page));
        let name = v.producer_name_bytes();
        if name.len() > limits::MAX_NAME_LEN {
            return Outcome::Violation;
        }
        p.name = String::from_utf8_lossy(name).into_owned();
        p.scraping = v.smb_scraping_mode() != Some(ProducerSMBScrapingMode::SmbScrapingDisabled);
        empty()
    }

    fn register_data_source(&mut self, conn: ConnId, args: &[u8]) -> Outcome {
        let Ok(v) = RegisterDataSourceRequestView::decode(args) else {
            return Outcome::Violation;
        };
        let Ok(d) = v.data_source_descriptor() else {
            return Outcome::Violation;
        };
        let Ok(name) = d.name() else {
            return Outcome::Violation;
        };
        let p = self.producers.get_mut(&conn).expect("known producer");
        let error = if p.smb_spec.is_none() {
            Some("InitializeConnection must come first".to_owned())
        } else if name.is_empty() || name.len() > limits::MAX_NAME_LEN {
            Some(format!(
                "a data source name must have 1..={} bytes",
                limits::MAX_NAME_LEN
            ))
        } else if p.data_sources.len() >= limits::MAX_DATA_SOURCES_PER_PRODUCER {
            Some(format!(
                "at most {} data sources per producer",
                limits::MAX_DATA_SOURCES_PER_PRODUCER
            ))
        } else if p.descriptor(name).is_some() {
            Some(format!("data source {name:?} is already registered"))
        } else {
            None
        };
        if let Some(error) = error {
            self.stats.requests_refused += 1;
            let mut buf = HeapBuffered::new();
            buf.root::<RegisterDataSourceResponse<'_>>()
                .set_error(&error);
            return Outcome::Reply(buf.serialize().expect("heap buffers do not fail"));
        }
        p.data_sources.push(Descriptor {
            name: name.to_owned(),
            will_notify_on_stop: d.will_notify_on_stop(),
            handles_incremental_state_clear: d.handles_incremental_state_clear(),
        });
        self.stats.data_sources_registered += 1;
        self.data_sources_seen += 1;
        empty()
    }

    fn unregister_data_source(&mut self, conn: ConnId, args: &[u8]) -> Outcome {
        let Ok(v) = UnregisterDataSourceRequestView::decode(args) else {
            return Outcome::Violation;
        };
        let Ok(name) = v.data_source_name() else {
            return Outcome::Violation;
        };
        let p = self.producers.get_mut(&conn).expect("known producer");
        let before = p.data_sources.len();
        p.data_sources.retain(|d| d.name != name);
        if p.data_sources.len() < before {
            self.stats.data_sources_registered -= 1;
            let name = name.to_owned();
            self.stop_instances_named(conn, &name);
        }
        empty()
    }

    /// Sends (or queues, before `GetAsyncCommand`) a command.
    pub(super) fn send_command(&mut self, conn: ConnId, command: Command) {
        let Some(p) = self.producers.get_mut(&conn) else {
            return;
        };
        if p.queued.len() >= limits::MAX_QUEUED_COMMANDS {
            // A producer that never opens its command stream while sessions come and go.
            self.violation(conn);
            return;
        }
        p.queued.push_back(command);
        self.flush_commands(conn);
    }

    /// Sends the queued commands if the command stream is open.
    pub(super) fn flush_commands(&mut self, conn: ConnId) {
        let Some(p) = self.producers.get_mut(&conn) else {
            return;
        };
        let Some(stream) = p.command_stream else {
            return;
        };
        while let Some(command) = p.queued.pop_front() {
            let sent = match command {
                Command::SetupTracing => {
                    let (_, page) = p.smb_spec.expect("the SMB exists before setup_tracing");
                    let smb = p.smb.as_ref().expect("the SMB exists before setup_tracing");
                    let body = wire::setup_tracing(page.bytes() as u32 / 1024);
                    p.tx.send(&method_reply(stream, true, true, &body), Some(smb.fd()))
                }
                Command::Encoded(body) => p.tx.send(&method_reply(stream, true, true, &body), None),
            };
            if let Err(e) = sent {
                self.send_failed(conn, &e);
                return;
            }
        }
    }

    fn send_to_producer(&mut self, conn: ConnId, frame: &[u8]) {
        // Whoever reads the counters after this reply sees what led to it.
        self.publish();
        let Some(p) = self.producers.get(&conn) else {
            return;
        };
        if let Err(e) = p.tx.send(frame, None) {
            self.send_failed(conn, &e);
        }
    }
}
