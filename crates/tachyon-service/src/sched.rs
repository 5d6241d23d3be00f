//! The service thread's scheduling policy: `SCHED_BATCH` on Linux.
//!
//! The in-process service thread wakes for every commit batch and flush period; under the
//! normal policy the scheduler may run it at once on the core of the traced thread that woke
//! it, stopping that thread mid-loop. Under `SCHED_BATCH` it keeps the same share of the CPU (a
//! loaded machine does not starve it, so the shared memory buffer drains as before) but its
//! wake-ups never preempt a running thread: it runs on a free core, or at the running thread's
//! next tick.
#![allow(unsafe_code)]

/// Puts the calling thread under `SCHED_BATCH`, unless `TACHYON_HELPER_SCHED=normal`; whether
/// the thread runs as a batch thread now (never outside Linux).
pub(crate) fn run_as_batch() -> bool {
    if std::env::var_os("TACHYON_HELPER_SCHED").is_some_and(|v| v == "normal") {
        return false;
    }
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler` reads `param` (a live, initialised struct) and changes
        // only the calling thread's policy (pid 0: this thread); no memory is handed over.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0 }
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    /// The policy is the calling thread's alone: a thread that asks for it runs as a batch
    /// thread, the thread that spawned it keeps its own.
    #[test]
    #[cfg(target_os = "linux")]
    #[cfg_attr(miri, ignore = "sched_setscheduler is not modelled")]
    fn batch_policy_is_per_thread() {
        fn policy() -> String {
            // Field 41 of /proc/thread-self/stat (after the parenthesised name: index 38).
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .unwrap()
                .1
                .split_whitespace()
                .collect();
            fields[38].to_owned()
        }
        let before = policy();
        let child = std::thread::spawn(|| (super::run_as_batch(), policy()))
            .join()
            .unwrap();
        assert_eq!(child, (true, libc::SCHED_BATCH.to_string()));
        assert_eq!(
            policy(),
            before,
            "the spawning thread's policy is unchanged"
        );
    }
}
