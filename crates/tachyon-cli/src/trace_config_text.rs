//! Perfetto's text-format TraceConfig (`perfetto -c config.pbtxt --txt`), parsed into the encoded
//! `perfetto.protos.TraceConfig` that `tachyon record -c CONFIG.pbtxt` hands to the service.
//!
//! The syntax is protobuf's text format, as Perfetto's documented configs use it:
//!
//! ```text
//! # A 64 MiB ring buffer and the track_event data source for 10 s.
//! buffers { size_kb: 65536 fill_policy: RING_BUFFER }
//! data_sources: {
//!   config { name: "track_event" track_event_config { enabled_categories: "*" } }
//! }
//! duration_ms: 10000
//! ```
//!
//! The schema is not a list kept here: `build.rs` compiles Perfetto's whole TraceConfig schema
//! (the CLI's `schema/`, a copy of Perfetto's config protos) into a descriptor set that is
//! embedded below, and prost-reflect parses against it. So every field of Perfetto's schema is
//! accepted: Perfetto's own configs (ftrace, heapprofd, perf_event, GPU counters, ...) load.
//! Anything else (an unknown or misspelt field, a value of the wrong type, an unknown enum value,
//! a field set twice) is an error that names the file, line and column and shows the line with a
//! caret under the culprit.
//!
//! The schema declares far more than Tachyon acts on: such a field is accepted, and
//! [`parse_trace_config_and_ignored`] names each one set, with its line, for a warning.

use std::fmt;
use std::sync::OnceLock;

use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, Value};

/// The `FileDescriptorSet` of tachyon-protos' `.proto` files, written by `build.rs`.
static DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/perfetto_descriptor_set.bin"));

const TRACE_CONFIG: &str = "perfetto.protos.TraceConfig";

/// Parses Perfetto text-format TraceConfig into the encoded message. `origin` names the file in
/// errors. Empty text (or only comments) is the empty, valid, config. (`tachyon record` uses
/// [`parse_trace_config_and_ignored`], which also names the fields Tachyon ignores.)
///
/// # Errors
///
/// The first syntax or schema error, with its position.
#[cfg(test)]
pub(crate) fn parse_trace_config(
    text: &str,
    origin: &str,
) -> Result<Vec<u8>, TraceConfigTextError> {
    Ok(parse(text, origin)?.encode_to_vec())
}

/// Parses Perfetto text-format TraceConfig into the encoded message, and names the fields set
/// that Tachyon does not act on, each once, as `{origin}:{line}: {path}` in the order they
/// first appear (for warnings). `origin` names the file in errors. Empty text (or only
/// comments) is the empty, valid, config.
///
/// # Errors
///
/// The first syntax or schema error, with its position.
pub(crate) fn parse_trace_config_and_ignored(
    text: &str,
    origin: &str,
) -> Result<(Vec<u8>, Vec<String>), TraceConfigTextError> {
    let message = parse(text, origin)?;
    let ignored = ignored_in(&message, text, origin);
    Ok((message.encode_to_vec(), ignored))
}

fn parse(text: &str, origin: &str) -> Result<DynamicMessage, TraceConfigTextError> {
    let desc = trace_config_descriptor();
    DynamicMessage::parse_text_format(desc.clone(), text)
        .map_err(|e| TraceConfigTextError::new(text, origin, &e, desc.parent_pool()))
}

/// The fields Tachyon acts on, as paths of field names from the TraceConfig (`x.*`: everything
/// under `x`; a data source's own config is read by that data source). See
/// `tachyon_service::SessionConfig::from_trace_config` and the data sources.
const ACTED_ON: &[&str] = &[
    "buffers.size_kb",
    "buffers.fill_policy",
    "data_sources.config.name",
    "data_sources.config.target_buffer",
    "data_sources.config.track_event_config.*",
    "data_sources.config.process_stats_config.*",
    "data_sources.config.sys_stats_config.*",
    "data_sources.config.perf_event_config.timebase.frequency",
    "data_sources.config.perf_event_config.timebase.period",
    "data_sources.config.perf_event_config.timebase.counter",
    "data_sources.config.perf_event_config.callstack_sampling.scope.target_pid",
    "data_sources.config.perf_event_config.callstack_sampling.scope.target_cmdline",
    "data_sources.config.perf_event_config.callstack_sampling.scope.exclude_pid",
    "data_sources.config.perf_event_config.callstack_sampling.scope.exclude_cmdline",
    "data_sources.config.perf_event_config.callstack_sampling.kernel_frames",
    "data_sources.config.perf_event_config.ring_buffer_read_period_ms",
    "data_sources.config.perf_event_config.sampling_frequency",
    "data_sources.config.perf_event_config.all_cpus",
    "data_sources.config.perf_event_config.kernel_frames",
    "data_sources.config.perf_event_config.target_pid",
    "data_sources.config.perf_event_config.target_cmdline",
    "data_sources.config.perf_event_config.exclude_pid",
    "data_sources.config.perf_event_config.exclude_cmdline",
    "data_sources.producer_name_filter",
    "data_sources.producer_name_regex_filter",
    "duration_ms",
    "write_into_file",
    "output_path",
    "file_write_period_ms",
    "max_file_size_bytes",
    "flush_period_ms",
    "flush_timeout_ms",
    "data_source_stop_timeout_ms",
    "incremental_state_config.clear_period_ms",
    "compression_type",
];

fn acted_on(path: &str) -> bool {
    ACTED_ON.iter().any(|p| match p.strip_suffix(".*") {
        Some(prefix) => path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.')),
        None => *p == path,
    })
}

/// The fields set in `message` (parsed from `text`) that Tachyon does not act on, with their
/// lines (see [`parse_trace_config_and_ignored`]).
fn ignored_in(message: &DynamicMessage, text: &str, origin: &str) -> Vec<String> {
    let mut paths = Vec::new();
    collect_ignored(message, "", &mut paths);
    let mut found: Vec<(usize, String)> = paths
        .into_iter()
        .map(|path| {
            let name = path.rsplit('.').next().unwrap_or(&path);
            (line_of_field(text, name), path)
        })
        .collect();
    found.sort();
    found.dedup_by(|a, b| a.1 == b.1);
    found
        .into_iter()
        .map(|(line, path)| format!("{origin}:{line}: {path}"))
        .collect()
}

fn collect_ignored(message: &DynamicMessage, prefix: &str, out: &mut Vec<String>) {
    for (field, value) in message.fields() {
        let path = if prefix.is_empty() {
            field.name().to_owned()
        } else {
            format!("{prefix}.{}", field.name())
        };
        let nested: Vec<&DynamicMessage> = match value {
            Value::Message(m) => vec![m],
            Value::List(items) => items.iter().filter_map(Value::as_message).collect(),
            _ => Vec::new(),
        };
        let wholly = acted_on(&path);
        if nested.is_empty() || wholly {
            if !wholly && !out.contains(&path) {
                out.push(path);
            }
            continue;
        }
        for m in nested {
            collect_ignored(m, &path, out);
        }
    }
}

/// The 1-based line where `name` first appears as a field (`name:` or `name {`) outside a
/// comment, or 0.
fn line_of_field(text: &str, name: &str) -> usize {
    for (i, line) in text.lines().enumerate() {
        let code = line.split('#').next().unwrap_or("");
        let mut from = 0;
        while let Some(at) = code[from..].find(name).map(|a| a + from) {
            let before = code[..at].chars().next_back();
            let after = code[at + name.len()..].trim_start().chars().next();
            let word_start = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
            if word_start && matches!(after, Some(':' | '{' | '<')) {
                return i + 1;
            }
            from = at + name.len();
        }
    }
    0
}

fn trace_config_descriptor() -> &'static MessageDescriptor {
    static DESC: OnceLock<MessageDescriptor> = OnceLock::new();
    DESC.get_or_init(|| {
        // Both facts are fixed at build time (build.rs wrote the set from the checked-in
        // protos), so a failure here is a build bug, not a user error.
        let pool = DescriptorPool::decode(DESCRIPTOR_SET).expect("build.rs wrote a valid set");
        pool.get_message_by_name(TRACE_CONFIG)
            .expect("tachyon-protos declares perfetto.protos.TraceConfig")
    })
}

// === impl TraceConfigTextError ===

/// A text-format TraceConfig error at a position in the source.
///
/// `Display` prints `{origin}:{line}:{column}: {message}`, then the offending line and a caret
/// under the span, like a compiler diagnostic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceConfigTextError {
    /// The file (or other source) name given to [`parse_trace_config_and_ignored`].
    pub(crate) origin: String,
    /// 1-based line.
    pub(crate) line: usize,
    /// 1-based column, in characters.
    pub(crate) column: usize,
    /// What is wrong, without the position.
    pub(crate) message: String,
    /// The text of line `line`, without its line break.
    source_line: String,
    /// Characters to underline from `column` (at least 1).
    width: usize,
}

impl TraceConfigTextError {
    fn new(
        text: &str,
        origin: &str,
        error: &prost_reflect::text_format::ParseError,
        pool: &DescriptorPool,
    ) -> Self {
        // prost-reflect exposes the span only through miette's `Diagnostic::labels`; an error
        // without a label is "unexpected end of input": point just after the last token.
        let (start, len) = miette::Diagnostic::labels(error)
            .and_then(|mut labels| labels.next())
            .map_or((text.trim_end().len(), 0), |l| (l.offset(), l.len()));
        let (message, (start, len)) = describe(&error.to_string(), text, (start, len), pool);
        let start = floor_char_boundary(text, start);
        let end = floor_char_boundary(text, start.saturating_add(len));

        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
        let source_line = text[line_start..line_end].trim_end_matches('\r');
        let line = text[..start].matches('\n').count() + 1;
        let column = text[line_start..start].chars().count() + 1;
        let width = text[start..end.min(line_end)].chars().count().max(1);

        TraceConfigTextError {
            origin: origin.to_owned(),
            line,
            column,
            message,
            source_line: source_line.to_owned(),
            width,
        }
    }
}

impl fmt::Display for TraceConfigTextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}:{}:{}: {}",
            self.origin, self.line, self.column, self.message
        )?;
        let gutter = self.line.to_string();
        let pad = " ".repeat(gutter.len());
        // Keep tabs as tabs before the caret so it lines up under the source.
        let indent: String = self
            .source_line
            .chars()
            .take(self.column - 1)
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        writeln!(f, "{pad} |")?;
        writeln!(f, "{gutter} | {}", self.source_line)?;
        write!(f, "{pad} | {indent}{}", "^".repeat(self.width))
    }
}

impl std::error::Error for TraceConfigTextError {}

fn floor_char_boundary(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

// === messages ===

/// Rewrites prost-reflect's message for the common mistakes into one that says what to do (a
/// suggestion for a misspelt field, the valid values of an enum, the field a bad value is for),
/// and moves the span where that reads better. The patterns are prost-reflect 0.16's `Display`
/// texts (pinned by Cargo.lock and checked by the tests below); any other message is passed
/// through unchanged.
fn describe(
    library: &str,
    text: &str,
    span: (usize, usize),
    pool: &DescriptorPool,
) -> (String, (usize, usize)) {
    if let Some((field, message)) = two_quoted(library, "field '", "' not found for message '") {
        let mut out = format!("unknown field `{field}` in {message}");
        if let Some(desc) = pool.get_message_by_name(message) {
            let names: Vec<String> = desc.fields().map(|f| f.name().to_owned()).collect();
            match closest(field, names.iter().map(String::as_str)) {
                Some(best) => out.push_str(&format!("; did you mean `{best}`?")),
                None => out.push_str(&format!(" (its fields are: {})", names.join(", "))),
            }
        }
        return (out, span);
    }
    if let Some((value, enum_name)) = two_quoted(library, "value '", "' was not found for enum '") {
        let mut out = format!("unknown value `{value}` for enum {enum_name}");
        if let Some(desc) = pool.get_enum_by_name(enum_name) {
            let names: Vec<String> = desc.values().map(|v| v.name().to_owned()).collect();
            match closest(value, names.iter().map(String::as_str)) {
                Some(best) => out.push_str(&format!("; did you mean `{best}`?")),
                None => out.push_str(&format!(" (expected one of: {})", names.join(", "))),
            }
        }
        return (out, span);
    }
    if library.ends_with("' is already set") {
        // The library points at the value; the field name reads better. A message value may
        // follow its name without a `:`.
        if let Some((name, at)) = field_before(text, span.0, false) {
            return (
                format!(
                    "`{name}` is already set (only repeated fields may be given more than once)"
                ),
                (at, name.len()),
            );
        }
        return (library.to_owned(), span);
    }
    // A value of the wrong type or out of range: say which field it was for.
    let mut out = match two_quoted(library, "expected ", ", but found '") {
        Some((expected, found)) => format!("expected {expected}, found `{found}`"),
        None => library.to_owned(),
    };
    if library.starts_with("expected ") {
        if let Some((name, _)) = field_before(text, span.0, true) {
            out = format!("field `{name}`: {out}");
        }
    }
    (out, span)
}

/// The field name and its offset if the token at `at` is the value in `name: value` (or, with
/// `colon` false, possibly `name value`).
fn field_before(text: &str, at: usize, colon: bool) -> Option<(&str, usize)> {
    let before = text.get(..at)?.trim_end();
    let before = match before.strip_suffix(':') {
        Some(b) => b.trim_end(),
        None if colon => return None,
        None => before,
    };
    let start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let name = &before[start..];
    let is_name = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
    is_name.then_some((name, start))
}

/// Splits `{prefix}A{middle}B'` into `(A, B)`.
fn two_quoted<'s>(s: &'s str, prefix: &str, middle: &str) -> Option<(&'s str, &'s str)> {
    s.strip_prefix(prefix)?
        .strip_suffix('\'')?
        .split_once(middle)
}

/// The candidate nearest to `word` by edit distance, if near enough to be a likely typo, or equal
/// ignoring case. "Near enough" is 1 edit plus 1 per 6 characters: tighter than rustc's third of
/// the length, which would offer `legacy_config` for Perfetto's `ftrace_config`.
fn closest<'c>(word: &str, candidates: impl Iterator<Item = &'c str>) -> Option<&'c str> {
    let limit = 1 + word.chars().count() / 6;
    candidates
        .filter_map(|c| {
            let d = if c.eq_ignore_ascii_case(word) {
                0
            } else {
                levenshtein(word, c)
            };
            (d <= limit).then_some((d, c))
        })
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use tachyon_protos::trace_config::buffer_config::FillPolicy;
    use tachyon_protos::{BuiltinClock, TraceConfigView};

    use super::*;

    /// The fields `text` sets that Tachyon ignores.
    fn ignored_fields(text: &str, origin: &str) -> Vec<String> {
        parse_trace_config_and_ignored(text, origin).unwrap().1
    }

    fn err(text: &str) -> TraceConfigTextError {
        parse_trace_config(text, "test.pbtxt").expect_err("should not parse")
    }

    /// A config in the style of Perfetto's documentation: `#` comments, nested messages with and
    /// without `:`, `<>` delimiters, a repeated field written several times and as a list,
    /// enum values by name.
    #[test]
    fn realistic_config_round_trips() {
        let text = r#"
# Two buffers.
buffers: {
  size_kb: 63488
  fill_policy: RING_BUFFER
}
buffers {
  size_kb: 2048   # trailing comment
  fill_policy: DISCARD
}
data_sources: {
  config {
    name: "track_event"
    target_buffer: 0
    track_event_config {
      enabled_categories: "rendering"
      enabled_categories: "net*"
      disabled_categories: ["*"]
    }
  }
  producer_name_filter: "my_app"
}
data_sources <
  config < name: "legacy" target_buffer: 1 legacy_config: "x\ty" >
>
duration_ms: 10000
write_into_file: true
file_write_period_ms: 2500
flush_period_ms: 1000
incremental_state_config { clear_period_ms: 500 }
builtin_data_sources { primary_trace_clock: BUILTIN_CLOCK_MONOTONIC }
"#;
        let bytes = parse_trace_config(text, "realistic.pbtxt").unwrap();
        let config = TraceConfigView::decode(&bytes).unwrap();

        let buffers: Vec<_> = config.buffers().map(Result::unwrap).collect();
        assert_eq!(buffers.len(), 2);
        assert_eq!(buffers[0].size_kb(), 63488);
        assert_eq!(buffers[0].fill_policy(), Some(FillPolicy::RingBuffer));
        assert_eq!(buffers[1].size_kb(), 2048);
        assert_eq!(buffers[1].fill_policy(), Some(FillPolicy::Discard));

        let sources: Vec<_> = config.data_sources().map(Result::unwrap).collect();
        assert_eq!(sources.len(), 2);
        let track_event = sources[0].config().unwrap();
        assert_eq!(track_event.name().unwrap(), "track_event");
        assert_eq!(track_event.target_buffer(), 0);
        let te = track_event.track_event_config().unwrap();
        let enabled: Vec<_> = te.enabled_categories().map(Result::unwrap).collect();
        assert_eq!(enabled, ["rendering", "net*"]);
        let disabled: Vec<_> = te.disabled_categories().map(Result::unwrap).collect();
        assert_eq!(disabled, ["*"]);
        let filters: Vec<_> = sources[0]
            .producer_name_filter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(filters, ["my_app"]);
        let legacy = sources[1].config().unwrap();
        assert_eq!(legacy.name().unwrap(), "legacy");
        assert_eq!(legacy.target_buffer(), 1);
        assert_eq!(legacy.legacy_config().unwrap(), "x\ty");

        assert_eq!(config.duration_ms(), 10000);
        assert!(config.write_into_file());
        assert_eq!(config.file_write_period_ms(), 2500);
        assert_eq!(config.flush_period_ms(), 1000);
        assert_eq!(
            config.incremental_state_config().unwrap().clear_period_ms(),
            500
        );
        assert_eq!(
            config.builtin_data_sources().unwrap().primary_trace_clock(),
            Some(BuiltinClock::Monotonic)
        );
    }

    #[test]
    fn empty_text_is_the_empty_config() {
        assert_eq!(parse_trace_config("", "empty.pbtxt").unwrap(), b"");
        assert_eq!(
            parse_trace_config("  # nothing\n\n", "c.pbtxt").unwrap(),
            b""
        );
    }

    #[test]
    fn misspelt_field_names_its_line_and_a_suggestion() {
        let e = err("duration_ms: 1\n\n  buferss { size_kb: 1024 }\n");
        assert_eq!((e.line, e.column), (3, 3));
        assert_eq!(
            e.message,
            "unknown field `buferss` in perfetto.protos.TraceConfig; did you mean `buffers`?"
        );
        assert_eq!(
            e.to_string(),
            "test.pbtxt:3:3: unknown field `buferss` in perfetto.protos.TraceConfig; did you \
             mean `buffers`?\n  |\n3 |   buferss { size_kb: 1024 }\n  |   ^^^^^^^"
        );
    }

    #[test]
    fn field_tachyon_does_not_model_lists_the_known_ones() {
        // A field of no schema at all: no misleading suggestion, the message's fields instead
        // (Perfetto's whole DataSourceConfig).
        let e = err("data_sources {\n  config {\n    zzqx_config { }\n  }\n}\n");
        assert_eq!((e.line, e.column), (3, 5));
        assert!(
            e.message.starts_with(
                "unknown field `zzqx_config` in perfetto.protos.DataSourceConfig (its fields \
                 are: name, target_buffer,"
            ),
            "{}",
            e.message
        );
        assert!(e.message.contains("track_event_config"), "{}", e.message);
        assert!(e.message.contains("ftrace_config"), "{}", e.message);
    }

    /// Perfetto's data source configs Tachyon has no producer for parse (the whole schema is
    /// known) and are named as ignored, field by field.
    #[test]
    fn perfetto_data_source_configs_parse_and_are_named_as_ignored() {
        let text = "data_sources {\n  config {\n    name: \"linux.ftrace\"\n    ftrace_config {\n      ftrace_events: \"sched/sched_switch\"\n      buffer_size_kb: 64\n    }\n  }\n}\n";
        assert_eq!(
            ignored_fields(text, "f.cfg"),
            [
                "f.cfg:5: data_sources.config.ftrace_config.ftrace_events",
                "f.cfg:6: data_sources.config.ftrace_config.buffer_size_kb",
            ]
        );
    }

    #[test]
    fn value_of_the_wrong_type_names_its_line_and_field() {
        let e = err("buffers {\n  fill_policy: DISCARD\n  size_kb: \"big\"\n}\n");
        assert_eq!((e.line, e.column), (3, 12));
        assert_eq!(
            e.message,
            "field `size_kb`: expected an integer, found `\"big\"`"
        );
        assert!(e
            .to_string()
            .ends_with("3 |   size_kb: \"big\"\n  |            ^^^^^"));

        let e = err("duration_ms: -1");
        assert_eq!((e.line, e.column), (1, 14));
        assert!(
            e.message.starts_with("field `duration_ms`: "),
            "{}",
            e.message
        );
        assert!(e.message.contains("out of range"), "{}", e.message);
    }

    #[test]
    fn unknown_enum_value_lists_the_valid_ones() {
        let e = err("buffers {\n  fill_policy: RING\n}");
        assert_eq!((e.line, e.column), (2, 16));
        assert_eq!(
            e.message,
            "unknown value `RING` for enum perfetto.protos.TraceConfig.BufferConfig.FillPolicy \
             (expected one of: UNSPECIFIED, RING_BUFFER, DISCARD)"
        );
        let e = err("buffers { fill_policy: DISCRAD }");
        assert!(
            e.message.ends_with("; did you mean `DISCARD`?"),
            "{}",
            e.message
        );
    }

    #[test]
    fn singular_field_set_twice_points_at_the_second() {
        let e = err("duration_ms: 1\nduration_ms: 2\n");
        assert_eq!((e.line, e.column), (2, 1));
        assert!(
            e.message.starts_with("`duration_ms` is already set"),
            "{}",
            e.message
        );
        // A message value without `:`: the library points at its `{`, we at the name.
        let e = err("incremental_state_config {}\n  incremental_state_config { }\n");
        assert_eq!((e.line, e.column), (2, 3));
        assert_eq!(
            e.message,
            "`incremental_state_config` is already set (only repeated fields may be given more \
             than once)"
        );
    }

    #[test]
    fn unexpected_end_points_after_the_last_token() {
        let e = err("buffers {\n  size_kb: 1\n\n");
        assert_eq!((e.line, e.column), (2, 13));
        assert!(e.message.contains("end of input"), "{}", e.message);
    }

    #[test]
    fn columns_count_characters_and_carets_keep_tabs() {
        let e = err("data_sources { config { name: \"é\"\tbogus: 1 } }");
        assert_eq!((e.line, e.column), (1, 35));
        assert!(e
            .to_string()
            .ends_with(&format!("  | {}\t^^^^^", " ".repeat(33))));
    }

    #[test]
    fn sample_configs_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        let mut seen = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "pbtxt") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let bytes = parse_trace_config(&text, &path.display().to_string())
                .unwrap_or_else(|e| panic!("{e}"));
            let config = TraceConfigView::decode(&bytes).unwrap();
            assert!(config.buffers().count() > 0, "{}", path.display());
            assert!(config.data_sources().count() > 0, "{}", path.display());
            seen.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
        seen.sort();
        assert_eq!(seen, ["system.pbtxt", "track_event.pbtxt"]);
    }

    #[test]
    fn fields_tachyon_does_not_act_on_are_named_with_their_line() {
        let text = "\
buffers { size_kb: 1024 fill_policy: DISCARD }
# compression_type: DEFLATE (a comment, not a field)
data_sources {
  config { name: \"track_event\" target_buffer_name: \"main\"
           track_event_config { enabled_categories: \"*\" } }
}
data_sources { config { name: \"linux.sys_stats\" target_buffer_name: \"main\" } }
compression_type: COMPRESSION_TYPE_DEFLATE
duration_ms: 1000
enable_extra_guardrails: true
incremental_state_config { clear_period_ms: 500 }
";
        parse_trace_config(text, "t.pbtxt").unwrap();
        assert_eq!(
            ignored_fields(text, "t.pbtxt"),
            [
                "t.pbtxt:4: data_sources.config.target_buffer_name",
                "t.pbtxt:10: enable_extra_guardrails",
            ]
        );
        // What Tachyon supports raises nothing: the sample configs.
        for sample in ["system.pbtxt", "track_event.pbtxt"] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("configs")
                .join(sample);
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(ignored_fields(&text, sample), Vec::<String>::new());
        }
    }

    #[test]
    fn suggestions_are_near_misses_only() {
        let fields = ["buffers", "data_sources", "duration_ms", "legacy_config"];
        assert_eq!(closest("buferss", fields.into_iter()), Some("buffers"));
        assert_eq!(
            closest("DURATION_MS", fields.into_iter()),
            Some("duration_ms")
        );
        assert_eq!(closest("ftrace_config", fields.into_iter()), None);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("", "abc"), 3);
    }
}
