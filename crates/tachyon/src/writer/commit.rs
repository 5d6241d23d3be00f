//! Where commits go: the [`CommitSink`] trait, and a channel-based sink for the in-process
//! service.
//!
//! A writer commits every time it hands a chunk back (the chunk is already Complete in the shared
//! memory buffer when the request is sent) and whenever patches for chunks already handed back
//! become ready. Requests from one writer are sent in the order the writer made them, so the
//! service always sees a chunk's move before its patches.

use std::fmt;
use std::sync::mpsc;
use std::time::Duration;

use tachyon_abi::CommitRequest;

/// Receives the commits of every writer of an arbiter (Perfetto's `CommitData` IPC).
///
/// `commit` is called on the instrumented threads, right after a chunk was completed: it must not
/// block and should not take locks. In-process, [`ChannelCommitSink`] hands the request to the
/// service thread; in system mode an implementation serializes it into a `CommitDataRequest` on
/// the producer socket.
pub trait CommitSink: Send + Sync + 'static {
    /// Hands one request to the service. Requests that cannot be delivered (the service is gone)
    /// are dropped: the chunks they name stay Complete in the buffer and are never reused.
    fn commit(&self, request: CommitRequest);
}

/// Creates a channel-backed sink and the receiver the service thread reads from.
///
/// The channel is `std::sync::mpsc`, unbounded: `send` is lock-free (a linked list of blocks of
/// slots), never blocks, and allocates one block every 31 requests. It is unbounded in principle
/// but bounded in practice: a request names at most one chunk, and a writer cannot complete a
/// chunk until the service freed one, so at most `chunks in the buffer` requests with moves can
/// be in flight, plus one patch-only request per packet that crossed a chunk boundary.
///
/// ```
/// let (sink, receiver) = tachyon::backend::commit_channel();
/// # let _ = (sink, receiver);
/// ```
pub fn commit_channel() -> (ChannelCommitSink, CommitReceiver) {
    let (tx, rx) = mpsc::channel();
    (ChannelCommitSink { tx }, CommitReceiver { rx })
}

/// The sending half of [`commit_channel`]: give it to [`crate::backend::SmbArbiter::new`].
#[derive(Clone)]
pub struct ChannelCommitSink {
    tx: mpsc::Sender<CommitRequest>,
}

impl fmt::Debug for ChannelCommitSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelCommitSink").finish_non_exhaustive()
    }
}

impl CommitSink for ChannelCommitSink {
    fn commit(&self, request: CommitRequest) {
        // An error means the receiver is gone: the session is over, nobody reads the buffer.
        let _ = self.tx.send(request);
    }
}

/// The receiving half of [`commit_channel`], read by the service thread. It ends (`recv`
/// returns `None`) once the arbiter and every writer holding the sink are dropped.
pub struct CommitReceiver {
    rx: mpsc::Receiver<CommitRequest>,
}

impl fmt::Debug for CommitReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommitReceiver").finish_non_exhaustive()
    }
}

impl CommitReceiver {
    /// Waits for the next request; `None` once every sender is gone and the queue is empty.
    pub fn recv(&self) -> Option<CommitRequest> {
        self.rx.recv().ok()
    }

    /// The next request if one is queued (`Ok(None)`: none now). `Err(Disconnected)` once the
    /// queue is empty and every sender is gone: a polling service loop ends there.
    ///
    /// Polling (with a short sleep when empty) is cheaper for the writers than blocking in
    /// [`recv`](Self::recv): a commit sent to a receiver blocked in `recv` wakes it with a
    /// futex call on the writing thread, about once per chunk.
    pub fn try_recv(&self) -> Result<Option<CommitRequest>, Disconnected> {
        match self.rx.try_recv() {
            Ok(request) => Ok(Some(request)),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => Err(Disconnected),
        }
    }

    /// Waits up to `timeout` for the next request.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<CommitRequest> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Every request queued now, without waiting.
    pub fn try_iter(&self) -> impl Iterator<Item = CommitRequest> + '_ {
        self.rx.try_iter()
    }
}

/// Every sender of a commit channel is gone (the arbiter and its writers were dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disconnected;

impl fmt::Display for Disconnected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the commit channel is disconnected")
    }
}

impl std::error::Error for Disconnected {}
