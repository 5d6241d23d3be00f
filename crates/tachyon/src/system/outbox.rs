//! Everything this process sends to the daemon after the handshake, in order: commits made on
//! the traced threads, flush acknowledgements and `NotifyDataSourceStopped` from the command
//! thread. One sender thread (`tachyon-commit`) writes them to the socket.
//!
//! A traced thread that completes a chunk pays one uncontended mutex lock and a `Vec` push
//! ([`DaemonCommitSink`]): no syscall, except a futex wake for the first commit after the sender
//! went idle. The sender takes the whole queue at once and sends it as one `CommitData` (split
//! over frames by `tachyon_ipc::commit::encode_commit` when large): under load, what the threads
//! commit while one batch is on its way makes the next batch, so batches grow with the rate
//! without a fixed wait. (A wait before each batch would hold every chunk of the burst in the
//! SMB that long: at 200 MB/s a 256 KiB SMB fills in about 1.3 ms, so even 1 ms made producers
//! stall or drop.)
//!
//! Order is kept: items leave in the order they were queued, and merging consecutive commits
//! puts all their moves before all their patches, which only moves a chunk earlier than a patch
//! that followed it (a patch always follows its chunk's move). A flush acknowledgement closes
//! the merged commit it travels in, so everything queued before the flush request was answered
//! reaches the daemon first.

use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use protozero::HeapBuffered;
use tachyon_abi::CommitRequest;
use tachyon_ipc::commit::send_commit;
use tachyon_ipc::rpc::Caller;

use crate::writer::CommitSink;

/// Something to send to the daemon.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// A writer's commit.
    Commit(CommitRequest),
    /// The acknowledgement of the daemon's flush `request_id` (a `CommitData` carrying it).
    FlushAck(u64),
    /// A producer-port method with its encoded request (no reply wanted).
    Call { method: &'static str, args: Vec<u8> },
}

#[derive(Debug, Default)]
struct Queue {
    items: Vec<Outgoing>,
    /// The sender waits on the condition variable: the next push wakes it.
    sender_waiting: bool,
    /// The session is shutting down: send what is queued, then stop.
    closing: bool,
    /// Nothing is sent any more (the daemon is gone or the sender stopped): pushes are dropped.
    dead: bool,
    /// Commit requests dropped because nothing could be sent any more.
    commits_dropped: u64,
}

/// The queue between the threads that have something to send and the sender thread.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Outbox {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `item` (dropped, and counted if a commit, once nothing can be sent).
    pub(crate) fn push(&self, item: Outgoing) {
        let mut q = self.lock();
        if q.dead {
            if matches!(item, Outgoing::Commit(_)) {
                q.commits_dropped += 1;
            }
            return;
        }
        q.items.push(item);
        if q.sender_waiting {
            q.sender_waiting = false;
            drop(q);
            self.wake.notify_one();
        }
    }

    /// Asks the sender to send what is queued and stop.
    pub(crate) fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_one();
    }

    /// Drops what is queued and everything pushed from now on (the daemon is gone).
    pub(crate) fn kill(&self) {
        let mut q = self.lock();
        q.dead = true;
        let dropped = q
            .items
            .drain(..)
            .filter(|i| matches!(i, Outgoing::Commit(_)))
            .count();
        q.commits_dropped += dropped as u64;
        drop(q);
        self.wake.notify_one();
    }

    /// Commit requests dropped so far.
    pub(crate) fn commits_dropped(&self) -> u64 {
        self.lock().commits_dropped
    }

    /// Waits for the next batch (what is queued when the sender is free) and swaps it into
    /// `batch` (empty on entry). `false` when the sender should stop.
    fn next_batch(&self, batch: &mut Vec<Outgoing>) -> bool {
        let mut q = self.lock();
        loop {
            if q.dead {
                return false;
            }
            if !q.items.is_empty() {
                break;
            }
            if q.closing {
                q.dead = true;
                return false;
            }
            q.sender_waiting = true;
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        std::mem::swap(&mut q.items, batch);
        true
    }
}

/// The arbiter's commit sink in system mode: queues the request for the sender thread.
#[derive(Debug)]
pub(crate) struct DaemonCommitSink(pub(crate) Arc<Outbox>);

impl CommitSink for DaemonCommitSink {
    fn commit(&self, request: CommitRequest) {
        self.0.push(Outgoing::Commit(request));
    }
}

/// The sender thread: sends batches until the outbox closes or a send fails; then
/// `on_error` is told why (the daemon is gone) and everything later is dropped.
pub(crate) fn run_sender(outbox: &Outbox, caller: &Caller, on_error: impl FnOnce(&io::Error)) {
    // Swapped with the queue's vector each time: both keep their capacity, so pushes on the
    // traced threads do not allocate once the batches reached their usual size.
    let mut batch = Vec::new();
    while outbox.next_batch(&mut batch) {
        if let Err(e) = send_batch(caller, &mut batch) {
            outbox.kill();
            on_error(&e);
            return;
        }
    }
    // Stopped or dead: later pushes are dropped (`next_batch` set `dead`).
}

/// Sends a batch in order, merging consecutive commits. Leaves `batch` empty.
fn send_batch(caller: &Caller, batch: &mut Vec<Outgoing>) -> io::Result<()> {
    let mut merged = CommitRequest::default();
    for item in batch.drain(..) {
        match item {
            Outgoing::Commit(mut r) => {
                merged.chunks_to_move.append(&mut r.chunks_to_move);
                merged.chunks_to_patch.append(&mut r.chunks_to_patch);
            }
            Outgoing::FlushAck(id) => {
                merged.flush_request_id = Some(id);
                send_commit(caller, &merged)?;
                merged = CommitRequest::default();
            }
            Outgoing::Call { method, args } => {
                if !merged.is_empty() {
                    send_commit(caller, &merged)?;
                    merged = CommitRequest::default();
                }
                caller.invoke(method, &args, None, true)?;
            }
        }
    }
    if !merged.is_empty() {
        send_commit(caller, &merged)?;
    }
    Ok(())
}

/// `NotifyDataSourceStoppedRequest{data_source_id}`.
pub(crate) fn notify_stopped(data_source_id: u64) -> Outgoing {
    let mut buf = HeapBuffered::new();
    {
        let mut r: tachyon_protos::NotifyDataSourceStoppedRequest<'_> = buf.root();
        r.set_data_source_id(data_source_id);
    }
    Outgoing::Call {
        method: "NotifyDataSourceStopped",
        args: buf.serialize().unwrap_or_default(),
    }
}
