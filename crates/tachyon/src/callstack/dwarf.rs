//! Stack walking with `framehop` over the loaded binaries' `.eh_frame` (feature
//! `dwarf-unwind`, x86-64 Linux): the unwind rules of each address are found once and then
//! cached per thread, so a repeated stack costs a cache lookup and a stack read per frame, with
//! no lock and no allocation (`MustNotAllocateDuringUnwind`).
//!
//! Used for events on the calling thread ([`walk`]: registers read where it runs, the stack
//! read between its stack pointer and the top of the thread's stack) and for CPU samples
//! ([`walk_sample`]: the registers and the copy of the stack the kernel took).
//!
//! The unwinder is built from the module list (`modules.rs`) the first time it is needed and
//! rebuilt when an address is in no known module (a `dlopen` since). Its section data are
//! slices of the loaded images, which stay mapped while the library is loaded: a library
//! unloaded with `dlclose` while its frames are being unwound would make them dangle (Tracy
//! has the same limitation and overrides `dlclose`; we do not).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Mutex;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module as FhModule, MustNotAllocateDuringUnwind,
    Unwinder,
};

use super::modules::{self, Module};

type Data = &'static [u8];
type Fh = UnwinderX86_64<Data, MustNotAllocateDuringUnwind>;
type Cache = CacheX86_64<MustNotAllocateDuringUnwind>;

/// The unwinder for the modules loaded when it was built; replaced (and the old one leaked:
/// a few KiB per `dlopen` that adds code) when a module appears.
struct State {
    unwinder: Fh,
    /// Every executable range it covers.
    ranges: Vec<(u64, u64)>,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());
static BUILD: Mutex<()> = Mutex::new(());

fn state() -> &'static State {
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null STATE points at a `State` leaked by `rebuild`, never freed.
        return unsafe { &*p };
    }
    rebuild(None)
}

/// Builds the unwinder again from the current module list, unless another thread did since
/// `seen` was read.
#[cold]
fn rebuild(seen: Option<*mut State>) -> &'static State {
    let _g = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() && Some(p) != seen {
        // SAFETY: as in `state`.
        return unsafe { &*p };
    }
    let map = match seen {
        Some(_) => modules::rescan(&modules::current()),
        None => modules::current(),
    };
    let mut unwinder = Fh::new();
    let mut ranges = Vec::new();
    for m in map.modules() {
        if let Some(fh) = framehop_module(m) {
            ranges.push((m.start, m.end));
            unwinder.add_module(fh);
        }
    }
    let new = Box::into_raw(Box::new(State { unwinder, ranges }));
    STATE.store(new, Ordering::Release);
    // SAFETY: just leaked; never freed.
    unsafe { &*new }
}

/// The framehop module of one executable segment, with its `.eh_frame_hdr`, `.eh_frame` and
/// code as slices of the loaded image.
fn framehop_module(m: &Module) -> Option<FhModule<Data>> {
    let (hdr_svma, hdr_len) = m.eh_frame_hdr?;
    let mem = |svma: u64, len: u64| -> Data {
        // SAFETY: `svma..svma + len` lies inside a PT_LOAD segment of this loaded object
        // (checked by the callers against its program headers), mapped readable while the
        // object is loaded.
        unsafe {
            std::slice::from_raw_parts(
                m.base.wrapping_add(svma) as usize as *const u8,
                len as usize,
            )
        }
    };
    let in_load = |svma: u64, len: u64| {
        m.loads
            .iter()
            .find(|&&(v, sz)| svma >= v && svma.saturating_add(len) <= v.saturating_add(sz))
            .map(|&(v, sz)| v + sz)
    };
    in_load(hdr_svma, hdr_len)?;
    let hdr = mem(hdr_svma, hdr_len);
    let eh_frame_svma = eh_frame_address(hdr, hdr_svma)?;
    // `.eh_frame` ends at a zero terminator; the unwinder finds entries through the header's
    // table, so the rest of its segment will do as its extent.
    let end = in_load(eh_frame_svma, 4)?;
    let eh_frame = mem(eh_frame_svma, end - eh_frame_svma);
    let (text_svma, text_len) = m.text_svma;
    in_load(text_svma, text_len)?;
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(text_svma..text_svma + text_len),
        text: Some(mem(text_svma, text_len)),
        eh_frame_svma: Some(eh_frame_svma..end),
        eh_frame: Some(eh_frame),
        eh_frame_hdr_svma: Some(hdr_svma..hdr_svma + hdr_len),
        eh_frame_hdr: Some(hdr),
        ..Default::default()
    };
    let start = m.base.wrapping_add(text_svma);
    Some(FhModule::new(
        m.path.to_string(),
        start..start + text_len,
        m.base,
        info,
    ))
}

/// `.eh_frame`'s address from `.eh_frame_hdr` (`eh_frame_ptr`, in the encodings linkers use).
fn eh_frame_address(hdr: &[u8], hdr_svma: u64) -> Option<u64> {
    if hdr.len() < 8 || hdr[0] != 1 {
        return None;
    }
    let field = hdr_svma + 4;
    let b4 = |o: usize| hdr.get(o..o + 4).map(|b| [b[0], b[1], b[2], b[3]]);
    match hdr[1] {
        // DW_EH_PE_pcrel | DW_EH_PE_sdata4
        0x1b => Some(field.wrapping_add(i32::from_le_bytes(b4(4)?) as i64 as u64)),
        // DW_EH_PE_pcrel | DW_EH_PE_udata4
        0x13 => Some(field.wrapping_add(u64::from(u32::from_le_bytes(b4(4)?)))),
        // DW_EH_PE_udata4 / sdata4 (absolute)
        0x03 => Some(u64::from(u32::from_le_bytes(b4(4)?))),
        0x0b => Some(i32::from_le_bytes(b4(4)?) as i64 as u64),
        // DW_EH_PE_absptr / udata8
        0x00 | 0x04 => Some(u64::from_le_bytes(hdr.get(4..12)?.try_into().ok()?)),
        _ => None,
    }
}

thread_local! {
    static CACHE: RefCell<Option<Box<Cache>>> = const { RefCell::new(None) };
    /// The calling thread's rules in the compact form [`walk_from`] applies without framehop.
    static FAST: RefCell<Option<Box<FastRules>>> = const { RefCell::new(None) };
    /// The calling thread's stack, (lowest, highest) address; (0, 0) before it is known.
    static STACK: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    /// The calling thread's last walk ([`Memo`]).
    static MEMO: RefCell<Option<Box<Memo>>> = const { RefCell::new(None) };
}

/// Stack words a [`Memo`] keeps (a walk that reads more is not kept).
const MEMO_READS: usize = 4 * super::MAX_DEPTH;

/// The calling thread's last walk by [`fast_walk`]: where it started, what it gave, and every
/// stack word whose value it used. Each step of a walk is a function of the unwinder
/// (`state`), the registers it starts from and the words it reads, so a walk from the same
/// registers whose words all still hold the same values gives the same frames: checking those
/// words (a load and a compare each) replaces the walk (a rule lookup and its arithmetic per
/// frame). The common case it serves: allocations from the same call path, one after another.
///
/// Only what the frames depend on is kept: the return addresses, and `bp` (the starting
/// register, or a word a frame saved it in) only where a later rule computed a frame's address
/// from it. Optimized code without frame pointers uses `rbp` as an ordinary register (a
/// caller's loop counter, say), which every function that uses it too saves on the stack: a
/// walk reads those saved values but never uses them, and they change from call to call.
struct Memo {
    state: *const State,
    /// (ip, sp, skip, out.len()) of the walk.
    key: (u64, u64, usize, usize),
    /// The starting `bp`, when the walk used it ([`Words::bp_used`]); `None` when it did not.
    bp: Option<u64>,
    valid: bool,
    /// Names the kept walk: a new value (never 0) each time a walk is kept, so two walks
    /// answered with the same id gave the same frames ([`walk_from`]'s second value).
    id: u64,
    n: usize,
    frames: [u64; super::MAX_DEPTH],
    reads: usize,
    /// (address, value) of the words the walk used.
    words: [(u64, u64); MEMO_READS],
}

/// How a walk reads the stack, and what it tells about the words it read: [`Words::read_bp`]
/// reads a saved `bp`, whose value the walk may never use; [`Words::bp_used`] says it used the
/// current `bp` (the starting register, or the word it was last read from) after all.
/// [`Memo`] keeps only the words that were used.
trait Words {
    /// A word whose value the walk uses (a return address).
    fn read(&mut self, addr: u64) -> Result<u64, ()>;

    /// A saved `bp`: the walk's `bp` from now on.
    fn read_bp(&mut self, addr: u64) -> Result<u64, ()> {
        self.read(addr)
    }

    /// The walk uses the current `bp`'s value.
    fn bp_used(&mut self) {}
}

/// A stack reader that keeps nothing.
struct Plain<F>(F);

impl<F: FnMut(u64) -> Result<u64, ()>> Words for Plain<F> {
    #[inline(always)]
    fn read(&mut self, addr: u64) -> Result<u64, ()> {
        (self.0)(addr)
    }
}

/// In a [`Recorder`]'s word: a saved `bp` not used (yet). Bit 0 is free: words are 8-aligned.
const UNUSED_BP: u64 = 1;

/// A stack reader that records every word it reads into a [`Memo`]'s `words` (a saved `bp`
/// tagged [`UNUSED_BP`] until it is used); `full` when they did not fit.
struct Recorder<'a, R> {
    read: &'a mut R,
    words: &'a mut [(u64, u64)],
    reads: usize,
    full: bool,
    /// Where the current `bp` came from: `None`, the starting register; `Some(i)`, `words[i]`.
    bp_from: Option<usize>,
    /// The starting `bp` was used.
    start_bp_used: bool,
}

impl<'a, R: FnMut(u64) -> Result<u64, ()>> Recorder<'a, R> {
    /// A recorder of a fresh walk: nothing read yet, the current `bp` the starting register.
    #[inline(always)]
    fn new(read: &'a mut R, words: &'a mut [(u64, u64)]) -> Self {
        Recorder {
            read,
            words,
            reads: 0,
            full: false,
            bp_from: None,
            start_bp_used: false,
        }
    }

    #[inline(always)]
    fn record(&mut self, tagged: u64, v: u64) -> Option<usize> {
        let i = self.reads;
        match self.words.get_mut(i) {
            Some(w) => {
                *w = (tagged, v);
                self.reads += 1;
                Some(i)
            }
            None => {
                self.full = true;
                None
            }
        }
    }

    /// Drops the saved `bp` words never used; the rest keep their order.
    fn keep_used(&mut self) {
        let mut k = 0;
        for i in 0..self.reads {
            let w = self.words[i];
            if w.0 & UNUSED_BP == 0 {
                self.words[k] = w;
                k += 1;
            }
        }
        self.reads = k;
    }
}

impl<R: FnMut(u64) -> Result<u64, ()>> Words for Recorder<'_, R> {
    #[inline(always)]
    fn read(&mut self, addr: u64) -> Result<u64, ()> {
        let v = (self.read)(addr)?;
        self.record(addr, v);
        Ok(v)
    }

    #[inline(always)]
    fn read_bp(&mut self, addr: u64) -> Result<u64, ()> {
        let v = (self.read)(addr)?;
        // A failed record (`full`) keeps nothing anyway.
        self.bp_from = self.record(addr | UNUSED_BP, v);
        Ok(v)
    }

    #[inline(always)]
    fn bp_used(&mut self) {
        match self.bp_from {
            None => self.start_bp_used = true,
            Some(i) => self.words[i].0 &= !UNUSED_BP,
        }
    }
}

/// The registers unwinding starts from: inlined, so they are the caller's (the function that
/// calls [`capture`](super::capture) is the first frame, at its exact pc, and costs no unwind
/// step).
#[inline(always)]
pub(super) fn regs() -> (u64, u64, u64) {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads rip, rsp and rbp into registers; touches no memory and no flags.
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    (ip, sp, bp)
}

/// Frames of the calling thread from the registers `regs` read, into `out` (the first at its
/// exact pc, the others return addresses minus one), after skipping `skip`; `None` when this
/// thread cannot be unwound this way (its stack bounds unknown, a nested call). The frame of
/// the function that read the registers stays intact above `sp` while this runs.
#[inline(always)]
pub(super) fn walk_from(regs: (u64, u64, u64), out: &mut [u64], skip: usize) -> Option<usize> {
    walk_from_id(regs, out, skip, 0).map(|(n, _)| n)
}

/// [`walk_from`], and the id of the thread's kept walk ([`Memo`]) that the frames are (0: not
/// a kept walk). The same non-zero id from two calls of one thread means the same frames, so
/// a caller that keeps what it derived from the last frames (a hash, an interned id) can
/// reuse it without looking at them. When the answer is the id `known` (0: none), `out` is
/// not written: that caller has what it derived from those frames already.
#[inline(never)]
pub(super) fn walk_from_id(
    (ip, sp, bp): (u64, u64, u64),
    out: &mut [u64],
    skip: usize,
    known: u64,
) -> Option<(usize, u64)> {
    let (lo, hi) = stack_bounds()?;
    if !(lo..hi).contains(&sp) {
        return None;
    }
    let lowest = sp;
    let mut read = |addr: u64| -> Result<u64, ()> {
        if addr >= lowest && addr.checked_add(8).is_some_and(|e| e <= hi) && addr % 8 == 0 {
            // SAFETY: `addr` is 8-aligned and inside this thread's own stack, between the
            // current stack pointer and its top: mapped and readable.
            Ok(unsafe { std::ptr::read(addr as *const u64) })
        } else {
            Err(())
        }
    };
    memo_walk(ip, sp, bp, skip, out, known, &mut read)
        .or_else(|| run(ip, sp, bp, skip, out, &mut read).map(|n| (n, 0)))
}

/// [`fast_walk`] through the thread's [`Memo`]: the last walk's frames when it started from
/// the same registers (`bp` only when it used it) and every word it used is unchanged;
/// otherwise a walk, kept for next time when it succeeds. The kept frames are not copied into
/// `out` when the kept walk's id is `known` ([`walk_from_id`]).
#[inline(always)]
fn memo_walk(
    ip: u64,
    sp: u64,
    bp: u64,
    skip: usize,
    out: &mut [u64],
    known: u64,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<(usize, u64)> {
    let key = (ip, sp, skip, out.len());
    let kept = MEMO.try_with(|m| {
        // A nested call (the memo in use): walk without it.
        let mut m = m.try_borrow_mut().ok()?;
        let m = m.get_or_insert_with(|| {
            Box::new(Memo {
                state: std::ptr::null(),
                key: (0, 0, 0, 0),
                bp: None,
                valid: false,
                id: 0,
                n: 0,
                frames: [0; super::MAX_DEPTH],
                reads: 0,
                words: [(0, 0); MEMO_READS],
            })
        });
        if m.valid
            && m.key == key
            && m.bp.is_none_or(|b| b == bp)
            && std::ptr::eq(m.state, STATE.load(Ordering::Acquire))
            && m.n <= out.len()
            // All the words, without stopping at the first that changed: a miss is rare (a
            // walk follows it, which costs far more), and a loop without an exit per word
            // takes fewer instructions per word (the compiler unrolls it).
            && m.words[..m.reads].iter().fold(0, |diff, &(a, v)| {
                // SAFETY: `a` was read by the kept walk through `read`, which only reads
                // 8-aligned words between that walk's `sp` and the top of this thread's stack;
                // `sp` is the same now (`key`) and so is the stack (the memo is this thread's),
                // so `a` is a mapped, readable word of it (no bounds checks needed again).
                diff | (unsafe { std::ptr::read(a as *const u64) } ^ v)
            }) == 0
        {
            if m.id != known {
                out[..m.n].copy_from_slice(&m.frames[..m.n]);
            }
            return Some(Some((m.n, m.id)));
        }
        m.valid = false;
        m.reads = 0;
        let mut rec = Recorder::new(read, &mut m.words);
        let got = fast_walk(ip, sp, bp, skip, out, &mut rec);
        rec.keep_used();
        let (full, reads, start_bp_used) = (rec.full, rec.reads, rec.start_bp_used);
        if let Some(n) = got {
            if !full && n <= m.frames.len() {
                m.frames[..n].copy_from_slice(&out[..n]);
                m.n = n;
                m.reads = reads;
                m.key = key;
                m.bp = start_bp_used.then_some(bp);
                // The unwinder the walk used (`fast_walk` builds it again when a module
                // appeared): a later one may have other rules.
                m.state = STATE.load(Ordering::Acquire);
                m.valid = true;
                m.id = m.id.wrapping_add(1).max(1);
                return Some(Some((n, m.id)));
            }
        }
        Some(got.map(|n| (n, 0)))
    });
    match kept {
        Ok(Some(got)) => got,
        _ => fast_walk(ip, sp, bp, skip, out, &mut Plain(read)).map(|n| (n, 0)),
    }
}

/// One frame's unwind rule in a form that needs no framehop to apply: the caller's stack
/// pointer (the CFA) is `sp` or `bp` plus `cfa_off`; the return address is at `cfa + ra_off`;
/// the caller's `bp` is at `cfa + bp_off`, or unchanged when `bp_off` is [`BP_SAME`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FastRule {
    /// The return address the rule is for (0: an empty slot).
    addr: u64,
    cfa_from_bp: bool,
    /// The frame ends the stack.
    end: bool,
    cfa_off: i32,
    ra_off: i32,
    bp_off: i32,
}

const BP_SAME: i32 = i32::MAX;
const FAST_SLOTS: usize = 1024;

/// A thread's direct-mapped table of [`FastRule`]s, valid for the unwinder `state` it was
/// learned from.
struct FastRules {
    state: *const State,
    slots: [FastRule; FAST_SLOTS],
}

/// In a [`FastRule`]'s `addr`: the rule is for a first frame's exact pc (where
/// [`capture`](super::capture), inlined, read the registers: one pc per call site), not for a
/// return address. Bit 63: never set in a user-space address.
const EXACT_PC: u64 = 1 << 63;

/// The slot of an exact pc's rule (apart from a return address's at the same place).
fn exact_slot_of(pc: u64) -> usize {
    slot_of(pc ^ 0x2a5)
}

const EMPTY_RULE: FastRule = FastRule {
    addr: 0,
    cfa_from_bp: false,
    end: false,
    cfa_off: 0,
    ra_off: 0,
    bp_off: 0,
};

fn slot_of(ra: u64) -> usize {
    ((ra ^ (ra >> 10)) as usize) & (FAST_SLOTS - 1)
}

/// The compact rule of return address `ra`, found by running framehop's rule for it on a
/// made-up stack whose every word names its own address: where the return address and the
/// caller's `bp` were read from, and where the stack pointer went, is the rule. `None` when
/// the rule is not of that form (framehop then unwinds that frame itself).
/// `exact_pc`: `ra` is the first frame's exact pc, not a return address (its rule is looked
/// up at `ra` itself, not at `ra - 1`).
#[cold]
fn learn(st: &State, cache: &mut Cache, ra: u64, exact_pc: bool) -> Option<FastRule> {
    const SP: u64 = 0x4000_0000_0000;
    const BP: u64 = 0x5000_0000_0000;
    const TAG: u64 = 0x0a00_0000_0000_0000;
    const NEAR: u64 = 1 << 24;
    let address = if exact_pc {
        FrameAddress::InstructionPointer(ra)
    } else {
        FrameAddress::from_return_address(ra)?
    };
    let mut regs = UnwindRegsX86_64::new(ra, SP, BP);
    let mut read = |a: u64| -> Result<u64, ()> { Ok(a ^ TAG) };
    let got = st
        .unwinder
        .unwind_frame(address, &mut regs, cache, &mut read)
        .ok()?;
    let Some(new_ra) = got else {
        return Some(FastRule {
            addr: ra,
            end: true,
            ..EMPTY_RULE
        });
    };
    let cfa = regs.sp();
    let (cfa_from_bp, base) = if cfa.wrapping_sub(SP) < NEAR {
        (false, SP)
    } else if cfa.wrapping_sub(BP) < NEAR {
        (true, BP)
    } else {
        return None;
    };
    let rel = |slot: u64| -> Option<i32> {
        // A slot of the same frame: within 16 MiB of the CFA, on the same base.
        let d = slot.wrapping_sub(cfa) as i64;
        (slot.wrapping_sub(base) < NEAR && d.unsigned_abs() < NEAR).then_some(d as i32)
    };
    let ra_off = rel(new_ra ^ TAG)?;
    let bp_off = if regs.bp() == BP {
        BP_SAME
    } else {
        rel(regs.bp() ^ TAG)?
    };
    Some(FastRule {
        addr: ra,
        cfa_from_bp,
        end: false,
        cfa_off: i32::try_from(cfa - base).ok()?,
        ra_off,
        bp_off,
    })
}

/// [`run`] for the calling thread: each frame by its [`FastRule`], the first (from the exact
/// pc) too, learned the first time its return address (or pc) is seen; framehop takes the
/// first step when its pc's rule is not compact. `None` when
/// the thread's tables are in use (a nested call) or a frame's rule cannot be made compact
/// and the walk has to start over with framehop alone.
#[inline(always)]
fn fast_walk(
    ip: u64,
    sp: u64,
    bp: u64,
    mut skip: usize,
    out: &mut [u64],
    read: &mut impl Words,
) -> Option<usize> {
    let st = state();
    if !st.ranges.iter().any(|&(s, e)| (s..e).contains(&ip)) {
        return None;
    }
    FAST.try_with(|f| {
        let mut f = f.try_borrow_mut().ok()?;
        let f = f.get_or_insert_with(|| {
            Box::new(FastRules {
                state: std::ptr::null(),
                slots: [EMPTY_RULE; FAST_SLOTS],
            })
        });
        if !std::ptr::eq(f.state, st) {
            f.slots.fill(EMPTY_RULE);
            f.state = st as *const State;
        }
        CACHE
            .try_with(|c| {
                let mut c = c.try_borrow_mut().ok()?;
                let cache = c.get_or_insert_with(|| Box::new(Cache::new_in()));
                let mut n = 0;
                let len = out.len();
                let mut put = |pc: u64, skip: &mut usize, n: &mut usize| {
                    if *skip > 0 {
                        *skip -= 1;
                    } else {
                        out[*n] = pc;
                        *n += 1;
                    }
                };
                put(ip, &mut skip, &mut n);
                if n == len {
                    return Some(n);
                }
                // The first step, from the exact pc (whose rule may differ from a return
                // address's at the same place): by its cached compact rule, else by framehop.
                let first = exact_slot_of(ip);
                if f.slots[first].addr != ip | EXACT_PC {
                    // A pc whose rule is not compact (or that ends the stack) is kept as an
                    // `end` rule: framehop takes that first step each time.
                    let rule = learn(st, cache, ip, true).unwrap_or(FastRule {
                        end: true,
                        ..EMPTY_RULE
                    });
                    f.slots[first] = FastRule {
                        addr: ip | EXACT_PC,
                        ..rule
                    };
                }
                let rule = f.slots[first];
                let compact = rule.addr == ip | EXACT_PC && !rule.end;
                if compact && rule.cfa_from_bp {
                    read.bp_used();
                }
                let (mut ra, mut sp, mut bp) = match rule {
                    rule if compact && !(rule.cfa_from_bp && bp == 0) => {
                        let base = if rule.cfa_from_bp { bp } else { sp };
                        let cfa = base.wrapping_add(rule.cfa_off as i64 as u64);
                        if cfa <= sp {
                            return Some(n);
                        }
                        let Ok(ra) = read.read(cfa.wrapping_add(rule.ra_off as i64 as u64)) else {
                            return Some(n);
                        };
                        let bp = if rule.bp_off == BP_SAME {
                            bp
                        } else {
                            match read.read_bp(cfa.wrapping_add(rule.bp_off as i64 as u64)) {
                                Ok(b) => b,
                                Err(()) => return Some(n),
                            }
                        };
                        (ra, cfa, bp)
                    }
                    _ => {
                        // framehop's step may use `bp`, and every word it reads counts as
                        // used; the `bp` it leaves comes from those.
                        read.bp_used();
                        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
                        let first = st.unwinder.unwind_frame(
                            FrameAddress::InstructionPointer(ip),
                            &mut regs,
                            cache,
                            &mut |a| read.read(a),
                        );
                        let Ok(Some(ra)) = first else {
                            return Some(n);
                        };
                        (ra, regs.sp(), regs.bp())
                    }
                };
                for _ in 0..1024 {
                    if n == len || ra == 0 {
                        break;
                    }
                    put(ra - 1, &mut skip, &mut n);
                    if n == len {
                        break;
                    }
                    let slot = slot_of(ra);
                    let mut rule = f.slots[slot];
                    if rule.addr != ra {
                        rule = learn(st, cache, ra, false)?;
                        f.slots[slot] = rule;
                    }
                    if rule.end {
                        break;
                    }
                    if rule.cfa_from_bp {
                        read.bp_used();
                        if bp == 0 {
                            break;
                        }
                    }
                    let base = if rule.cfa_from_bp { bp } else { sp };
                    let cfa = base.wrapping_add(rule.cfa_off as i64 as u64);
                    if cfa <= sp {
                        break; // not moving up the stack: a corrupt frame
                    }
                    let Ok(next) = read.read(cfa.wrapping_add(rule.ra_off as i64 as u64)) else {
                        break;
                    };
                    if rule.bp_off != BP_SAME {
                        let Ok(b) = read.read_bp(cfa.wrapping_add(rule.bp_off as i64 as u64))
                        else {
                            break;
                        };
                        bp = b;
                    }
                    sp = cfa;
                    ra = next;
                }
                Some(n)
            })
            .ok()
            .flatten()
    })
    .ok()
    .flatten()
}

/// Frames of a CPU sample: the registers the kernel saved and `stack`, its copy of the stack
/// from `sp` up. The first frame is `ip` itself.
pub(crate) fn walk_sample(ip: u64, sp: u64, bp: u64, stack: &[u8], out: &mut [u64]) -> usize {
    let mut read = |addr: u64| -> Result<u64, ()> {
        let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
        let b = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
        Ok(u64::from_ne_bytes(b.try_into().map_err(|_| ())?))
    };
    run(ip, sp, bp, 0, out, &mut read).unwrap_or(0)
}

fn run(
    ip: u64,
    sp: u64,
    bp: u64,
    mut skip: usize,
    out: &mut [u64],
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Option<usize> {
    let mut st = state();
    if !st.ranges.iter().any(|&(s, e)| (s..e).contains(&ip)) {
        // A library loaded since? Look again, at most once a second (JIT code and bad
        // samples are in no module at all).
        static LAST: AtomicU64 = AtomicU64::new(0);
        let now = crate::clock::now() / 1_000_000_000;
        if LAST.swap(now, Ordering::Relaxed) != now {
            st = rebuild(Some(STATE.load(Ordering::Acquire)));
        }
    }
    CACHE
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            let cache = c.get_or_insert_with(|| Box::new(Cache::new_in()));
            let regs = UnwindRegsX86_64::new(ip, sp, bp);
            let mut it = st.unwinder.iter_frames(ip, regs, cache, read);
            let mut n = 0;
            // Bounded even if a corrupt stack makes the unwinder go round.
            for _ in 0..(out.len() + skip + 1).min(1024) {
                let Ok(Some(frame)) = it.next() else {
                    break;
                };
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                if n == out.len() {
                    break;
                }
                out[n] = match frame {
                    FrameAddress::InstructionPointer(pc) => pc,
                    FrameAddress::ReturnAddress(_) => frame.address_for_lookup(),
                };
                n += 1;
            }
            Some(n)
        })
        .ok()
        .flatten()
}

/// This thread's stack bounds, from pthread (read once per thread).
fn stack_bounds() -> Option<(u64, u64)> {
    let b = STACK.try_with(Cell::get).ok()?;
    if b.1 != 0 {
        return Some(b);
    }
    extern "C" {
        fn pthread_self() -> usize;
        fn pthread_getattr_np(thread: usize, attr: *mut u8) -> i32;
        fn pthread_attr_getstack(attr: *const u8, addr: *mut *mut u8, size: *mut usize) -> i32;
        fn pthread_attr_destroy(attr: *mut u8) -> i32;
    }
    // pthread_attr_t is 56 bytes on x86-64 glibc and musl; 64, 8-aligned, to spare.
    let mut attr = [0u64; 8];
    let (mut addr, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: `attr` is large and aligned enough for a pthread_attr_t, initialized by
    // pthread_getattr_np before pthread_attr_getstack reads it and destroyed after.
    let ok = unsafe {
        let a = attr.as_mut_ptr().cast::<u8>();
        if pthread_getattr_np(pthread_self(), a) != 0 {
            return None;
        }
        let ok = pthread_attr_getstack(a, &mut addr, &mut size) == 0;
        pthread_attr_destroy(a);
        ok
    };
    if !ok || addr.is_null() || size == 0 {
        return None;
    }
    let b = (addr as u64, addr as u64 + size as u64);
    let _ = STACK.try_with(|s| s.set(b));
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorder keeps the return addresses and only the saved `bp` words a rule used (the
    /// latest one read before each use), and the starting `bp` when it was used before any.
    #[test]
    fn the_memo_keeps_the_words_the_walk_used() {
        let mut stack = |a: u64| -> Result<u64, ()> { Ok(a * 2) };
        let mut words = [(0u64, 0u64); 8];
        let mut r = Recorder::new(&mut stack, &mut words);
        assert_eq!(r.read(0x100), Ok(0x200));
        assert_eq!(r.read_bp(0x108), Ok(0x210)); // replaced before any use
        assert_eq!(r.read(0x110), Ok(0x220));
        assert_eq!(r.read_bp(0x118), Ok(0x230));
        r.bp_used();
        r.bp_used();
        assert_eq!(r.read(0x120), Ok(0x240));
        assert_eq!(r.read_bp(0x128), Ok(0x250)); // never used
        r.keep_used();
        assert!(!r.start_bp_used && !r.full);
        assert_eq!(r.reads, 4);
        assert_eq!(
            r.words[..4],
            [
                (0x100, 0x200),
                (0x110, 0x220),
                (0x118, 0x230),
                (0x120, 0x240)
            ]
        );

        let mut words = [(0u64, 0u64); 2];
        let mut r = Recorder::new(&mut stack, &mut words);
        r.bp_used();
        for a in [0x100, 0x108, 0x110] {
            r.read(a).unwrap();
        }
        assert!(r.start_bp_used);
        assert!(r.full, "three words do not fit in two");
    }

    #[test]
    fn header_encodings_decode() {
        let mut hdr = vec![1u8, 0x1b, 0x03, 0x3b];
        hdr.extend_from_slice(&(-0x100i32).to_le_bytes());
        assert_eq!(eh_frame_address(&hdr, 0x2000), Some(0x2004 - 0x100));
        hdr[1] = 0x03;
        hdr[4..8].copy_from_slice(&0x5000u32.to_le_bytes());
        assert_eq!(eh_frame_address(&hdr, 0x2000), Some(0x5000));
        hdr[1] = 0xff;
        assert_eq!(eh_frame_address(&hdr, 0x2000), None);
        assert_eq!(eh_frame_address(&[1, 0x1b], 0), None);
    }
}
