//! The loaded binaries of this process (`dl_iterate_phdr`): path, GNU build id, and the
//! address ranges of their executable segments, which become Perfetto `Mapping`s.
//!
//! The list is read once and read again when an address falls in no known module (a library
//! loaded since with `dlopen`). Lookups run where stacks are interned (the first time an
//! address is seen on a sequence), never where they are captured.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex};

/// One executable segment of a loaded binary, as a Perfetto `Mapping` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// The binary's path (the main program's resolved through `/proc/self/exe`), or a name in
    /// brackets for what has no file (`[vdso]`).
    pub path: Arc<str>,
    /// The GNU build id (`NT_GNU_BUILD_ID` note), raw bytes; empty when the binary has none.
    pub build_id: Arc<[u8]>,
    /// Address range of the segment in memory, page-aligned like `/proc/self/maps`.
    pub start: u64,
    /// End (exclusive).
    pub end: u64,
    /// File offset of `start` (page-aligned).
    pub exact_offset: u64,
    /// File offset of the binary's first loadable segment.
    pub start_offset: u64,
    /// The ELF's own `p_vaddr - p_offset` of this segment.
    pub load_bias: u64,
    /// The load address the loader chose (`dlpi_addr`): `pc - base` is the address in the
    /// ELF file (Perfetto's `rel_pc`), which is what a symbolizer looks up.
    pub base: u64,
    /// The segment's ELF address and size (`p_vaddr`, `p_memsz`).
    pub(crate) text_svma: (u64, u64),
    /// `.eh_frame_hdr` (`PT_GNU_EH_FRAME`): ELF address and size, for the DWARF unwinder.
    pub(crate) eh_frame_hdr: Option<(u64, u64)>,
    /// Every loadable segment of the binary (`p_vaddr`, `p_memsz`): bounds `.eh_frame`.
    pub(crate) loads: Arc<[(u64, u64)]>,
}

impl Module {
    /// Whether `pc` falls in this segment.
    pub fn contains(&self, pc: u64) -> bool {
        (self.start..self.end).contains(&pc)
    }

    /// `pc` relative to the binary (Perfetto's `Frame.rel_pc`).
    pub fn rel_pc(&self, pc: u64) -> u64 {
        pc.wrapping_sub(self.base)
    }
}

/// The modules, sorted by `start`.
#[derive(Debug, Default)]
pub(crate) struct ModuleMap {
    modules: Vec<Module>,
}

impl ModuleMap {
    #[cfg_attr(not(feature = "dwarf-unwind"), allow(dead_code))]
    pub(crate) fn modules(&self) -> &[Module] {
        &self.modules
    }

    pub(crate) fn find(&self, pc: u64) -> Option<(usize, &Module)> {
        let i = self.modules.partition_point(|m| m.start <= pc);
        let i = i.checked_sub(1)?;
        let m = &self.modules[i];
        m.contains(pc).then_some((i, m))
    }
}

static MAP: Mutex<Option<Arc<ModuleMap>>> = Mutex::new(None);

/// The current list (read on first use).
pub(crate) fn current() -> Arc<ModuleMap> {
    let mut g = MAP.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(|| Arc::new(scan())).clone()
}

/// Reads the list again if `stale` is still the current one (another thread may have done so).
pub(crate) fn rescan(stale: &Arc<ModuleMap>) -> Arc<ModuleMap> {
    let mut g = MAP.lock().unwrap_or_else(|e| e.into_inner());
    match g.as_ref() {
        Some(m) if !Arc::ptr_eq(m, stale) => m.clone(),
        _ => g.insert(Arc::new(scan())).clone(),
    }
}

/// The module containing `pc`, reading the list again once if none does.
pub fn module_of(pc: u64) -> Option<Module> {
    let map = current();
    if let Some((_, m)) = map.find(pc) {
        return Some(m.clone());
    }
    rescan(&map).find(pc).map(|(_, m)| m.clone())
}

/// Every executable segment of every loaded binary, sorted by address.
pub fn loaded_modules() -> Vec<Module> {
    current().modules.clone()
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn scan() -> ModuleMap {
    let mut modules: Vec<Module> = Vec::new();
    // SAFETY: `collect` matches the callback type `dl_iterate_phdr` expects and never unwinds
    // (it catches nothing because it cannot panic: every slice it builds is bounds-checked
    // against the program headers the loader gives); `modules` outlives the call.
    unsafe {
        dl_iterate_phdr(collect, (&raw mut modules).cast());
    }
    let exe = std::fs::read_link("/proc/self/exe")
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    for m in &mut modules {
        if m.path.is_empty() {
            if let Some(exe) = &exe {
                m.path = exe.as_str().into();
            }
        }
    }
    modules.sort_by_key(|m| m.start);
    ModuleMap { modules }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn scan() -> ModuleMap {
    ModuleMap::default()
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
#[repr(C)]
struct DlPhdrInfo {
    addr: usize,
    name: *const c_char,
    phdr: *const Elf64Phdr,
    phnum: u16,
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
#[repr(C)]
struct Elf64Phdr {
    p_type: u32,
    p_flags: u32,
    p_offset: u64,
    p_vaddr: u64,
    p_paddr: u64,
    p_filesz: u64,
    p_memsz: u64,
    p_align: u64,
}

const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
const PF_X: u32 = 1;
const NT_GNU_BUILD_ID: u32 = 3;
const PAGE: u64 = 4096;

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
extern "C" {
    fn dl_iterate_phdr(
        cb: extern "C" fn(info: *mut DlPhdrInfo, size: usize, data: *mut c_void) -> c_int,
        data: *mut c_void,
    ) -> c_int;
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
extern "C" fn collect(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `&mut Vec<Module>` `scan` passed, borrowed by nobody else during
    // the call; `info` is the loader's description of one loaded object, valid during the
    // callback.
    let (out, info) = unsafe { (&mut *data.cast::<Vec<Module>>(), &*info) };
    let phdrs: &[Elf64Phdr] = if info.phdr.is_null() || info.phnum == 0 {
        &[]
    } else {
        // SAFETY: the loader gives `phnum` program headers at `phdr`, mapped for the life of
        // the object (and the object stays loaded during the callback).
        unsafe { std::slice::from_raw_parts(info.phdr, usize::from(info.phnum)) }
    };
    let name = if info.name.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null `dlpi_name` is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.name) }
            .to_string_lossy()
            .into_owned()
    };
    let path: Arc<str> = if name.starts_with("linux-vdso") || name.starts_with("linux-gate") {
        "[vdso]".into()
    } else {
        name.into()
    };
    let base = info.addr as u64;
    let mut build_id: Arc<[u8]> = Arc::from(&[][..]);
    for ph in phdrs.iter().filter(|p| p.p_type == PT_NOTE) {
        // SAFETY: a PT_NOTE segment is inside a loaded PT_LOAD segment of this object (the
        // loader maps notes), so its `p_filesz` bytes at `base + p_vaddr` are readable.
        let notes = unsafe {
            std::slice::from_raw_parts(
                (base.wrapping_add(ph.p_vaddr)) as usize as *const u8,
                ph.p_filesz as usize,
            )
        };
        if let Some(id) = gnu_build_id(notes) {
            build_id = id.into();
            break;
        }
    }
    let eh_frame_hdr = phdrs
        .iter()
        .find(|p| p.p_type == PT_GNU_EH_FRAME)
        .map(|p| (p.p_vaddr, p.p_memsz));
    let loads: Arc<[(u64, u64)]> = phdrs
        .iter()
        .filter(|p| p.p_type == PT_LOAD)
        .map(|p| (p.p_vaddr, p.p_memsz))
        .collect();
    let start_offset = phdrs
        .iter()
        .filter(|p| p.p_type == PT_LOAD)
        .map(|p| p.p_offset & !(PAGE - 1))
        .min()
        .unwrap_or(0);
    for ph in phdrs
        .iter()
        .filter(|p| p.p_type == PT_LOAD && p.p_flags & PF_X != 0)
    {
        let start = base.wrapping_add(ph.p_vaddr) & !(PAGE - 1);
        let end = base.wrapping_add(ph.p_vaddr).wrapping_add(ph.p_memsz);
        out.push(Module {
            path: path.clone(),
            build_id: build_id.clone(),
            start,
            end,
            exact_offset: ph.p_offset & !(PAGE - 1),
            start_offset,
            load_bias: ph.p_vaddr.wrapping_sub(ph.p_offset),
            base,
            text_svma: (ph.p_vaddr, ph.p_memsz),
            eh_frame_hdr,
            loads: loads.clone(),
        });
    }
    0
}

/// The descriptor of the `NT_GNU_BUILD_ID` note in a note segment (`PT_NOTE`) of a binary of
/// this machine's byte order, if there is one; `None` for malformed notes.
pub fn gnu_build_id(mut notes: &[u8]) -> Option<&[u8]> {
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    while notes.len() >= 12 {
        let word = |i: usize| u32::from_ne_bytes(notes[i..i + 4].try_into().expect("4 bytes"));
        let (namesz, descsz, ty) = (word(0) as usize, word(4) as usize, word(8));
        let name_end = 12usize.checked_add(align4(namesz)?)?;
        let desc_end = name_end.checked_add(align4(descsz)?)?;
        if desc_end > notes.len() {
            return None;
        }
        if ty == NT_GNU_BUILD_ID && notes.get(12..12 + namesz) == Some(b"GNU\0") {
            return notes.get(name_end..name_end + descsz);
        }
        notes = &notes[desc_end..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_parse_and_garbage_is_refused() {
        let mut n = Vec::new();
        n.extend_from_slice(&4u32.to_ne_bytes());
        n.extend_from_slice(&3u32.to_ne_bytes());
        n.extend_from_slice(&1u32.to_ne_bytes()); // another note type first
        n.extend_from_slice(b"XYZ\0");
        n.extend_from_slice(&[1, 2, 3, 0]);
        n.extend_from_slice(&4u32.to_ne_bytes());
        n.extend_from_slice(&4u32.to_ne_bytes());
        n.extend_from_slice(&NT_GNU_BUILD_ID.to_ne_bytes());
        n.extend_from_slice(b"GNU\0");
        n.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(gnu_build_id(&n), Some(&[0xde, 0xad, 0xbe, 0xef][..]));
        assert_eq!(gnu_build_id(&n[..n.len() - 1]), None);
        let mut huge = n.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(gnu_build_id(&huge), None);
    }

    #[cfg_attr(
        miri,
        ignore = "walks the real stack and the loader's module list, which Miri does not model"
    )]
    #[test]
    fn this_function_is_in_the_test_binary() {
        let pc = this_function_is_in_the_test_binary as *const () as usize as u64;
        let m = module_of(pc).expect("the test binary is loaded");
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(&*m.path, exe.to_str().unwrap());
        assert!(!m.build_id.is_empty(), "rustc links a build id by default");
        assert!(m.rel_pc(pc) < m.end - m.base);
    }
}
