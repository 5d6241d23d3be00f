//! The Linux half of the crash handler: the signal handler (async-signal-safe code only), the
//! alternate signal stacks, the panic hook and the `tachyon-crash` helper thread. See the
//! parent module for the design.

use std::ffi::c_void;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use libc::{c_int, siginfo_t};

use super::{
    disabled_by_env, module_offset, signal_code_name, signal_name, trim_backtrace,
    write_crash_event, Arg, CrashEvent, PanicRecord, CRASH_BUDGET,
};
use crate::clock::Clock;
use crate::track_event::global::{session_of, EPOCH};

/// The signals handled, in the order of [`PREVIOUS`].
const SIGNALS: [c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
];

/// The action each signal had before ours (leaked, never freed): what the handler forwards
/// to and restores. Null until installed.
static PREVIOUS: [AtomicPtr<libc::sigaction>; 5] = [
    AtomicPtr::new(ptr::null_mut()),
    AtomicPtr::new(ptr::null_mut()),
    AtomicPtr::new(ptr::null_mut()),
    AtomicPtr::new(ptr::null_mut()),
    AtomicPtr::new(ptr::null_mut()),
];

/// A session the handler saves is running.
static ARMED: AtomicU32 = AtomicU32::new(0);
/// The thread handling the crash (0: no crash).
pub(super) static CRASHER: AtomicI64 = AtomicI64::new(0);
/// The helper thread's id, so its own crash or panic is not waited for by itself.
static HELPER_TID: AtomicI64 = AtomicI64::new(0);
/// The process that installed the handler: a child forked from it has no helper thread,
/// so its handler only forwards.
static INSTALL_PID: AtomicI32 = AtomicI32::new(0);
/// The write end of the helper's wake-up pipe (-1: no helper).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The trace clock, copied at installation: the handler reads the counter through it.
static CLOCK: OnceLock<Clock> = OnceLock::new();

// The crash record: written by the crashing thread's handler before `FATAL_REQUESTED`
// (release), read by the helper after it (acquire).
static REC_SIGNAL: AtomicI32 = AtomicI32::new(0);
static REC_CODE: AtomicI32 = AtomicI32::new(0);
static REC_ADDR: AtomicU64 = AtomicU64::new(0);
static REC_PC: AtomicU64 = AtomicU64::new(0);
static REC_SP: AtomicU64 = AtomicU64::new(0);
static REC_TICKS: AtomicU64 = AtomicU64::new(0);
static REC_EPOCH: AtomicU64 = AtomicU64::new(0);
static REC_SENDER: AtomicI32 = AtomicI32::new(0);
static FATAL_REQUESTED: AtomicU32 = AtomicU32::new(0);
/// Futex word: 1 once the helper has saved the trace (or given up).
static FATAL_DONE: AtomicU32 = AtomicU32::new(0);

/// Panics for the helper to write, and the count asked for / written (futex word).
static PANICS: Mutex<Vec<PanicRecord>> = Mutex::new(Vec::new());
static PANIC_ASKED: AtomicU32 = AtomicU32::new(0);
static PANIC_DONE: AtomicU32 = AtomicU32::new(0);
/// The last panic: its thread and message, the cause of an abort that follows on that
/// thread (`panic = "abort"`).
static LAST_PANIC: Mutex<Option<(i64, String)>> = Mutex::new(None);
/// A panic was recorded while the current session ran: write the trace at exit.
static PANICKED: AtomicU32 = AtomicU32::new(0);

/// How long a crashing or panicking thread waits for the helper (ns).
static WAIT_NS: AtomicU64 = AtomicU64::new(0);

fn wait_deadline() -> u64 {
    monotonic_ns().saturating_add(WAIT_NS.load(Ordering::Relaxed))
}

/// The handler (installed once) and the session it saves from now on, whose stop waits up
/// to `stop_timeout` for writers.
pub(crate) fn arm(stop_timeout: std::time::Duration) {
    if disabled_by_env() {
        return;
    }
    let wait = stop_timeout.saturating_add(CRASH_BUDGET);
    WAIT_NS.store(
        u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    static INSTALL: Once = Once::new();
    INSTALL.call_once(install);
    if WAKE_FD.load(Ordering::Acquire) >= 0 {
        PANICKED.store(0, Ordering::Relaxed);
        ARMED.store(1, Ordering::Release);
    }
}

/// The session ended (or is being saved): forward to the previous handlers again.
pub(crate) fn disarm() {
    ARMED.store(0, Ordering::Release);
}

fn install() {
    let _ = CLOCK.set(*crate::clock::clock());
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` is a writable array of two ints, as pipe2 requires.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    // SAFETY: `fds[0]` was just opened by pipe2 and is owned by nothing else.
    let reader = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    let spawned = std::thread::Builder::new()
        .name("tachyon-crash".into())
        .spawn(move || helper(reader));
    if spawned.is_err() {
        // SAFETY: `fds[1]` is ours and unused.
        unsafe { libc::close(fds[1]) };
        return;
    }
    // A full pipe already holds a wake-up: writing into it must not block a crashing thread.
    // SAFETY: F_GETFL/F_SETFL on a descriptor this function owns.
    unsafe {
        let flags = libc::fcntl(fds[1], libc::F_GETFL);
        libc::fcntl(fds[1], libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    // SAFETY: getpid has no preconditions.
    INSTALL_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    WAKE_FD.store(fds[1], Ordering::Release);
    ensure_altstack();
    for (i, &sig) in SIGNALS.iter().enumerate() {
        // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask, no flags).
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a null new action only reads the current one into `old`.
        if unsafe { libc::sigaction(sig, ptr::null(), &mut old) } != 0 {
            continue;
        }
        PREVIOUS[i].store(Box::into_raw(Box::new(old)), Ordering::Release);
        // SAFETY: as above.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_signal as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `new.sa_mask` is a valid sigset_t to initialize; `new` is a complete
        // action whose handler is an `extern "C"` function of the SA_SIGINFO signature.
        unsafe {
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(sig, &new, ptr::null_mut());
        }
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        on_panic(info);
        previous(info);
    }));
    extern "C" {
        fn atexit(cb: extern "C" fn()) -> c_int;
    }
    // SAFETY: `at_exit_after_panic` is a plain `extern "C" fn` for the program's lifetime
    // that never unwinds (it catches panics).
    unsafe { atexit(at_exit_after_panic) };
}

// === Alternate signal stacks ===

/// Bytes of an alternate signal stack of ours (the handler needs little; a guard page
/// below it).
const ALTSTACK_SIZE: usize = 64 << 10;

/// This thread's alternate stack, if ours: disabled and unmapped when the thread exits.
struct AltStack {
    base: *mut c_void,
    len: usize,
}

impl Drop for AltStack {
    fn drop(&mut self) {
        // SAFETY: an all-zero stack_t is a valid value to fill.
        let mut cur: libc::stack_t = unsafe { std::mem::zeroed() };
        // SAFETY: reads the current alternate stack into `cur`.
        unsafe { libc::sigaltstack(ptr::null(), &mut cur) };
        let ours = cur.ss_sp as usize == self.base as usize + page_size();
        if ours && cur.ss_flags & libc::SS_ONSTACK == 0 {
            let off = libc::stack_t {
                ss_sp: ptr::null_mut(),
                ss_flags: libc::SS_DISABLE,
                ss_size: 0,
            };
            // SAFETY: disables this thread's alternate stack (not in use: SS_ONSTACK is
            // clear), after which nothing refers to the mapping and it can be unmapped.
            unsafe {
                libc::sigaltstack(&off, ptr::null_mut());
                libc::munmap(self.base, self.len);
            }
        }
    }
}

thread_local! {
    static ALTSTACK: std::cell::RefCell<Option<AltStack>> = const { std::cell::RefCell::new(None) };
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// A thread's first event: gives it an alternate signal stack if it has none (std's
/// threads have one; others, such as threads made by C code, do not) while the handler is
/// installed.
pub(crate) fn thread_started() {
    if WAKE_FD.load(Ordering::Relaxed) >= 0 {
        ensure_altstack();
    }
}

fn ensure_altstack() {
    // SAFETY: an all-zero stack_t is a valid value to fill.
    let mut cur: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: reads the current alternate stack into `cur`.
    if unsafe { libc::sigaltstack(ptr::null(), &mut cur) } != 0
        || cur.ss_flags & libc::SS_DISABLE == 0
    {
        return;
    }
    let page = page_size();
    let len = ALTSTACK_SIZE + page;
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing.
    let base = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return;
    }
    // SAFETY: the lowest page of the mapping just made becomes the guard page; `stack`
    // describes the rest of it, which lives until `AltStack::drop` disables it.
    let ok = unsafe {
        libc::mprotect(base, page, libc::PROT_NONE);
        let stack = libc::stack_t {
            ss_sp: base.cast::<u8>().add(page).cast(),
            ss_flags: 0,
            ss_size: ALTSTACK_SIZE,
        };
        libc::sigaltstack(&stack, ptr::null_mut()) == 0
    };
    if !ok {
        // SAFETY: the mapping is not in use.
        unsafe { libc::munmap(base, len) };
        return;
    }
    let kept = ALTSTACK.try_with(|a| *a.borrow_mut() = Some(AltStack { base, len }));
    if kept.is_err() {
        // The thread is exiting: leave the stack installed (unmapping it under the kernel's
        // feet would be worse than leaking 68 KiB once).
    }
}

// === The signal handler (async-signal-safe code only) ===

fn gettid() -> i64 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i64 }
}

fn monotonic_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid to fill.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime is async-signal-safe and writes `t`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Waits until `word` is no longer `value`, or until `deadline` (monotonic ns) passes: the
/// futex with a timeout, re-checked (a wake-up can be spurious). Async-signal-safe.
fn wait_while(word: &AtomicU32, value: u32, deadline: u64) -> bool {
    loop {
        if word.load(Ordering::Acquire) != value {
            return true;
        }
        let now = monotonic_ns();
        if now >= deadline {
            return false;
        }
        let left = (deadline - now).min(100_000_000);
        let timeout = libc::timespec {
            tv_sec: (left / 1_000_000_000) as libc::time_t,
            tv_nsec: (left % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `word` is a live, aligned 32-bit atomic; FUTEX_WAIT only reads it and
        // sleeps while it equals `value`, at most `timeout`.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                value,
                &timeout,
            );
        }
    }
}

fn wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic; FUTEX_WAKE only wakes its waiters.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// Wakes the helper (one byte on its pipe; a full pipe already means a wake-up pending).
fn wake_helper() {
    let fd = WAKE_FD.load(Ordering::Acquire);
    if fd >= 0 {
        let b = 1u8;
        // SAFETY: write(2) is async-signal-safe; `b` is one readable byte.
        unsafe { libc::write(fd, ptr::from_ref(&b).cast(), 1) };
    }
}

fn index_of(sig: c_int) -> Option<usize> {
    SIGNALS.iter().position(|&s| s == sig)
}

extern "C" fn on_signal(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    // SAFETY: errno is thread-local; reading and restoring it is what a handler must do.
    let errno = unsafe { *libc::__errno_location() };
    let tid = gettid();
    let armed = ARMED.load(Ordering::Acquire) != 0
        && EPOCH.load(Ordering::Relaxed) != 0
        && in_installing_process();
    if tid == HELPER_TID.load(Ordering::Relaxed) {
        // The helper crashed: nobody is left to save the trace; die as before.
        FATAL_DONE.store(1, Ordering::Release);
        wake_all(&FATAL_DONE);
        restore_and_reraise(sig, info);
    } else if !armed && CRASHER.load(Ordering::Acquire) == 0 {
        forward(sig, info, ctx);
    } else {
        match CRASHER.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                ARMED.store(0, Ordering::Relaxed);
                record(sig, info, ctx);
                wake_helper();
                let deadline = wait_deadline();
                wait_while(&FATAL_DONE, 0, deadline);
            }
            // This thread crashed again while its crash was handled: go on at once.
            Err(t) if t == tid => {}
            // Another thread's crash is being saved: wait for it (its re-raise usually
            // ends the process first).
            Err(_) => {
                let deadline = wait_deadline();
                wait_while(&FATAL_DONE, 0, deadline);
            }
        }
        restore_and_reraise(sig, info);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn in_installing_process() -> bool {
    // SAFETY: getpid is async-signal-safe and has no preconditions.
    INSTALL_PID.load(Ordering::Relaxed) == unsafe { libc::getpid() }
}

/// Notes the crash for the helper and stops the recording.
fn record(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    let ticks = CLOCK.get().map_or(0, |c| c.ticks());
    let epoch = EPOCH.swap(0, Ordering::Relaxed);
    // SAFETY: the kernel passes a valid siginfo_t with SA_SIGINFO; `si_addr` and `si_pid`
    // read the union as the signal's kind defines it (the address for the fault signals,
    // the sender for sent ones; both are plain integers for other kinds).
    let (code, addr, sender) = unsafe {
        let i = &*info;
        let sender = if i.si_code <= 0 { i.si_pid() } else { 0 };
        (i.si_code, i.si_addr() as u64, sender)
    };
    let (pc, sp) = registers(ctx);
    REC_SIGNAL.store(sig, Ordering::Relaxed);
    REC_CODE.store(code, Ordering::Relaxed);
    REC_ADDR.store(addr, Ordering::Relaxed);
    REC_PC.store(pc, Ordering::Relaxed);
    REC_SP.store(sp, Ordering::Relaxed);
    REC_TICKS.store(ticks, Ordering::Relaxed);
    REC_EPOCH.store(epoch, Ordering::Relaxed);
    REC_SENDER.store(sender, Ordering::Relaxed);
    FATAL_REQUESTED.store(1, Ordering::Release);
}

/// The interrupted instruction and stack pointers (0 where unknown).
fn registers(ctx: *mut c_void) -> (u64, u64) {
    if ctx.is_null() {
        return (0, 0);
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: with SA_SIGINFO the third argument is the interrupted context, a
        // ucontext_t the kernel wrote on the signal stack.
        let uc = unsafe { &*ctx.cast::<libc::ucontext_t>() };
        let g = &uc.uc_mcontext.gregs;
        (
            g[libc::REG_RIP as usize] as u64,
            g[libc::REG_RSP as usize] as u64,
        )
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: as above.
        let uc = unsafe { &*ctx.cast::<libc::ucontext_t>() };
        (uc.uc_mcontext.pc, uc.uc_mcontext.sp)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        (0, 0)
    }
}

/// Not armed: the previous action, as if ours were not there (ours stays installed). A
/// previous handler is called as the kernel would have; a default or ignored disposition is
/// put back and the signal re-raised.
fn forward(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    let Some(prev) = index_of(sig).map(|i| PREVIOUS[i].load(Ordering::Acquire)) else {
        return;
    };
    if prev.is_null() {
        return;
    }
    // SAFETY: `prev` was leaked at installation and is never freed or written again.
    let prev = unsafe { &*prev };
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        restore_and_reraise(sig, info);
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous action's handler, of the SA_SIGINFO signature its flags
        // declare, called with the arguments the kernel gave this one.
        let f: extern "C" fn(c_int, *mut siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the previous action's plain handler, as its flags declare.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

/// Puts the previous action back and makes the signal happen again under it: a fault
/// re-executes its instruction when the handler returns; a sent signal (`si_code <= 0`:
/// `kill`, `raise`, `abort`) is sent again to this thread, blocked until the handler
/// returns.
fn restore_and_reraise(sig: c_int, info: *mut siginfo_t) {
    let prev = index_of(sig).map_or(ptr::null_mut(), |i| PREVIOUS[i].load(Ordering::Acquire));
    // SAFETY: an all-zero sigaction is SIG_DFL with no flags.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    let action: *const libc::sigaction = if prev.is_null() { &dfl } else { prev };
    // SAFETY: `action` points to a complete sigaction (leaked at installation, or `dfl`).
    unsafe { libc::sigaction(sig, action, ptr::null_mut()) };
    // SAFETY: the kernel's siginfo_t (see `record`).
    let sent = info.is_null() || unsafe { (*info).si_code } <= 0;
    if sent {
        // SAFETY: tgkill to this very thread is async-signal-safe.
        unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid(),
                libc::syscall(libc::SYS_gettid),
                sig,
            );
        }
    }
}

// === The panic hook ===

fn on_panic(info: &std::panic::PanicHookInfo<'_>) {
    if ARMED.load(Ordering::Acquire) == 0
        || CRASHER.load(Ordering::Acquire) != 0
        || EPOCH.load(Ordering::Relaxed) == 0
        || !in_installing_process()
    {
        return;
    }
    let tid = gettid();
    if tid == HELPER_TID.load(Ordering::Relaxed) {
        return;
    }
    let ticks = CLOCK.get().map_or(0, |c| c.ticks());
    let payload = info.payload();
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "Box<dyn Any>".to_owned());
    let location = info
        .location()
        .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
    let stack = trim_backtrace(&std::backtrace::Backtrace::force_capture().to_string());
    // A poisoned lock only means a panic while it was held; the value is still whole.
    *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some((tid, message.clone()));
    PANICKED.store(1, Ordering::Relaxed);
    let record = PanicRecord {
        session: session_of(EPOCH.load(Ordering::Relaxed)),
        tid,
        ticks,
        message,
        location,
        stack,
    };
    PANICS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(record);
    let n = PANIC_ASKED.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
    wake_helper();
    let deadline = wait_deadline();
    // Bounded: the helper may need a lock this thread holds (a panic inside tracing code).
    loop {
        let done = PANIC_DONE.load(Ordering::Acquire);
        if done.wrapping_sub(n) as i32 >= 0 || !wait_while(&PANIC_DONE, done, deadline) {
            break;
        }
    }
}

/// At exit after a panic in a session still running (a panic out of `main` with
/// unwinding): the session is ended and saved as [`shutdown`](crate::shutdown) would.
extern "C" fn at_exit_after_panic() {
    let _ = std::panic::catch_unwind(|| {
        if PANICKED.load(Ordering::Relaxed) == 0 || ARMED.load(Ordering::Acquire) == 0 {
            return;
        }
        save_and_report("after a panic");
    });
}

/// Ends the running session, writes the trace, says so on stderr.
fn save_and_report(why: &str) {
    let msg = match crate::shutdown() {
        Ok(Some(r)) => match &r.path {
            Some(p) => format!(
                "tachyon: {why}: trace written to {} ({} bytes)\n",
                p.display(),
                r.bytes
            ),
            None => format!("tachyon: {why}: {r}\n"),
        },
        Ok(None) => return,
        Err(e) => format!("tachyon: {why}: writing the trace failed: {e}\n"),
    };
    // Raw write(2): stderr's lock may be held by the crashed thread.
    // SAFETY: writes the bytes of `msg` to fd 2.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

// === The helper thread ===

fn helper(mut wake: std::fs::File) {
    HELPER_TID.store(gettid(), Ordering::Relaxed);
    let mut buf = [0u8; 64];
    loop {
        match wake.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        // Panics first: the abort that follows a panic (`panic = "abort"`) comes after it.
        let asked = PANIC_ASKED.load(Ordering::Acquire);
        let _ = std::panic::catch_unwind(write_panics);
        PANIC_DONE.store(asked, Ordering::Release);
        wake_all(&PANIC_DONE);
        if FATAL_REQUESTED.load(Ordering::Acquire) != 0 && FATAL_DONE.load(Ordering::Acquire) == 0 {
            let _ = std::panic::catch_unwind(save_crash);
            FATAL_DONE.store(1, Ordering::Release);
            wake_all(&FATAL_DONE);
        }
    }
}

fn write_panics() {
    let records = std::mem::take(&mut *PANICS.lock().unwrap_or_else(|e| e.into_inner()));
    let Some(clock) = CLOCK.get() else { return };
    for r in records {
        let session = r.session;
        write_crash_event(session, &r.event(clock));
    }
}

/// The helper's work on a fatal signal: the crash event, then the shutdown.
fn save_crash() {
    let sig = REC_SIGNAL.load(Ordering::Relaxed);
    let code = REC_CODE.load(Ordering::Relaxed);
    let addr = REC_ADDR.load(Ordering::Relaxed);
    let pc = REC_PC.load(Ordering::Relaxed);
    let sp = REC_SP.load(Ordering::Relaxed);
    let tid = CRASHER.load(Ordering::Acquire);
    let session = session_of(REC_EPOCH.load(Ordering::Relaxed));
    let ts = CLOCK
        .get()
        .map_or(0, |c| c.ticks_to_ns(REC_TICKS.load(Ordering::Relaxed)));
    let mut args = vec![
        ("signal", Arg::Str(signal_name(sig).to_owned())),
        ("signal_number", Arg::Int(sig as i64)),
        ("code", Arg::Str(signal_code_name(sig, code).to_owned())),
    ];
    if code > 0 {
        args.push(("address", Arg::Ptr(addr)));
    } else {
        args.push((
            "sender_pid",
            Arg::Int(REC_SENDER.load(Ordering::Relaxed) as i64),
        ));
    }
    if pc != 0 {
        args.push(("pc", Arg::Ptr(pc)));
        if let Some(m) = module_offset(pc) {
            args.push(("pc_module", Arg::Str(m)));
        }
    }
    // A fault within a few pages of the stack pointer is the stack's guard page.
    let overflow = sig == libc::SIGSEGV && code > 0 && sp != 0 && addr.abs_diff(sp) < 64 << 10;
    if overflow {
        args.push(("stack_overflow", Arg::Bool(true)));
    }
    // Was this the abort after a panic (`panic = "abort"`)?
    if sig == libc::SIGABRT {
        // Not waiting: the crashed thread may hold it.
        let last = match LAST_PANIC.try_lock() {
            Ok(l) => Some(l),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(last) = last {
            if let Some((_, msg)) = last.as_ref().filter(|(t, _)| *t == tid) {
                args.push(("cause", Arg::Str(format!("panic: {msg}"))));
            }
        }
    }
    let name = if overflow {
        "crash: stack overflow (SIGSEGV)".to_owned()
    } else {
        format!("crash: {}", signal_name(sig))
    };
    let ev = CrashEvent {
        name,
        ts,
        tid,
        args,
        stack: Vec::new(),
    };
    write_crash_event(session, &ev);
    save_and_report(&format!("crashed ({})", signal_name(sig)));
}
