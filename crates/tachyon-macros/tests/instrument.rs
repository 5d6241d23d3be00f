//! `#[tachyon::instrument]` end to end: instrumented functions run in a real in-memory session,
//! and the trace, read back with `tachyon-processor`, has one slice per call with the right
//! name, category, depth and arguments.

use std::fmt::Display;
use std::num::ParseIntError;
use std::sync::Mutex;

use tachyon_processor::{Options, TraceProcessor, Value};

// === instrumented code ===

/// A doc comment, kept.
#[tachyon::instrument]
fn plain(x: u32) -> u32 {
    x * 2
}

#[tachyon::instrument(name = "custom name", category = "io")]
fn renamed() {}

#[tachyon::instrument(args(a, b, s, flag, c, maybe))]
fn with_args(a: u64, b: i32, s: &str, flag: bool, c: char, maybe: Option<u8>) -> i64 {
    a as i64
        + i64::from(b)
        + s.len() as i64
        + i64::from(flag)
        + c.len_utf8() as i64
        + maybe.map_or(0, i64::from)
}

#[tachyon::instrument(category = "calc", fields(owned, len = owned.len(), "sum.total" = 1.5f64))]
fn with_fields(owned: String) -> String {
    owned
}

#[tachyon::instrument(args(n))]
fn early_return(n: i64) -> i64 {
    if n < 0 {
        return -1;
    }
    plain(n as u32) as i64
}

#[tachyon::instrument(args(input))]
fn question_mark(input: &str) -> Result<u32, ParseIntError> {
    let n: u32 = input.parse()?;
    Ok(plain(n))
}

#[tachyon::instrument(args(n))]
fn fib(n: u32) -> u64 {
    if n < 2 {
        n as u64
    } else {
        fib(n - 1) + fib(n - 2)
    }
}

#[tachyon::instrument(args(value))]
fn generic<T: tachyon::ArgValue + Display>(value: T) -> String {
    value.to_string()
}

#[tachyon::instrument(args(value))]
fn generic_where<T, U>(value: &T, extra: U) -> usize
where
    T: tachyon::ArgValue + ?Sized + AsRef<str>,
    U: IntoIterator<Item = u8>,
{
    value.as_ref().len() + extra.into_iter().count()
}

#[tachyon::instrument]
fn returns_impl(n: u32) -> impl Iterator<Item = u32> {
    0..n
}

#[tachyon::instrument(args(a, b))]
fn destructured((a, b): (u8, u16)) -> u32 {
    a as u32 + b as u32
}

#[tachyon::instrument(crate = ::tachyon)]
fn explicit_crate() {}

#[allow(clippy::needless_return)]
#[tachyon::instrument]
#[must_use]
fn attributes_below() -> bool {
    return true;
}

// The callsite's line is the attribute's (the line `line!()` gives for code a macro expands
// to), so both are on one line here.
#[rustfmt::skip]
#[tachyon::instrument] fn located() -> u32 { line!() }

struct Counter {
    id: u32,
    total: u64,
}

trait Describe {
    fn describe(&self) -> String;
}

impl Counter {
    #[tachyon::instrument(args(id = self.id, by))]
    fn add(&mut self, by: u64) -> &mut Self {
        self.total += by;
        self
    }

    #[tachyon::instrument]
    fn total(&self) -> u64 {
        self.total
    }

    #[tachyon::instrument]
    fn new(id: u32) -> Self {
        Counter { id, total: 0 }
    }
}

impl Describe for Counter {
    #[tachyon::instrument(category = "trait")]
    fn describe(&self) -> String {
        format!("counter {}", self.total())
    }
}

// === harness ===

/// One session at a time: the session is process-wide.
static SESSION: Mutex<()> = Mutex::new(());

/// A slice of the trace.
#[derive(Debug, PartialEq)]
struct Slice {
    name: String,
    cat: Option<String>,
    depth: i64,
    /// The debug annotations, `(key, display value)`, keys without the `debug.` prefix.
    args: Vec<(String, String)>,
}

fn slice(name: &str, cat: Option<&str>, depth: i64, args: &[(&str, &str)]) -> Slice {
    Slice {
        name: name.into(),
        cat: cat.map(Into::into),
        depth,
        args: args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::Text(s) => Some(s.clone()),
        Value::Integer(i) => Some(i.to_string()),
        Value::Real(r) => Some(r.to_string()),
        Value::Blob(_) => panic!("unexpected blob"),
    }
}

/// Runs `f` in a session and returns the trace, loaded.
fn record(f: impl FnOnce()) -> TraceProcessor {
    let _one_at_a_time = SESSION.lock().unwrap_or_else(|e| e.into_inner());
    tachyon::start(tachyon::Config::in_memory()).expect("start");
    // A failing check in `f` must not leave the session running for the next test.
    struct StopOnPanic;
    impl Drop for StopOnPanic {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = tachyon::shutdown();
            }
        }
    }
    let stop = StopOnPanic;
    f();
    drop(stop);
    let report = tachyon::shutdown()
        .expect("shutdown")
        .expect("a session was running");
    TraceProcessor::from_bytes(&report.trace, &Options::default()).expect("the trace loads")
}

/// Every slice, in order of start (then depth), with its arguments; all must have ended.
fn slices(tp: &TraceProcessor) -> Vec<Slice> {
    let rows = tp
        .query("SELECT id, name, cat, depth, arg_set_id, dur FROM slice ORDER BY ts, depth")
        .unwrap()
        .rows;
    rows.iter()
        .map(|row| {
            let Value::Integer(dur) = row[5] else {
                panic!("dur {:?}", row[5])
            };
            assert!(dur >= 0, "slice {:?} never ended", row[1]);
            let args = match &row[4] {
                Value::Integer(set) => tp
                    .query(&format!(
                        "SELECT key, display_value FROM args WHERE arg_set_id = {set} ORDER BY id"
                    ))
                    .unwrap()
                    .rows
                    .iter()
                    .filter_map(|a| {
                        // The zone's own arguments; the source location (`source.*`) is
                        // checked by `source_location_is_the_attribute`.
                        let key = text(&a[0]).unwrap().strip_prefix("debug.")?.to_string();
                        Some((key, text(&a[1]).unwrap_or_default()))
                    })
                    .collect(),
                _ => Vec::new(),
            };
            let Value::Integer(depth) = row[3] else {
                panic!("depth {:?}", row[3])
            };
            Slice {
                name: text(&row[1]).unwrap(),
                cat: text(&row[2]),
                depth,
                args,
            }
        })
        .collect()
}

// === tests ===

#[test]
fn plain_function_is_a_zone_named_after_it() {
    let tp = record(|| {
        assert_eq!(plain(21), 42);
        renamed();
        explicit_crate();
        assert!(attributes_below());
    });
    assert_eq!(
        slices(&tp),
        [
            slice("plain", None, 0, &[]),
            slice("custom name", Some("io"), 0, &[]),
            slice("explicit_crate", None, 0, &[]),
            slice("attributes_below", None, 0, &[]),
        ]
    );
}

#[test]
fn arguments_are_recorded() {
    let tp = record(|| {
        assert_eq!(with_args(7, -3, "héllo", true, 'é', Some(9)), 22);
        assert_eq!(with_args(0, 0, "", false, 'x', None), 1);
        assert_eq!(with_fields("abc".to_string()), "abc");
        assert_eq!(destructured((1, 2)), 3);
    });
    assert_eq!(
        slices(&tp),
        [
            slice(
                "with_args",
                None,
                0,
                &[
                    ("a", "7"),
                    ("b", "-3"),
                    ("s", "héllo"),
                    ("flag", "true"),
                    ("c", "é"),
                    ("maybe", "9"),
                ],
            ),
            slice(
                "with_args",
                None,
                0,
                &[
                    ("a", "0"),
                    ("b", "0"),
                    ("s", ""),
                    ("flag", "false"),
                    ("c", "x"),
                    ("maybe", "None"),
                ],
            ),
            slice(
                "with_fields",
                Some("calc"),
                0,
                // The processor reads an annotation named `sum.total` as Perfetto does: `.`
                // is the arg key's separator, so the name's becomes `_`.
                &[("owned", "abc"), ("len", "3"), ("sum_total", "1.5")],
            ),
            slice("destructured", None, 0, &[("a", "1"), ("b", "2")]),
        ]
    );
    // The same through `extract_arg`, with the value types kept.
    let rows = tp
        .query(
            "SELECT extract_arg(arg_set_id, 'debug.a'), extract_arg(arg_set_id, 'debug.s'), \
             extract_arg(arg_set_id, 'debug.flag') FROM slice WHERE name = 'with_args' ORDER BY ts",
        )
        .unwrap()
        .rows;
    assert_eq!(
        rows[0],
        [
            Value::Integer(7),
            Value::Text("héllo".into()),
            Value::Integer(1)
        ]
    );
}

#[test]
fn early_return_and_question_mark_end_the_zone() {
    let tp = record(|| {
        assert_eq!(early_return(-5), -1);
        assert_eq!(early_return(4), 8);
        assert!(question_mark("x").is_err());
        assert_eq!(question_mark("5"), Ok(10));
    });
    assert_eq!(
        slices(&tp),
        [
            slice("early_return", None, 0, &[("n", "-5")]),
            slice("early_return", None, 0, &[("n", "4")]),
            slice("plain", None, 1, &[]),
            slice("question_mark", None, 0, &[("input", "x")]),
            slice("question_mark", None, 0, &[("input", "5")]),
            slice("plain", None, 1, &[]),
        ]
    );
}

#[test]
fn recursion_nests() {
    let tp = record(|| assert_eq!(fib(3), 2));
    // fib(3) -> fib(2) -> (fib(1), fib(0)); fib(1)
    assert_eq!(
        slices(&tp),
        [
            slice("fib", None, 0, &[("n", "3")]),
            slice("fib", None, 1, &[("n", "2")]),
            slice("fib", None, 2, &[("n", "1")]),
            slice("fib", None, 2, &[("n", "0")]),
            slice("fib", None, 1, &[("n", "1")]),
        ]
    );
    // Each child's parent is the enclosing call.
    let orphans = tp
        .query(
            "SELECT COUNT(*) FROM slice c LEFT JOIN slice p ON c.parent_id = p.id \
             WHERE c.depth > 0 AND (p.id IS NULL OR p.depth != c.depth - 1 \
             OR p.ts > c.ts OR p.ts + p.dur < c.ts + c.dur)",
        )
        .unwrap()
        .rows;
    assert_eq!(orphans[0][0], Value::Integer(0));
}

#[test]
fn generics_where_clauses_and_impl_trait() {
    let tp = record(|| {
        assert_eq!(generic(5u8), "5");
        assert_eq!(generic("str"), "str");
        assert_eq!(generic_where("abcd", vec![1u8, 2]), 6);
        assert_eq!(returns_impl(3).sum::<u32>(), 3);
    });
    assert_eq!(
        slices(&tp),
        [
            slice("generic", None, 0, &[("value", "5")]),
            slice("generic", None, 0, &[("value", "str")]),
            slice("generic_where", None, 0, &[("value", "abcd")]),
            slice("returns_impl", None, 0, &[]),
        ]
    );
}

#[test]
fn methods_and_trait_impls() {
    let tp = record(|| {
        let mut c = Counter::new(7);
        c.add(2).add(3);
        assert_eq!(c.describe(), "counter 5");
    });
    assert_eq!(
        slices(&tp),
        [
            slice("new", None, 0, &[]),
            slice("add", None, 0, &[("id", "7"), ("by", "2")]),
            slice("add", None, 0, &[("id", "7"), ("by", "3")]),
            slice("describe", Some("trait"), 0, &[]),
            slice("total", None, 1, &[]),
        ]
    );
}

#[test]
fn source_location_is_the_attribute() {
    let mut line = 0;
    let tp = record(|| line = located());
    let rows = tp
        .query(
            "SELECT extract_arg(arg_set_id, 'source.file_name'), \
             extract_arg(arg_set_id, 'source.line_number') FROM slice WHERE name = 'located'",
        )
        .unwrap()
        .rows;
    assert_eq!(
        rows,
        [[Value::Text(file!().into()), Value::Integer(line.into())]]
    );
}

#[test]
fn nothing_is_recorded_without_a_session() {
    let _one_at_a_time = SESSION.lock().unwrap_or_else(|e| e.into_inner());
    assert!(!tachyon::is_active());
    // Instrumented functions work the same with tracing off.
    assert_eq!(fib(10), 55);
    assert_eq!(question_mark("2"), Ok(4));
}
