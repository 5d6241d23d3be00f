//! `cargo xtask difftests PERFETTO_DIR` (which runs this binary): runs Perfetto's trace processor
//! diff tests against Tachyon's processor (or, with `--oracle`, against Perfetto's own
//! `trace_processor_shell`, to check the harness itself). See `docs/difftests.md`.
//!
//! The tests are Perfetto's, not ours, and stay out of this repository: the runner reads them
//! from a checkout of Perfetto (`PERFETTO_DIR`), as Perfetto's own runner does. Each suite's
//! `tests.py` declares `DiffTestBlueprint`s: a trace (`TextProto(...)` inline, `Path(...)` to a
//! `.textproto` or binary file beside it, `DataPath(...)` in Perfetto's test-data bucket), a
//! query (inline, or `Path(...)` to a `.sql` file) and the expected output (`Csv(...)` or
//! `Path(...)` to an `.out` file). The runner parses those declarations (a small reader for the
//! Python literals they use), turns text protos into binary traces with prost-reflect over
//! Perfetto's full schema, compiled at run time by protox from `PERFETTO_DIR/protos` (so our
//! subset of the schema limits nothing), runs the query, prints the result as
//! trace_processor_shell does (quoted header, quoted strings, `[NULL]`, reals with `%f`), and
//! compares as Perfetto's runner does (leading newlines dropped, each line trimmed).
//!
//! Tests that need something outside Tachyon's scope are listed with the reason in
//! `crates/tachyon-difftests/exclusions.txt`: they still run and are reported as `EXCL` (or `XPASS` if
//! they pass anyway), never skipped silently. The exit status is non-zero when a test that is
//! not excluded fails.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};

mod compare;
use tachyon_processor::{Options, TraceProcessor, Value};

/// The suites run when none is named: the TrackEvent suite and the ones that touch what Tachyon
/// writes and reads (data-loss stats, debug annotations, system probes, process tracking, heap
/// profiles, log messages, counter tracks).
const DEFAULT_SUITES: &[&str] = &[
    "parser/track_event",
    "parser/parsing/tests_traced_stats.py",
    "parser/parsing/tests_debug_annotation.py",
    "parser/parsing/tests_sys_stats.py",
    "parser/process_tracking",
    "parser/profiling/tests_heap_profiling.py",
    "parser/chrome",
    "stdlib/counters",
];

const USAGE: &str = "usage: cargo xtask difftests PERFETTO_DIR [--suite DIR]... \
[--filter SUBSTRING] [--oracle TRACE_PROCESSOR_SHELL] [--verbose]
       cargo xtask difftests --compare TRACE [--compare TRACE]... --oracle TRACE_PROCESSOR_SHELL \
[--verbose]

  PERFETTO_DIR   a checkout of Perfetto holding test/trace_processor and protos, e.g.
                 mkdir -p /tmp/perfetto && git -C PERFETTO_GIT_DIR archive HEAD \\
                   test/trace_processor protos | tar -x -C /tmp/perfetto
  --suite S      a suite under test/trace_processor/diff_tests: a directory (its tests.py)
                 or a tests_*.py file; repeatable. Default: parser/track_event and the suites
                 that touch what Tachyon writes and reads (data-loss stats, debug annotations,
                 sys stats, process tracking, heap profiles, log messages, counter tracks)
  --filter S     only tests whose name contains S
  --oracle PATH  run the queries with Perfetto's trace_processor_shell instead (checks the
                 harness: it should pass everything)
  --verbose      print expected and actual output of failing tests
  --dump DIR     also write each test's binary trace to DIR/TEST.pb (to compare tables with
                 trace_processor_shell by hand)
  --compare T    instead of the diff tests: query the tables users read (slice, thread,
                 process, track, counter, args, android_logs, heap_profile_allocation,
                 stack_profile_*, samples, stats) of trace T with Tachyon and with the
                 --oracle, and print which differ (exit status 1 if any)";

/// A Python value in a blueprint: a string, a call `Name(args...)`, or a list.
#[derive(Clone, Debug)]
enum Py {
    Str(String),
    Call(String, Vec<(Option<String>, Py)>),
    /// A list (its items are read but not kept: no blueprint field we use is a list).
    List,
    /// Anything else (a number, a dict, a bare name).
    Other,
}

impl Py {
    fn call(&self) -> Option<(&str, Option<&str>)> {
        match self {
            Py::Call(name, args) => Some((
                name,
                args.first().and_then(|(_, v)| match v {
                    Py::Str(s) => Some(s.as_str()),
                    _ => None,
                }),
            )),
            _ => None,
        }
    }
}

/// A reader for the subset of Python `tests.py` files use in blueprints.
struct Reader<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() {
            match self.s[self.i] {
                b' ' | b'\t' | b'\n' | b'\r' | b'\\' => self.i += 1,
                b'#' => {
                    while self.i < self.s.len() && self.s[self.i] != b'\n' {
                        self.i += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ident(&mut self) -> String {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
        {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }

    /// A string literal (with optional r/f/b prefix, single or triple quotes); adjacent
    /// literals are concatenated, as Python does.
    fn string(&mut self) -> Result<String, String> {
        let mut out = String::new();
        loop {
            let mut raw = false;
            while let Some(c @ (b'r' | b'R' | b'f' | b'F' | b'b' | b'B' | b'u' | b'U')) =
                self.peek()
            {
                raw |= c == b'r' || c == b'R';
                self.i += 1;
            }
            let q = self.peek().ok_or("end of file in a string")?;
            let triple = self.s[self.i..].starts_with(&[q, q, q]);
            self.i += if triple { 3 } else { 1 };
            loop {
                if self.i >= self.s.len() {
                    return Err("unterminated string".into());
                }
                if triple && self.s[self.i..].starts_with(&[q, q, q]) {
                    self.i += 3;
                    break;
                }
                let c = self.s[self.i];
                if !triple && c == q {
                    self.i += 1;
                    break;
                }
                if c == b'\\' && !raw {
                    let n = self.s.get(self.i + 1).copied().unwrap_or(b'\\');
                    self.i += 2;
                    match n {
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        b'\n' => {}
                        other => out.push(other as char),
                    }
                    continue;
                }
                // Copy one UTF-8 character.
                let len = match c {
                    0..=0x7f => 1,
                    0xc0..=0xdf => 2,
                    0xe0..=0xef => 3,
                    _ => 4,
                };
                let end = (self.i + len).min(self.s.len());
                out.push_str(&String::from_utf8_lossy(&self.s[self.i..end]));
                self.i = end;
            }
            let save = self.i;
            self.skip_ws();
            let next_is_string = match self.peek() {
                Some(b'"' | b'\'') => true,
                Some(b'r' | b'R' | b'f' | b'F') => {
                    matches!(self.s.get(self.i + 1), Some(b'"' | b'\''))
                }
                _ => false,
            };
            if !next_is_string {
                self.i = save;
                return Ok(out);
            }
        }
    }

    fn value(&mut self) -> Result<Py, String> {
        self.skip_ws();
        match self.peek() {
            Some(b'"' | b'\'') => return Ok(Py::Str(self.string()?)),
            Some(b'r' | b'R' | b'f' | b'F' | b'b' | b'B' | b'u' | b'U')
                if matches!(self.s.get(self.i + 1), Some(b'"' | b'\'')) =>
            {
                return Ok(Py::Str(self.string()?))
            }
            Some(b'[') => {
                self.i += 1;
                loop {
                    self.skip_ws();
                    if self.peek() == Some(b']') {
                        self.i += 1;
                        return Ok(Py::List);
                    }
                    self.value()?;
                    self.skip_ws();
                    if self.peek() == Some(b',') {
                        self.i += 1;
                    }
                }
            }
            _ => {}
        }
        let name = self.ident();
        if name.is_empty() {
            // Something we do not model (a number, a dict…): skip to the end of the argument.
            let mut depth = 0i32;
            while let Some(c) = self.peek() {
                match c {
                    b'(' | b'[' | b'{' => depth += 1,
                    b')' | b']' | b'}' if depth == 0 => break,
                    b')' | b']' | b'}' => depth -= 1,
                    b',' if depth == 0 => break,
                    _ => {}
                }
                self.i += 1;
            }
            return Ok(Py::Other);
        }
        self.skip_ws();
        if self.peek() != Some(b'(') {
            return Ok(Py::Other);
        }
        self.i += 1;
        let mut args = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() == Some(b')') {
                self.i += 1;
                return Ok(Py::Call(name, args));
            }
            if self.i >= self.s.len() {
                return Err("unterminated call".into());
            }
            // `key=value` or a positional value.
            let save = self.i;
            let key = self.ident();
            self.skip_ws();
            let key = if !key.is_empty()
                && self.peek() == Some(b'=')
                && self.s.get(self.i + 1) != Some(&b'=')
            {
                self.i += 1;
                Some(key)
            } else {
                self.i = save;
                None
            };
            args.push((key, self.value()?));
            self.skip_ws();
            if self.peek() == Some(b',') {
                self.i += 1;
            }
        }
    }
}

/// One test, as declared.
#[derive(Debug)]
struct Blueprint {
    name: String,
    args: BTreeMap<String, Py>,
}

fn parse_tests_py(text: &str) -> Result<Vec<Blueprint>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(pos) = rest.find("def test_") {
        let after = &rest[pos + 4..];
        let name_end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if !after[name_end..].starts_with('(') {
            rest = &after[name_end..];
            continue;
        }
        let name = after[..name_end].to_owned();
        let body_start = after
            .find("DiffTestBlueprint(")
            .ok_or(format!("{name}: no blueprint"))?;
        let next_def = after[1..].find("def test_").map_or(after.len(), |p| p + 1);
        if body_start > next_def {
            rest = &after[next_def..];
            continue;
        }
        let mut r = Reader {
            s: after.as_bytes(),
            i: body_start,
        };
        let Py::Call(_, args) = r.value().map_err(|e| format!("{name}: {e}"))? else {
            return Err(format!("{name}: not a call"));
        };
        out.push(Blueprint {
            name: name.trim_start_matches("test_").to_owned(),
            args: args
                .into_iter()
                .filter_map(|(k, v)| Some((k?, v)))
                .collect(),
        });
        rest = &after[r.i.min(after.len())..];
    }
    Ok(out)
}

/// What a test needs, resolved to files and strings.
struct Case {
    name: String,
    trace: Result<Vec<u8>, String>,
    query: Result<String, String>,
    expected: Result<String, String>,
}

fn resolve(bp: &Blueprint, dir: &Path, perfetto: &Path, desc: &MessageDescriptor) -> Case {
    let trace = (|| {
        if bp.args.contains_key("trace_modifier") {
            return Err("uses a TraceInjector (trace_modifier)".to_owned());
        }
        let trace = bp.args.get("trace").ok_or("no trace")?;
        match trace.call() {
            Some(("TextProto", Some(text))) => text_to_trace(desc, text),
            Some(("Path", Some(p))) => {
                let path = dir.join(p);
                if p.ends_with(".textproto") {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    text_to_trace(desc, &text)
                } else if p.ends_with(".py") {
                    Err(format!("trace generated by a Python script ({p})"))
                } else {
                    std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
                }
            }
            Some(("DataPath", Some(p))) => {
                let path = perfetto.join("test/data").join(p);
                std::fs::read(&path).map_err(|_| {
                    format!("trace in Perfetto's test-data bucket ({p}), not in the checkout")
                })
            }
            _ => Err(format!(
                "trace of a kind the runner does not read: {trace:?}"
            )),
        }
    })();
    let query = match bp.args.get("query") {
        Some(Py::Str(q)) => Ok(q.clone()),
        Some(v) => match v.call() {
            Some(("Path", Some(p))) => std::fs::read_to_string(dir.join(p))
                .map_err(|e| format!("{}: {e}", dir.join(p).display())),
            Some(("Metric", _)) => Err("a metric (v1 metrics are out of scope)".to_owned()),
            _ => Err(format!("query of a kind the runner does not read: {v:?}")),
        },
        None => Err("no query".to_owned()),
    };
    let expected = match bp.args.get("out").and_then(Py::call) {
        Some(("Csv", Some(text))) => Ok(text.to_owned()),
        Some(("Path", Some(p))) => std::fs::read_to_string(dir.join(p))
            .map_err(|e| format!("{}: {e}", dir.join(p).display())),
        other => Err(format!(
            "expected output of a kind the runner does not read: {other:?}"
        )),
    };
    Case {
        name: bp.name.clone(),
        trace,
        query,
        expected,
    }
}

fn text_to_trace(desc: &MessageDescriptor, text: &str) -> Result<Vec<u8>, String> {
    let msg = DynamicMessage::parse_text_format(desc.clone(), text)
        .map_err(|e| format!("text proto: {e}"))?;
    Ok(prost::Message::encode_to_vec(&msg))
}

/// The query output as trace_processor_shell prints it.
fn render(columns: &[String], rows: &[Vec<Value>]) -> String {
    let mut out = String::new();
    let header: Vec<String> = columns.iter().map(|c| format!("\"{c}\"")).collect();
    writeln!(out, "{}", header.join(",")).unwrap();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .map(|v| match v {
                Value::Null => "\"[NULL]\"".to_owned(),
                Value::Integer(i) => i.to_string(),
                Value::Real(r) if r.is_nan() => "nan".to_owned(),
                Value::Real(r) if r.is_infinite() => {
                    if *r > 0.0 { "inf" } else { "-inf" }.to_owned()
                }
                Value::Real(r) => format!("{r:.6}"),
                // The shell does not escape quotes inside strings.
                Value::Text(s) => format!("\"{s}\""),
                Value::Blob(_) => "\"<Blob>\"".to_owned(),
            })
            .collect();
        writeln!(out, "{}", cells.join(",")).unwrap();
    }
    out
}

fn run_tachyon(trace: &[u8], query: &str) -> Result<String, String> {
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        // Perfetto's runner passes --crop-track-events.
        let mut options = Options::default();
        options.crop_track_events = true;
        let tp = TraceProcessor::from_bytes(trace, &options).map_err(|e| format!("import: {e}"))?;
        let r = tp.query(query).map_err(|e| format!("query: {e}"))?;
        Ok(render(&r.columns, &r.rows))
    }));
    outcome.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("PANIC: {msg}"))
    })
}

fn run_oracle(shell: &Path, trace: &[u8], query: &str, tmp: &Path) -> Result<String, String> {
    let t = tmp.join("trace.pb");
    let q = tmp.join("query.sql");
    std::fs::write(&t, trace).map_err(|e| e.to_string())?;
    std::fs::write(&q, query).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(shell)
        .args([
            "--analyze-trace-proto-content",
            "--crop-track-events",
            "--extra-checks",
            "-q",
        ])
        .arg(&q)
        .arg(&t)
        .output()
        .map_err(|e| format!("{}: {e}", shell.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Perfetto's runner's normalization: leading newlines dropped, each line trimmed.
fn normalize(text: &str) -> String {
    let text = text.replace("\r\n", "\n");
    let lines: Vec<&str> = text
        .trim_start_matches('\n')
        .split('\n')
        .map(str::trim)
        .collect();
    lines.join("\n").trim_end().to_owned()
}

/// `suite::test` → reason, from the exclusion list.
fn exclusions() -> Result<BTreeMap<String, String>, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("exclusions.txt");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, reason) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("exclusion without a reason: {line}"))?;
        out.insert(key.to_owned(), reason.trim().to_owned());
    }
    Ok(out)
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("difftests: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<bool, Box<dyn std::error::Error>> {
    let mut perfetto = None;
    let mut suites = Vec::new();
    let mut filter = None;
    let mut oracle = None;
    let mut verbose = false;
    let mut dump = None;
    let mut compare_traces = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--suite" => suites.push(it.next().ok_or(USAGE)?.clone()),
            "--filter" => filter = Some(it.next().ok_or(USAGE)?.clone()),
            "--oracle" => oracle = Some(PathBuf::from(it.next().ok_or(USAGE)?)),
            "--verbose" | "-v" => verbose = true,
            "--dump" => dump = Some(PathBuf::from(it.next().ok_or(USAGE)?)),
            "--compare" => compare_traces.push(PathBuf::from(it.next().ok_or(USAGE)?)),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(true);
            }
            _ if perfetto.is_none() && !a.starts_with('-') => perfetto = Some(PathBuf::from(a)),
            _ => return Err(USAGE.into()),
        }
    }
    if !compare_traces.is_empty() {
        let oracle = oracle.ok_or("--compare needs --oracle TRACE_PROCESSOR_SHELL")?;
        let tmp = std::env::temp_dir().join(format!("tachyon-compare-{}", std::process::id()));
        std::fs::create_dir_all(&tmp)?;
        let mut differing = 0;
        for trace in &compare_traces {
            let results = compare::compare(trace, &oracle, &tmp)?;
            differing += compare::report(trace, &results, verbose);
        }
        let _ = std::fs::remove_dir_all(&tmp);
        println!("\n{differing} tables differ");
        return Ok(differing == 0);
    }
    let perfetto = perfetto.ok_or(USAGE)?;
    if suites.is_empty() {
        suites = DEFAULT_SUITES.iter().map(|s| s.to_string()).collect();
    }
    let protos = perfetto.join("protos");
    // The trace schema, plus the TrackEvent extensions the tests use (test and Chrome ones).
    let files: Vec<PathBuf> = [
        "perfetto/trace/trace.proto",
        "perfetto/trace/test_extensions.proto",
        "third_party/chromium/chrome_track_event.proto",
    ]
    .iter()
    .map(|f| protos.join(f))
    .filter(|f| f.exists())
    .collect();
    let fds = protox::compile(&files, [&perfetto])
        .map_err(|e| format!("compiling {}: {e}", protos.display()))?;
    let desc = DescriptorPool::from_file_descriptor_set(fds)?
        .get_message_by_name("perfetto.protos.Trace")
        .ok_or("perfetto.protos.Trace not in the schema")?;
    let excluded = exclusions()?;
    let tmp = std::env::temp_dir().join(format!("tachyon-difftests-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;

    let (mut pass, mut fail, mut excl, mut xpass) = (0, 0, 0, 0);
    let mut failed = Vec::new();
    for suite in &suites {
        // A suite is a directory (its tests.py) or one of the directory's tests_*.py files.
        let path = perfetto.join("test/trace_processor/diff_tests").join(suite);
        let (dir, file) = if suite.ends_with(".py") {
            let dir = path.parent().ok_or(USAGE)?.to_path_buf();
            (dir, path)
        } else {
            (path.clone(), path.join("tests.py"))
        };
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        for bp in parse_tests_py(&text)? {
            if filter.as_deref().is_some_and(|f| !bp.name.contains(f)) {
                continue;
            }
            let case = resolve(&bp, &dir, &perfetto, &desc);
            let key = format!("{suite}::{}", case.name);
            if let (Some(dir), Ok(trace)) = (&dump, &case.trace) {
                std::fs::create_dir_all(dir)?;
                std::fs::write(dir.join(format!("{}.pb", case.name)), trace)?;
            }
            let outcome = match (&case.trace, &case.query, &case.expected) {
                (Ok(trace), Ok(query), Ok(expected)) => {
                    let actual = match &oracle {
                        Some(shell) => run_oracle(shell, trace, query, &tmp),
                        None => run_tachyon(trace, query),
                    };
                    match actual {
                        Ok(actual) if normalize(&actual) == normalize(expected) => Ok(()),
                        Ok(actual) => Err(format!(
                            "output differs\n--- expected\n{}\n--- actual\n{}",
                            normalize(expected),
                            normalize(&actual)
                        )),
                        Err(e) => Err(e),
                    }
                }
                (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(format!("cannot run: {e}")),
            };
            match (outcome, excluded.get(&key)) {
                (Ok(()), None) => {
                    pass += 1;
                    println!("PASS  {key}");
                }
                (Ok(()), Some(_)) => {
                    xpass += 1;
                    println!("XPASS {key} (excluded, but passes: remove it from the list)");
                }
                (Err(_), Some(reason)) => {
                    excl += 1;
                    println!("EXCL  {key}: {reason}");
                }
                (Err(e), None) => {
                    fail += 1;
                    let first = e.lines().next().unwrap_or_default();
                    println!("FAIL  {key}: {first}");
                    if verbose {
                        println!("{e}\n");
                    }
                    failed.push(key);
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let total = pass + fail + excl + xpass;
    println!(
        "\n{} passed, {fail} failed, {excl} excluded (listed in crates/tachyon-difftests/exclusions.txt), \
         {xpass} excluded but passing; {total} tests{}",
        pass + xpass,
        if oracle.is_some() {
            " (oracle: trace_processor_shell)"
        } else {
            ""
        }
    );
    Ok(fail == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_blueprints() {
        let py = r#"
class T(TestSuite):
  def test_a(self):
    return DiffTestBlueprint(
        trace=TextProto(r"""
        packet { timestamp: 1 }
        """),
        query="""
        SELECT 1;
        """,
        out=Csv("""
        "1"
        1
        """))

  # A comment with def test_ in it.
  def test_b(self):
    return DiffTestBlueprint(
        trace=Path('x.textproto'),
        query=Path('q.sql'),
        trace_modifier=TraceInjector(['a', 'b'], {'machine_id': 1}),
        out=Path('b.out'))
"#;
        let bps = parse_tests_py(py).unwrap();
        assert_eq!(bps.len(), 2);
        assert_eq!(bps[0].name, "a");
        assert!(matches!(&bps[0].args["query"], Py::Str(q) if q.contains("SELECT 1;")));
        assert_eq!(
            bps[0].args["trace"].call(),
            Some((
                "TextProto",
                Some("\n        packet { timestamp: 1 }\n        ")
            ))
        );
        assert_eq!(bps[1].args["out"].call(), Some(("Path", Some("b.out"))));
        assert!(bps[1].args.contains_key("trace_modifier"));
    }

    #[test]
    fn reads_uppercase_string_prefixes() {
        let py =
            "def test_c(self):\n  return DiffTestBlueprint(trace=TextProto(R\"\"\"x\\n\"\"\"), \
                  query=\"SELECT 1\", out=Csv(\"\"\"a\"\"\"))";
        let bps = parse_tests_py(py).unwrap();
        assert_eq!(
            bps[0].args["trace"].call(),
            Some(("TextProto", Some("x\\n")))
        );
    }

    #[test]
    fn renders_and_normalizes_like_perfetto() {
        let out = render(
            &["a".into(), "b".into()],
            &[
                vec![Value::Null, Value::Real(1.5)],
                vec![Value::Text("x".into()), Value::Integer(-3)],
            ],
        );
        assert_eq!(out, "\"a\",\"b\"\n\"[NULL]\",1.500000\n\"x\",-3\n");
        assert_eq!(normalize("\n\n  \"a\"\n  1  \n"), "\"a\"\n1");
    }
}
