//! Output as tkn prints it: plain columns (no colour) and ages such as
//! `5 minutes ago` (tkn's `formatted.Age`: the largest whole unit), or with
//! `-o json|yaml` the data itself, for scripts.

use super::target::{Failure, Result};
use clap::ValueEnum;
use jiff::Timestamp;
use serde::Serialize;

/// `-o json|yaml`, as tkn and kubectl take it; without it, the text for people.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Json,
    Yaml,
}

/// The value as JSON (pretty, as kubectl prints it) or YAML, ending in a newline.
pub fn formatted<T: Serialize>(value: &T, format: Format) -> Result<String> {
    let text = match format {
        Format::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string()),
        Format::Yaml => serde_saphyr::to_string(value).map_err(|e| e.to_string()),
    };
    text.map_err(|e| Failure(format!("could not format the output: {e}")))
}

/// `5 minutes ago`, `1 hour ago`, `---` when unknown.
pub fn age(t: Option<Timestamp>, now: Timestamp) -> String {
    let Some(t) = t else {
        return "---".into();
    };
    let secs = now.duration_since(t).as_secs().max(0);
    const UNITS: [(&str, i64); 6] = [
        ("year", 365 * 86_400),
        ("week", 7 * 86_400),
        ("day", 86_400),
        ("hour", 3_600),
        ("minute", 60),
        ("second", 1),
    ];
    let (unit, size) = UNITS
        .iter()
        .copied()
        .find(|(_, size)| secs >= *size)
        .unwrap_or(("second", 1));
    let n = secs / size;
    format!("{n} {unit}{} ago", if n == 1 { "" } else { "s" })
}

/// An RFC 3339 time as Kubernetes writes it.
pub fn parse_time(s: Option<&str>) -> Option<Timestamp> {
    s?.parse().ok()
}

/// Columns padded to their widest cell, three spaces apart, like tkn's tabwriter.
/// An empty table is the headers alone.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            out.push_str(cell);
            if i < last {
                out.push_str(&" ".repeat(w - cell.chars().count() + 3));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// `---` for an empty or absent value, as tkn shows it.
pub fn or_dashes(s: Option<String>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or_else(|| "---".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;

    #[test]
    fn ages_read_like_tkn() {
        let now = Timestamp::now();
        let ago = |secs: i64| age(Some(now - SignedDuration::from_secs(secs)), now);
        assert_eq!(ago(0), "0 seconds ago");
        assert_eq!(ago(1), "1 second ago");
        assert_eq!(ago(59), "59 seconds ago");
        assert_eq!(ago(60), "1 minute ago");
        assert_eq!(ago(5 * 60 + 59), "5 minutes ago");
        assert_eq!(ago(3 * 3600), "3 hours ago");
        assert_eq!(ago(86_400), "1 day ago");
        assert_eq!(ago(15 * 86_400), "2 weeks ago");
        assert_eq!(ago(800 * 86_400), "2 years ago");
        assert_eq!(
            ago(-5),
            "0 seconds ago",
            "a clock ahead of ours is not the future"
        );
        assert_eq!(age(None, now), "---");
    }

    #[test]
    fn tables_align_on_the_widest_cell_without_trailing_spaces() {
        let t = table(
            &["KEY", "HOLDERS", "WAITING"],
            &[
                vec![
                    "staging".into(),
                    "deploy-12 (5 minutes ago)".into(),
                    "2".into(),
                ],
                vec!["prod".into(), "---".into(), "0".into()],
            ],
        );
        assert_eq!(
            t,
            "KEY       HOLDERS                     WAITING\n\
             staging   deploy-12 (5 minutes ago)   2\n\
             prod      ---                         0\n"
        );
        assert_eq!(table(&["A", "B"], &[]), "A   B\n");
    }

    #[test]
    fn kubernetes_times_parse() {
        let t = parse_time(Some("2026-11-30T19:00:00Z")).unwrap();
        assert_eq!(t.to_string(), "2026-11-30T19:00:00Z");
        assert_eq!(parse_time(Some("2026-11-30T20:00:00+01:00")), Some(t));
        assert_eq!(parse_time(Some("yesterday")), None);
        assert_eq!(parse_time(None), None);
    }
}
