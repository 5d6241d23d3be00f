//! Call stacks recorded by the SDK, symbolized at the end of the session (the SDK's feature
//! `symbolize`) and offline, imported by Tachyon's processor: the frames name the functions
//! and lines this test called, the inlined one included; both ways give the same symbols; a
//! missing binary is reported and the rest symbolized; hostile mapping paths read nothing.

use std::sync::Mutex;

use tachyon_processor::{TraceProcessor, Value};
use tachyon_symbolize::{symbolize, Options, Problem};

/// One session at a time in this process.
static SESSION: Mutex<()> = Mutex::new(());

#[inline(always)]
fn inlined_leaf() -> u32 {
    let line = line!() + 1;
    let _zone = tachyon::zone!("known", callstack: 8);
    std::hint::black_box(line)
}

#[inline(never)]
fn caller() -> (u32, u32) {
    let line = line!() + 1;
    let leaf = inlined_leaf();
    (leaf, line)
}

/// Records `caller()` with the session-end symbolization on or off; the trace and the lines.
fn record(symbolize_at_end: bool) -> (Vec<u8>, u32, u32) {
    let _g = SESSION.lock().unwrap_or_else(|e| e.into_inner());
    tachyon::start(tachyon::Config {
        symbolize: symbolize_at_end,
        ..tachyon::Config::in_memory()
    })
    .unwrap();
    let (leaf, call) = caller();
    let report = tachyon::shutdown().unwrap().unwrap();
    (report.trace, leaf, call)
}

fn text(v: &Value) -> String {
    match v {
        Value::Text(s) => s.clone(),
        Value::Integer(i) => i.to_string(),
        _ => String::new(),
    }
}

/// The symbol lines of the leaf frame of the "known" zone's stack, innermost first.
fn leaf_symbols(trace: &[u8]) -> Vec<(String, String, String)> {
    let tp = TraceProcessor::from_bytes(trace, &Default::default()).unwrap();
    let r = tp
        .query(
            "SELECT s.name, s.source_file, s.line_number \
             FROM __intrinsic_track_event_callstacks e JOIN slice USING (slice_id) \
             JOIN stack_profile_callsite c ON c.id = e.callsite_id \
             JOIN stack_profile_frame f ON f.id = c.frame_id \
             JOIN stack_profile_symbol s ON s.symbol_set_id = f.symbol_set_id \
             WHERE slice.name = 'known' ORDER BY s.id",
        )
        .unwrap();
    r.rows
        .iter()
        .map(|r| (text(&r[0]), text(&r[1]), text(&r[2])))
        .collect()
}

#[test]
fn frames_name_the_functions_and_lines_called_including_the_inlined_one() {
    let (trace, leaf_line, call_line) = record(true);
    let lines = leaf_symbols(&trace);
    assert!(lines.len() >= 2, "inlined frame and its caller: {lines:?}");
    assert!(lines[0].0.ends_with("inlined_leaf"), "{lines:?}");
    assert!(lines[0].1.ends_with("end_to_end.rs"), "{lines:?}");
    assert_eq!(lines[0].2, leaf_line.to_string(), "{lines:?}");
    assert!(lines[1].0.ends_with("caller"), "{lines:?}");
    assert_eq!(lines[1].2, call_line.to_string(), "{lines:?}");
    // Rust names are demangled, without the hash.
    assert!(!lines[1].0.contains("17h"), "{lines:?}");

    // The callsite is in stack_profile_callsite with its whole chain (8 frames asked).
    let tp = TraceProcessor::from_bytes(&trace, &Default::default()).unwrap();
    let r = tp
        .query(
            "SELECT c.depth FROM __intrinsic_track_event_callstacks e \
             JOIN stack_profile_callsite c ON c.id = e.callsite_id",
        )
        .unwrap();
    assert_eq!(r.rows.len(), 1);
    assert_eq!(r.rows[0][0], Value::Integer(7), "8 frames: depth 0..=7");
}

#[test]
fn offline_symbolization_matches_the_session_end_one() {
    let (raw, ..) = record(false);
    assert!(leaf_symbols(&raw).is_empty(), "recorded without symbols");
    let exe = std::env::current_exe().unwrap();
    // Offline, only from the binary the user names (the trace's own paths not read).
    let out = symbolize(
        &raw,
        &Options {
            binaries: vec![exe.clone()],
            search_dirs: Vec::new(),
            trace_paths: false,
        },
    )
    .unwrap();
    let exe_report = out
        .modules
        .iter()
        .find(|m| m.file.as_deref() == Some(exe.as_path()))
        .expect("the test binary was used");
    assert_eq!(exe_report.problem, None);
    assert_eq!(exe_report.symbolized, exe_report.addresses);
    // The other binaries (libc, ... if the 8 frames reach them) were not named: missing.
    for m in out.modules.iter().filter(|m| m.file.is_none()) {
        assert_eq!(m.problem, Some(Problem::Missing), "{m}");
    }
    // Named nothing, and the trace's paths off: everything missing, nothing symbolized.
    let nothing = Options {
        trace_paths: false,
        ..Options::default()
    };
    let none = symbolize(&raw, &nothing).unwrap();
    assert!(none.packets.is_empty());
    assert!(none.missing().count() >= 1);
    assert!(none.modules.iter().all(|m| m.symbolized == 0));
    let mut offline = raw.clone();
    offline.extend_from_slice(&out.packets);

    // In-process: the same session's way (trace paths, by build id).
    let inproc = symbolize(&raw, &Options::default()).unwrap();
    let mut in_process = raw.clone();
    in_process.extend_from_slice(&inproc.packets);
    assert_eq!(leaf_symbols(&offline), leaf_symbols(&in_process));
    assert!(!leaf_symbols(&offline).is_empty());
}

#[test]
fn missing_replaced_and_hostile_binaries_are_reported_and_not_used() {
    let (raw, ..) = record(false);
    let dir = std::env::temp_dir().join(format!("tachyon-sym-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A "replaced" binary: same name, other content (no build id match).
    let exe = std::env::current_exe().unwrap();
    let fake = dir.join(exe.file_name().unwrap());
    std::fs::write(&fake, b"\x7fELF not really").unwrap();
    // A binary whose DWARF is cut off: its build id (at the front) still matches.
    let bytes = std::fs::read(&exe).unwrap();
    let truncated = dir.join("truncated");
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let out = symbolize(
        &raw,
        &Options {
            binaries: vec![truncated.clone(), "/dev/zero".into()],
            search_dirs: vec![dir.clone()],
            trace_paths: false,
        },
    )
    .unwrap();
    let m = out
        .modules
        .iter()
        .find(|m| m.key.path == exe.to_str().unwrap())
        .unwrap();
    // Either the loader refuses the cut file, or it resolves what it can: never a panic.
    assert!(
        matches!(m.problem, Some(Problem::Unreadable(_)) | None),
        "{m}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // A hostile trace: mappings that name a device, a FIFO (opening it would block), a text
    // file, a relative path, with build ids. None is used: only a regular ELF file with the
    // mapping's build id would be, and only its header and notes are read to check that.
    let dir = std::env::temp_dir().join(format!("tachyon-sym-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let have_fifo = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    let fifo_path = fifo.to_str().unwrap().to_owned();
    let mut paths = vec!["/dev/zero", "/etc/passwd", "relative/path", "[vdso]"];
    if have_fifo {
        paths.push(&fifo_path);
    }
    let hostile = hostile_trace(&paths);
    let out = symbolize(&hostile, &Options::default()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.packets.is_empty());
    for m in &out.modules {
        let expected = if m.key.path == "/[vdso]" {
            Problem::NoFile
        } else {
            Problem::Missing
        };
        assert_eq!(m.problem, Some(expected), "{m}");
        assert_eq!(m.file, None, "{m}");
    }
    assert_eq!(out.modules.len(), paths.len());
}

/// A trace whose mappings name `paths` (with a made-up build id), one frame each.
fn hostile_trace(paths: &[&str]) -> Vec<u8> {
    use protozero::HeapBuffered;
    use tachyon_protos::Trace;
    let mut buf = HeapBuffered::new();
    {
        let mut trace: Trace<'_> = buf.root();
        let mut p = trace.add_packet();
        p.set_trusted_packet_sequence_id(1);
        let mut d = p.set_interned_data();
        {
            let mut b = d.add_build_ids();
            b.set_iid(1);
            b.set_str(&[0xab; 20]);
        }
        for (i, path) in paths.iter().enumerate() {
            let i = i as u64 + 1;
            {
                let mut s = d.add_mapping_paths();
                s.set_iid(i);
                s.set_str(path.as_bytes());
            }
            {
                let mut m = d.add_mappings();
                m.set_iid(i);
                m.set_build_id(1);
                m.set_start(0x1000 * i);
                m.set_end(0x1000 * i + 0x1000);
                m.add_path_string_ids(i);
            }
            let mut f = d.add_frames();
            f.set_iid(i);
            f.set_mapping_id(i);
            f.set_rel_pc(0x10);
        }
    }
    buf.serialize().unwrap()
}
