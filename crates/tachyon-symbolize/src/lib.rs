//! Symbolization of Tachyon (and Perfetto) traces: the frames of their call stacks resolved to
//! function, source file and line, inlined functions included, Rust names demangled.
//!
//! Traces record raw addresses: interned `mappings` (binary path, build id) and `frames`
//! (mapping + relative pc). [`symbolize`] reads them, finds each binary, resolves every address
//! once with its DWARF (`addr2line`: line tables, inlined subroutines, split DWARF, compressed
//! sections; the ELF symbol table when there is no DWARF), and returns Perfetto `ModuleSymbols`
//! packets to append to the trace — what Perfetto's `traceconv symbolize` writes, which
//! Perfetto's trace processor and Tachyon's both apply to the frames (`stack_profile_symbol`).
//! The SDK calls it when a session ends; `tachyon symbolize IN OUT` calls it on a trace
//! recorded without it.
//!
//! ```no_run
//! let trace = std::fs::read("trace.pftrace")?;
//! let out = tachyon_symbolize::symbolize(&trace, &tachyon_symbolize::Options::default())?;
//! for m in &out.modules {
//!     println!("{m}");
//! }
//! let mut symbolized = trace;
//! symbolized.extend_from_slice(&out.packets);
//! std::fs::write("trace.sym.pftrace", symbolized)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Which files are read
//!
//! A trace is untrusted input; its mapping paths are only names. A binary is read when it is
//!
//! - a file the user named ([`Options::binaries`]) whose build id matches the mapping's (or,
//!   for a mapping without a build id, whose file name matches), or a file in a directory the
//!   user named ([`Options::search_dirs`]: `DIR/<file name>`, `DIR/.build-id/xx/rest.debug`)
//!   that matches the same way; or
//! - the mapping's own path, when [`Options::trace_paths`] allows it (the default), and only if
//!   it is an absolute path to a regular file (no device, FIFO or directory: nothing that could
//!   block or is not a binary) that is an ELF file with a GNU build id equal to the mapping's.
//!   A mapping without a build id is never read from its own path.
//!
//! Checking a candidate reads at most its ELF header, program headers and 64 KiB of notes. Only
//! a binary that passed is then parsed in full (with the split-DWARF and `.gnu_debuglink`
//! files its own DWARF names). So a hostile trace can name a path, but the symbolizer reads
//! nothing there unless it is the very binary (by build id) the trace claims; and with
//! `trace_paths` off, nothing the user did not name.
//!
//! # Bad input
//!
//! A missing, replaced (other build id) or unreadable binary is reported in
//! [`Symbolized::modules`] and its frames stay unsymbolized (module and address); the others
//! are symbolized. No debug info gives symbol-table names or nothing; corrupt DWARF gives
//! what could be read. Frames in no file (JIT code, `[vdso]`, `[unknown]`) are left alone.
//! Nothing panics (a panic inside the DWARF reader would be caught and reported as an error
//! for that binary).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use protozero::HeapBuffered;
use tachyon_protos::{Trace, TraceView};

mod elf;

/// Addresses per `ModuleSymbols` packet (keeps packets well under Perfetto's packet limits).
const ADDRESSES_PER_PACKET: usize = 512;
/// `TracePacket.sequence_flags` bit for an incremental-state clear.
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;

/// Where to look for binaries (see the crate docs for what is read).
#[derive(Clone, Debug)]
pub struct Options {
    /// Binaries (or their debug files) the user names.
    pub binaries: Vec<PathBuf>,
    /// Directories to look in: `DIR/<file name>` and `DIR/.build-id/xx/rest.debug`.
    pub search_dirs: Vec<PathBuf>,
    /// Whether a mapping's own path may be read (only if it is that binary, by build id).
    pub trace_paths: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            binaries: Vec::new(),
            search_dirs: Vec::new(),
            trace_paths: true,
        }
    }
}

/// A binary of the trace: its mapping path and build id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModuleKey {
    /// The mapping's name (its path when recorded).
    pub path: String,
    /// The raw build id (empty: none).
    pub build_id: Vec<u8>,
}

/// What became of one binary of the trace.
#[derive(Clone, Debug)]
pub struct ModuleReport {
    /// The binary.
    pub key: ModuleKey,
    /// Distinct addresses the trace has in it.
    pub addresses: usize,
    /// Addresses resolved to at least a function name.
    pub symbolized: usize,
    /// The file the symbols came from.
    pub file: Option<PathBuf>,
    /// Why not all of it was symbolized, if something went wrong.
    pub problem: Option<Problem>,
}

/// Why a binary was not symbolized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Not a file (JIT code, `[vdso]`, frames in no mapping).
    NoFile,
    /// No file with this build id was found (missing, or replaced by another build).
    Missing,
    /// The mapping has no build id, and no file the user named matches its name.
    NoBuildId,
    /// The file was found but could not be read or parsed.
    Unreadable(String),
}

impl fmt::Display for ModuleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key.path)?;
        if !self.key.build_id.is_empty() {
            write!(f, " (build id {})", hex(&self.key.build_id))?;
        }
        match &self.problem {
            None => write!(
                f,
                ": {}/{} addresses symbolized",
                self.symbolized, self.addresses
            ),
            Some(Problem::NoFile) => write!(f, ": no file (JIT code or no mapping), skipped"),
            Some(Problem::Missing) => write!(
                f,
                ": MISSING, {} addresses left unsymbolized (name it with --binary or --search-dir)",
                self.addresses
            ),
            Some(Problem::NoBuildId) => write!(
                f,
                ": no build id to match a file by; name the binary with --binary ({} addresses left)",
                self.addresses
            ),
            Some(Problem::Unreadable(e)) => write!(
                f,
                ": {} unreadable ({e}), {} addresses left",
                self.file
                    .as_deref()
                    .map_or_else(String::new, |p| p.display().to_string()),
                self.addresses
            ),
        }
    }
}

/// The result of [`symbolize`].
#[derive(Debug, Default)]
pub struct Symbolized {
    /// `ModuleSymbols` packets as `Trace.packet` records: append them to the trace.
    pub packets: Vec<u8>,
    /// One report per binary of the trace, in path order.
    pub modules: Vec<ModuleReport>,
}

impl Symbolized {
    /// Binaries that were not found.
    pub fn missing(&self) -> impl Iterator<Item = &ModuleReport> {
        self.modules
            .iter()
            .filter(|m| matches!(m.problem, Some(Problem::Missing | Problem::NoBuildId)))
    }
}

/// A trace that could not be read.
#[derive(Debug)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Symbolizes the frames of `trace` (see the crate docs).
pub fn symbolize(trace: &[u8], opts: &Options) -> Result<Symbolized, Error> {
    let modules = collect_frames(trace)?;
    let mut out = Symbolized::default();
    let mut buf = HeapBuffered::new();
    let mut candidates = Candidates::new(opts);
    for (key, addresses) in modules {
        let mut report = ModuleReport {
            addresses: addresses.len(),
            symbolized: 0,
            file: None,
            problem: None,
            key,
        };
        // `[vdso]`, `[unknown]` (the trace processor's names put a '/' before them).
        let pseudo = Path::new(&report.key.path)
            .file_name()
            .is_none_or(|n| n.to_string_lossy().starts_with('['));
        if !report.key.path.starts_with('/') || pseudo {
            report.problem = Some(Problem::NoFile);
            out.modules.push(report);
            continue;
        }
        let file = match candidates.find(&report.key) {
            Ok(f) => f,
            Err(p) => {
                report.problem = Some(p);
                out.modules.push(report);
                continue;
            }
        };
        report.file = Some(file.clone());
        let resolved = std::panic::catch_unwind(|| resolve(&file, &addresses))
            .unwrap_or_else(|_| Err("the DWARF reader failed".to_owned()));
        match resolved {
            Ok(symbols) => {
                report.symbolized = symbols.len();
                write_packets(&mut buf, &report.key, &symbols);
            }
            Err(e) => report.problem = Some(Problem::Unreadable(e)),
        }
        out.modules.push(report);
    }
    out.packets = buf
        .serialize()
        .map_err(|e| Error(format!("encoding the symbols: {e:?}")))?;
    Ok(out)
}

/// What one packet sequence has interned so far ([`collect_frames`]).
#[derive(Default)]
struct Seq {
    paths: HashMap<u64, Vec<u8>>,
    build_ids: HashMap<u64, Vec<u8>>,
    mappings: HashMap<u64, ModuleKey>,
    /// A heap profile dump's own interning (`ProfilePacket`), until its last packet.
    profile_strings: HashMap<u64, Vec<u8>>,
    profile_mappings: HashMap<u64, ModuleKey>,
}

/// Every binary the trace's frames are in, with the relative pcs of its not yet symbolized
/// frames.
pub fn collect_frames(trace: &[u8]) -> Result<BTreeMap<ModuleKey, BTreeSet<u64>>, Error> {
    let view = TraceView::decode(trace).map_err(|e| Error(format!("not a trace: {e:?}")))?;
    let mut seqs: HashMap<u32, Seq> = HashMap::new();
    let mut out: BTreeMap<ModuleKey, BTreeSet<u64>> = BTreeMap::new();
    for p in view.packet() {
        let Ok(p) = p else {
            continue; // a malformed packet: the processor skips it too
        };
        let seq = seqs.entry(p.trusted_packet_sequence_id()).or_default();
        if p.incremental_state_cleared() || p.sequence_flags() & SEQ_INCREMENTAL_STATE_CLEARED != 0
        {
            *seq = Seq::default();
        }
        if p.has_profile_packet() {
            if let Ok(pp) = p.profile_packet() {
                profile_frames(seq, &pp, &mut out);
            }
        }
        if !p.has_interned_data() {
            continue;
        }
        let Ok(d) = p.interned_data() else {
            continue;
        };
        for s in d.mapping_paths().flatten() {
            seq.paths.insert(s.iid(), s.str().to_vec());
        }
        for s in d.build_ids().flatten() {
            seq.build_ids.insert(s.iid(), s.str().to_vec());
        }
        for m in d.mappings().flatten() {
            // As the trace processor names it (path components joined by '/').
            let mut name = Vec::new();
            for id in m.path_string_ids().flatten() {
                match seq.paths.get(&id) {
                    Some(s) => {
                        name.push(b'/');
                        name.extend_from_slice(s);
                    }
                    None => break,
                }
            }
            if name.starts_with(b"//") {
                name.remove(0);
            }
            let build_id = seq
                .build_ids
                .get(&m.build_id())
                .cloned()
                .unwrap_or_default();
            seq.mappings.insert(
                m.iid(),
                ModuleKey {
                    path: String::from_utf8_lossy(&name).into_owned(),
                    build_id,
                },
            );
        }
        for f in d.frames().flatten() {
            if f.function_name_id() != 0 || f.mapping_id() == 0 {
                continue;
            }
            if let Some(key) = seq.mappings.get(&f.mapping_id()) {
                out.entry(key.clone()).or_default().insert(f.rel_pc());
            }
        }
    }
    Ok(out)
}

/// The frames of a heap profile dump (heapprofd's format: strings, mappings and frames inside
/// the `ProfilePacket`, forgotten after the dump's last packet).
fn profile_frames(
    seq: &mut Seq,
    pp: &tachyon_protos::ProfilePacketView<'_>,
    out: &mut BTreeMap<ModuleKey, BTreeSet<u64>>,
) {
    for s in pp.strings().flatten() {
        seq.profile_strings.insert(s.iid(), s.str().to_vec());
    }
    for m in pp.mappings().flatten() {
        let mut name = Vec::new();
        for id in m.path_string_ids().flatten() {
            match seq.profile_strings.get(&id) {
                Some(s) => {
                    name.push(b'/');
                    name.extend_from_slice(s);
                }
                None => break,
            }
        }
        let build_id = seq
            .profile_strings
            .get(&m.build_id())
            .cloned()
            .unwrap_or_default();
        seq.profile_mappings.insert(
            m.iid(),
            ModuleKey {
                path: String::from_utf8_lossy(&name).into_owned(),
                build_id,
            },
        );
    }
    for f in pp.frames().flatten() {
        let named = seq
            .profile_strings
            .get(&f.function_name_id())
            .is_some_and(|n| !n.is_empty());
        if named {
            continue;
        }
        if let Some(key) = seq.profile_mappings.get(&f.mapping_id()) {
            out.entry(key.clone()).or_default().insert(f.rel_pc());
        }
    }
    if !pp.continued() {
        seq.profile_strings.clear();
        seq.profile_mappings.clear();
    }
}

/// Finds binaries for mappings, as the crate docs say.
struct Candidates<'a> {
    opts: &'a Options,
    /// Build ids of the files the user named (read once).
    named: Vec<(PathBuf, Option<Vec<u8>>)>,
}

impl<'a> Candidates<'a> {
    fn new(opts: &'a Options) -> Self {
        let named = opts
            .binaries
            .iter()
            .map(|p| (p.clone(), elf::build_id_of(p).ok().flatten()))
            .collect();
        Candidates { opts, named }
    }

    fn find(&mut self, key: &ModuleKey) -> Result<PathBuf, Problem> {
        let file_name = Path::new(&key.path).file_name();
        if key.build_id.is_empty() {
            // Only a file the user named, by its name.
            return self
                .named
                .iter()
                .find(|(p, _)| p.file_name() == file_name)
                .map(|(p, _)| p.clone())
                .ok_or(Problem::NoBuildId);
        }
        if let Some((p, _)) = self
            .named
            .iter()
            .find(|(_, id)| id.as_deref() == Some(&key.build_id[..]))
        {
            return Ok(p.clone());
        }
        let hex_id = hex(&key.build_id);
        for dir in &self.opts.search_dirs {
            let mut paths = Vec::new();
            if let Some(name) = file_name {
                paths.push(dir.join(name));
            }
            if hex_id.len() > 2 {
                paths.push(
                    dir.join(".build-id")
                        .join(&hex_id[..2])
                        .join(format!("{}.debug", &hex_id[2..])),
                );
            }
            for p in paths {
                if elf::build_id_of(&p).ok().flatten().as_deref() == Some(&key.build_id[..]) {
                    return Ok(p);
                }
            }
        }
        if self.opts.trace_paths {
            let p = PathBuf::from(&key.path);
            if p.is_absolute()
                && elf::build_id_of(&p).ok().flatten().as_deref() == Some(&key.build_id[..])
            {
                return Ok(p);
            }
        }
        Err(Problem::Missing)
    }
}

/// One address's lines: innermost function first (the inlined ones), the function the code
/// belongs to last, as Perfetto's symbolizer writes them.
type Lines = Vec<(String, Option<String>, Option<u32>)>;

/// Resolves `addresses` (ELF virtual addresses) in `file`.
fn resolve(file: &Path, addresses: &BTreeSet<u64>) -> Result<Vec<(u64, Lines)>, String> {
    let loader = addr2line::Loader::new(file).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for &addr in addresses {
        let mut lines: Lines = Vec::new();
        if let Ok(mut frames) = loader.find_frames(addr) {
            // Bounded: corrupt DWARF cannot make an endless inline chain.
            for _ in 0..256 {
                let Ok(Some(frame)) = frames.next() else {
                    break;
                };
                let Some(name) = frame
                    .function
                    .as_ref()
                    .and_then(|f| f.raw_name().ok())
                    .map(|n| demangle(&n))
                else {
                    continue;
                };
                let (file, line) = match &frame.location {
                    Some(l) => (l.file.map(str::to_owned), l.line),
                    None => (None, None),
                };
                lines.push((name, file, line));
            }
        }
        if lines.is_empty() {
            if let Some(name) = loader.find_symbol(addr) {
                lines.push((demangle(name), None, None));
            }
        }
        if !lines.is_empty() {
            out.push((addr, lines));
        }
    }
    Ok(out)
}

/// A Rust symbol demangled without its hash; anything else as it is.
pub fn demangle(name: &str) -> String {
    match rustc_demangle::try_demangle(name) {
        Ok(d) => format!("{d:#}"),
        Err(_) => name.to_owned(),
    }
}

fn write_packets(buf: &mut HeapBuffered, key: &ModuleKey, symbols: &[(u64, Lines)]) {
    let mut trace: Trace<'_> = buf.root();
    for chunk in symbols.chunks(ADDRESSES_PER_PACKET) {
        let mut p = trace.add_packet();
        let mut m = p.set_module_symbols();
        m.set_path(&key.path);
        if !key.build_id.is_empty() {
            m.set_build_id(&key.build_id);
        }
        for (addr, lines) in chunk {
            let mut a = m.add_address_symbols();
            a.set_address(*addr);
            for (name, file, line) in lines {
                let mut l = a.add_lines();
                l.set_function_name(name);
                if let Some(file) = file {
                    l.set_source_file_name(file);
                }
                if let Some(line) = line {
                    l.set_line_number(*line);
                }
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads a trace file, symbolizes it and writes it with the symbols appended to `out`.
pub fn symbolize_file(input: &Path, output: &Path, opts: &Options) -> Result<Symbolized, Error> {
    let mut trace = Vec::new();
    File::open(input)
        .and_then(|mut f| f.read_to_end(&mut trace))
        .map_err(|e| Error(format!("{}: {e}", input.display())))?;
    if trace.starts_with(&[0x1f, 0x8b]) {
        return Err(Error(format!(
            "{}: gzip-compressed; decompress it first (gunzip)",
            input.display()
        )));
    }
    let out = symbolize(&trace, opts)?;
    trace.extend_from_slice(&out.packets);
    std::fs::write(output, &trace).map_err(|e| Error(format!("{}: {e}", output.display())))?;
    Ok(out)
}

/// Appends the symbols of the trace in `path` to it, in place (the SDK's session-end pass).
pub fn symbolize_in_place(path: &Path, opts: &Options) -> Result<Symbolized, Error> {
    let mut trace = Vec::new();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .map_err(|e| Error(format!("{}: {e}", path.display())))?;
    f.read_to_end(&mut trace)
        .map_err(|e| Error(format!("{}: {e}", path.display())))?;
    let out = symbolize(&trace, opts)?;
    f.seek(SeekFrom::End(0))
        .and_then(|_| std::io::Write::write_all(&mut f, &out.packets))
        .map_err(|e| Error(format!("{}: {e}", path.display())))?;
    Ok(out)
}
