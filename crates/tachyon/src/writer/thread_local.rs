//! One writer per thread: [`SmbArbiter::with_thread_writer`].
//!
//! Each thread keeps its writers in a thread-local list keyed by (arbiter, target buffer). The
//! first call on a thread creates the writer (allocates; a writer id is taken); later calls find
//! it with a short scan of a list that usually holds one entry. When the thread exits, Rust runs
//! the thread-local destructor, which drops the writers: each flushes its last chunk and releases
//! its id, so a thread that never calls `flush` loses nothing. Writers of an arbiter that was
//! [closed](SmbArbiter::close) are dropped (and flush) the next time their thread asks for one.
//!
//! Caveat: Rust does not promise to run thread-local destructors of the *main* thread when the
//! process exits (on most platforms it does not). The session that owns the arbiter must flush
//! the main thread's writers before it stops (a `with_thread_writer(…, |w| w.flush())` on that
//! thread, or [`SmbArbiter::request_flush`] and one more packet).

use std::cell::RefCell;
use std::sync::Arc;

use crate::writer::arbiter::SmbArbiter;
use crate::writer::trace_writer::TraceWriter;

struct Entry {
    arbiter_id: u64,
    target_buffer: u16,
    writer: TraceWriter,
}

thread_local! {
    static WRITERS: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

impl SmbArbiter {
    /// Runs `f` with this thread's writer for `target_buffer`, creating it on first use.
    ///
    /// `None` (and `f` is not called) when the arbiter is closed, all writer ids are taken, the
    /// thread is exiting (its thread-locals are gone), or when called from inside `f` on the
    /// same thread (e.g. tracing from an allocator hook while a packet is being written): a
    /// writer is never re-entered.
    ///
    /// The writer flushes when the thread exits: the thread-local destructor drops it, so a
    /// thread that never calls `flush` loses nothing. Writers of an arbiter that was
    /// [closed](SmbArbiter::close) are dropped (and flush) the next time their thread asks for
    /// one. Caveat: Rust does not promise to run thread-local destructors of the *main* thread
    /// when the process exits; the session must flush the main thread's writers before it stops
    /// ([`drop_thread_writers`](SmbArbiter::drop_thread_writers) on that thread, or
    /// [`request_flush`](SmbArbiter::request_flush) and one more packet).
    #[inline]
    pub fn with_thread_writer<R>(
        self: &Arc<Self>,
        target_buffer: u16,
        f: impl FnOnce(&mut TraceWriter) -> R,
    ) -> Option<R> {
        if self.is_closed() {
            self.drop_thread_writers();
            return None;
        }
        WRITERS
            .try_with(|cell| {
                let mut writers = cell.try_borrow_mut().ok()?;
                let id = self.id();
                let found = writers
                    .iter()
                    .position(|e| e.arbiter_id == id && e.target_buffer == target_buffer);
                let index = match found {
                    Some(i) if !writers[i].writer.is_broken() => i,
                    _ => self.add_thread_writer(&mut writers, found, target_buffer)?,
                };
                Some(f(&mut writers[index].writer))
            })
            .ok()
            .flatten()
    }

    /// Creates this thread's writer (replacing a broken one at `replace`), and drops writers of
    /// closed arbiters on the way.
    #[cold]
    fn add_thread_writer(
        self: &Arc<Self>,
        writers: &mut Vec<Entry>,
        replace: Option<usize>,
        target_buffer: u16,
    ) -> Option<usize> {
        if let Some(i) = replace {
            // Broken: drop it (it flushes) and start a new sequence.
            writers.swap_remove(i);
        }
        writers.retain(|e| !e.writer.arbiter().is_closed());
        let writer = self.create_trace_writer(target_buffer).ok()?;
        writers.push(Entry {
            arbiter_id: self.id(),
            target_buffer,
            writer,
        });
        Some(writers.len() - 1)
    }

    /// Drops (so flushes) this thread's writers of this arbiter. A session does this on its own
    /// thread before it stops, since the main thread's writers are never dropped otherwise.
    pub fn drop_thread_writers(&self) {
        let id = self.id();
        let _ = WRITERS.try_with(|cell| {
            if let Ok(mut writers) = cell.try_borrow_mut() {
                // Take them out first: dropping a writer must not happen under the borrow (its
                // flush could, in principle, re-enter).
                let mut mine = Vec::new();
                let mut i = 0;
                while i < writers.len() {
                    if writers[i].arbiter_id == id {
                        mine.push(writers.swap_remove(i));
                    } else {
                        i += 1;
                    }
                }
                drop(writers);
                drop(mine);
            }
        });
    }
}
