//! Printing query results as an aligned table, CSV or JSON.

use std::fmt::Write as _;

use clap::ValueEnum;
use tachyon_processor::{QueryResult, Value};

/// `--format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// An aligned text table.
    #[default]
    Table,
    /// RFC 4180 CSV with a header row; NULL is an empty field.
    Csv,
    /// A JSON array with one object per row.
    Json,
}

pub(crate) fn render(result: &QueryResult, format: Format) -> String {
    match format {
        Format::Table => table(result),
        Format::Csv => csv(result),
        Format::Json => json(result),
    }
}

fn display(v: &Value) -> String {
    match v {
        Value::Null => "NULL".to_owned(),
        Value::Integer(i) => i.to_string(),
        Value::Real(r) => r.to_string(),
        Value::Text(s) => s.clone(),
        Value::Blob(b) => hex(b),
    }
}

fn hex(b: &[u8]) -> String {
    let mut s = String::from("x'");
    for byte in b {
        let _ = write!(s, "{byte:02x}");
    }
    s.push('\'');
    s
}

fn table(r: &QueryResult) -> String {
    let cells: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| row.iter().map(display).collect())
        .collect();
    let mut widths: Vec<usize> = r.columns.iter().map(|c| c.chars().count()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, parts: Vec<String>| {
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(
        &mut out,
        r.columns
            .iter()
            .zip(&widths)
            .map(|(c, &w)| format!("{c:<w$}"))
            .collect(),
    );
    line(&mut out, widths.iter().map(|&w| "-".repeat(w)).collect());
    for (row, values) in cells.iter().zip(&r.rows) {
        line(
            &mut out,
            row.iter()
                .zip(values)
                .zip(&widths)
                .map(|((c, v), &w)| match v {
                    Value::Integer(_) | Value::Real(_) => format!("{c:>w$}"),
                    _ => format!("{c:<w$}"),
                })
                .collect(),
        );
    }
    let n = r.rows.len();
    let _ = writeln!(out, "({n} row{})", if n == 1 { "" } else { "s" });
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn csv(r: &QueryResult) -> String {
    let mut out = String::new();
    let header: Vec<String> = r.columns.iter().map(|c| csv_field(c)).collect();
    out.push_str(&header.join(","));
    out.push('\n');
    for row in &r.rows {
        let fields: Vec<String> = row
            .iter()
            .map(|v| match v {
                Value::Null => String::new(),
                v => csv_field(&display(v)),
            })
            .collect();
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json(r: &QueryResult) -> String {
    let mut out = String::from("[");
    for (i, row) in r.rows.iter().enumerate() {
        out.push_str(if i == 0 { "\n  {" } else { ",\n  {" });
        for (j, (col, v)) in r.columns.iter().zip(row).enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            out.push_str(&json_string(col));
            out.push_str(": ");
            match v {
                Value::Null => out.push_str("null"),
                Value::Integer(n) => out.push_str(&n.to_string()),
                // JSON has no NaN or infinities.
                Value::Real(x) if x.is_finite() => out.push_str(&format!("{x:?}")),
                Value::Real(_) => out.push_str("null"),
                Value::Text(s) => out.push_str(&json_string(s)),
                Value::Blob(b) => out.push_str(&json_string(&hex(b))),
            }
        }
        out.push('}');
    }
    out.push_str(if r.rows.is_empty() { "]\n" } else { "\n]\n" });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> QueryResult {
        QueryResult {
            columns: vec!["name".into(), "n".into(), "x".into()],
            rows: vec![
                vec![
                    Value::Text("a,\"b\"\n".into()),
                    Value::Integer(12),
                    Value::Real(0.5),
                ],
                vec![Value::Null, Value::Integer(-1), Value::Real(f64::NAN)],
            ],
        }
    }

    #[test]
    fn csv_quotes_and_leaves_null_empty() {
        assert_eq!(
            render(&sample(), Format::Csv),
            "name,n,x\n\"a,\"\"b\"\"\n\",12,0.5\n,-1,NaN\n"
        );
    }

    #[test]
    fn json_escapes_and_maps_nan_to_null() {
        assert_eq!(
            render(&sample(), Format::Json),
            "[\n  {\"name\": \"a,\\\"b\\\"\\n\", \"n\": 12, \"x\": 0.5},\n  {\"name\": null, \"n\": -1, \"x\": null}\n]\n"
        );
    }

    #[test]
    fn table_aligns_numbers_right() {
        let t = render(
            &QueryResult {
                columns: vec!["name".into(), "count".into()],
                rows: vec![vec![Value::Text("ab".into()), Value::Integer(7)]],
            },
            Format::Table,
        );
        assert_eq!(t, "name  count\n----  -----\nab        7\n(1 row)\n");
    }
}
