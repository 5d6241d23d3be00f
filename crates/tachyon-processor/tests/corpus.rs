//! The `testdata/` corpus: each case directory holds `trace.textproto` (a Perfetto `Trace` in
//! protobuf text format, as Perfetto's diff tests write them), optionally `options` (one word
//! per line: `gzip` compresses the file, `compress_packets` wraps every packet into one
//! `compressed_packets` packet (zlib, or gzip with `compress_packets=gzip`), `truncate` appends
//! a packet cut short, `sort=windowed` imports with windowed sorting; any other word fails the
//! test), and pairs of `NAME.sql` + `NAME.csv`: the query and its expected output (Perfetto's
//! diff-test CSV: quoted strings and header, `"[NULL]"` for NULL, reals with six decimals).
//!
//! Run with `TACHYON_BLESS=1` to (re)write the `.csv` files from the current output, and with
//! `TACHYON_DUMP_TRACES=DIR` to also write each case's binary trace into `DIR` (fuzz seeds).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use prost_reflect::{DescriptorPool, DynamicMessage};
use protozero::HeapBuffered;
use tachyon_processor::{Options, SortMode, TraceProcessor, Value};
use tachyon_protos::Trace;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn trace_descriptor() -> prost_reflect::MessageDescriptor {
    let protos = repo_root().join("crates/tachyon-protos/protos");
    let fds = protox::compile([protos.join("perfetto/trace/trace.proto")], [&protos])
        .expect("compile Perfetto's trace schema");
    DescriptorPool::from_file_descriptor_set(fds)
        .expect("descriptor pool")
        .get_message_by_name("perfetto.protos.Trace")
        .expect("Trace message")
}

fn build_trace(dir: &Path, desc: &prost_reflect::MessageDescriptor, options: &[String]) -> Vec<u8> {
    let text = std::fs::read_to_string(dir.join("trace.textproto")).expect("trace.textproto");
    let msg = DynamicMessage::parse_text_format(desc.clone(), &text)
        .unwrap_or_else(|e| panic!("{}: bad text proto: {e}", dir.display()));
    let mut bytes = prost::Message::encode_to_vec(&msg);
    for opt in options {
        match opt.as_str() {
            "compress_packets" | "compress_packets=gzip" => {
                let compressed = if opt == "compress_packets" {
                    let level = flate2::Compression::default();
                    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), level);
                    z.write_all(&bytes).unwrap();
                    z.finish().unwrap()
                } else {
                    gzip(&bytes)
                };
                let mut buf = HeapBuffered::new();
                {
                    let mut trace: Trace<'_> = buf.root();
                    trace.add_packet().set_compressed_packets(&compressed);
                }
                bytes = buf.serialize().expect("trace fits");
            }
            "truncate" => bytes.extend_from_slice(&[0x0a, 0x10, 0x08]),
            "gzip" => bytes = gzip(&bytes),
            "sort=windowed" => {} // Read by the caller.
            other => panic!("{}: unknown option {other:?}", dir.display()),
        }
    }
    bytes
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(bytes).unwrap();
    z.finish().unwrap()
}

/// Perfetto's diff-test CSV rendering.
fn to_csv(columns: &[String], rows: &[Vec<Value>]) -> String {
    let mut out = String::new();
    let header: Vec<String> = columns.iter().map(|c| format!("\"{c}\"")).collect();
    writeln!(out, "{}", header.join(",")).unwrap();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .map(|v| match v {
                Value::Null => "\"[NULL]\"".to_owned(),
                Value::Integer(i) => i.to_string(),
                Value::Real(r) => format!("{r:.6}"),
                Value::Text(s) => format!("\"{}\"", s.replace('"', "\"\"")),
                Value::Blob(b) => format!("\"<{} bytes>\"", b.len()),
            })
            .collect();
        writeln!(out, "{}", cells.join(",")).unwrap();
    }
    out
}

#[test]
fn corpus() {
    let bless = std::env::var_os("TACHYON_BLESS").is_some();
    let desc = trace_descriptor();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(repo_root().join("testdata"))
        .expect("testdata/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("trace.textproto").exists())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no corpus cases found");
    let mut failures = Vec::new();
    let mut checked = 0;
    for dir in &cases {
        let options: Vec<String> = std::fs::read_to_string(dir.join("options"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let sort = if options.iter().any(|o| o == "sort=windowed") {
            SortMode::Windowed
        } else {
            SortMode::Full
        };
        let bytes = build_trace(dir, &desc, &options);
        // Seeds for the `import` fuzz target: `TACHYON_DUMP_TRACES=fuzz/corpus/import`.
        if let Some(out) = std::env::var_os("TACHYON_DUMP_TRACES") {
            let name = dir.file_name().unwrap();
            std::fs::create_dir_all(&out).unwrap();
            std::fs::write(Path::new(&out).join(name), &bytes).unwrap();
        }
        let tp = TraceProcessor::from_bytes(&bytes, &Options::with_sort(sort))
            .unwrap_or_else(|e| panic!("{}: import failed: {e}", dir.display()));
        // The same trace read from a file a few bytes at a time: packets cut by the window's
        // end are read on, and every query gives the same rows.
        let file = std::env::temp_dir().join(format!(
            "tachyon-corpus-{}-{}.pftrace",
            std::process::id(),
            dir.file_name().unwrap().to_string_lossy()
        ));
        std::fs::write(&file, &bytes).unwrap();
        let streamed =
            TraceProcessor::open_windowed(&file, &Options::with_sort(sort), 7, &mut |_| {})
                .unwrap_or_else(|e| panic!("{}: streamed import failed: {e}", dir.display()));
        std::fs::remove_file(&file).unwrap();
        let mut queries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "sql"))
            .collect();
        queries.sort();
        for q in queries {
            let sql = std::fs::read_to_string(&q).unwrap();
            let result = tp
                .query(&sql)
                .unwrap_or_else(|e| panic!("{}: {e}", q.display()));
            let actual = to_csv(&result.columns, &result.rows);
            let from_file = streamed.query(&sql).unwrap();
            assert_eq!(
                to_csv(&from_file.columns, &from_file.rows),
                actual,
                "{}: read from the file in windows",
                q.display()
            );
            let expected_path = q.with_extension("csv");
            if bless {
                std::fs::write(&expected_path, &actual).unwrap();
                continue;
            }
            let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
            checked += 1;
            if expected.trim_end() != actual.trim_end() {
                failures.push(format!(
                    "{}\n--- expected\n{expected}--- actual\n{actual}",
                    q.display()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} corpus queries differ (TACHYON_BLESS=1 to accept):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(bless || checked > 0);
}
