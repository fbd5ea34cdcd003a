//! Write points: where the controller writes to the API server, derived from
//! the code, never listed by hand.
//!
//! **Definition.** Every write the controller makes is announced, right before
//! it is sent, by a call of `Metrics::api_write(verb, resource)` (the counter of
//! the `tekton_mutex_api_writes` metric). A *write point* is one such call site
//! in the product's source: a file, line and column. The catalogue is read from
//! the source tree itself (every `.api_write(` outside tests), so a new write
//! function is a new write point the moment it is written: if no plan crashes
//! it, the suite fails and the report shows it uncrashed. A write that reaches
//! the API server without an announcement fails the suite too: it would be a
//! write point this definition cannot see.
//!
//! At run time the site of each write is known exactly: `api_write` is
//! `#[track_caller]` and, in test builds, queues its caller's location on the
//! thread; the fault layer takes the oldest announcement for each write it
//! receives (each task announces and sends in one poll, and kube's client
//! buffer is first in, first out) and checks that verb and resource agree.
//!
//! A write point has *variants*, what one write there changes (the reason a
//! run status patch writes, whether a lock patch adds or removes the
//! finalizer, ...). They are reported, not counted: the unit of coverage is the
//! call site.

use super::api_server::{Call, parse_path};
use crate::metrics::write_sites::Announced;
use http::Method;
use serde_json::Value;
use std::path::Path;

/// A call site of `Metrics::api_write` in the product's source.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WritePoint {
    /// Relative to the crate root, as `Location::file()` gives it.
    pub file: String,
    pub line: u32,
    pub column: u32,
}

impl std::fmt::Display for WritePoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// A write point as the catalogue found it: where, in which function, saying what.
#[derive(Clone, Debug)]
pub struct Site {
    pub point: WritePoint,
    pub function: String,
    /// The call's text, e.g. `api_write("patch", L::PLURAL)`.
    pub call: String,
}

/// Every write point of the product: each `.api_write(` in `src/`, outside
/// test code (files named `tests.rs`, folders named `tests/` such as this suite's, and
/// `#[cfg(test)]` modules at the end of a file, which is where this repository keeps them).
pub fn catalogue() -> Vec<Site> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    let mut sites = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(root)
            .expect("under the crate root")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&path).expect("a source file reads");
        sites.extend(sites_in(&rel, &text));
    }
    sites
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ reads").flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() && name != "tests" {
            rust_files(&path, out);
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// The `.api_write(` calls of one file, above its test module.
fn sites_in(file: &str, text: &str) -> Vec<Site> {
    let mut sites = Vec::new();
    let mut function = String::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        if let Some(f) = function_named(line) {
            function = f;
        }
        let mut from = 0;
        while let Some(at) = line[from..].find(".api_write(") {
            let column = from + at + 1;
            let end = call_end(line, column);
            sites.push(Site {
                point: WritePoint {
                    file: file.into(),
                    line: i as u32 + 1,
                    column: column as u32 + 1,
                },
                function: function.clone(),
                call: line[column..end].to_string(),
            });
            from = column;
        }
    }
    sites
}

/// Where the call starting at `from` closes its parentheses (or the line ends).
fn call_end(line: &str, from: usize) -> usize {
    let mut depth = 0;
    for (i, c) in line[from..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 1 => return from + i + 1,
            ')' => depth -= 1,
            _ => {}
        }
    }
    line.len()
}

/// `fn name` on a line that declares one.
fn function_named(line: &str) -> Option<String> {
    let at = line.find("fn ")?;
    let before = line[..at].trim();
    let words_ok = before
        .split_whitespace()
        .all(|w| matches!(w, "pub" | "pub(crate)" | "pub(super)" | "async" | "const"));
    let name: String = line[at + 3..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (words_ok && !name.is_empty()).then_some(name)
}

/// The write point of a write, checked against what the announcement said.
pub fn attribute(a: &Announced, call: &Call) -> Result<WritePoint, String> {
    let point = WritePoint {
        file: a.site.file().replace('\\', "/"),
        line: a.site.line(),
        column: a.site.column(),
    };
    let target = parse_path(&call.path)?;
    let res = target.kind.resource();
    let resource = match target.status {
        true => format!("{}/status", res.plural),
        false => res.plural.to_string(),
    };
    let verb = match call.method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "?",
    };
    // The recorder patches an Event it has sent before (a series): still the create's site.
    let same = a.resource == resource && (a.verb == verb || res.plural == "events");
    match same {
        true => Ok(point),
        false => Err(format!(
            "{}: announced at {point} as {} {}, sent as {verb} {resource}",
            call.line(),
            a.verb,
            a.resource
        )),
    }
}

/// What a write changes, in a few words.
pub fn variant(call: &Call) -> String {
    let Ok(target) = parse_path(&call.path) else {
        return "?".into();
    };
    let b = &call.body;
    let plural = target.kind.resource().plural;
    match (&call.method, plural, target.status) {
        (_, "events", _) => format!("event {}", b["reason"].as_str().unwrap_or("?")),
        (&Method::PATCH, "customruns", true) => run_status_variant(b),
        (&Method::PATCH, "mutexes" | "clustermutexes", false) => lock_patch_variant(b),
        (&Method::PATCH, "pipelineruns", false) => {
            let annotations = b["metadata"]["annotations"].as_object();
            let why = annotations
                .and_then(|a| a.keys().next().cloned())
                .unwrap_or_default();
            format!("cancel ({why})")
        }
        (m, p, status) => {
            let sub = if status { "/status" } else { "" };
            format!("{} {p}{sub}", m.as_str().to_lowercase())
        }
    }
}

fn run_status_variant(b: &Value) -> String {
    if let Some(reason) = b["status"]["conditions"][0]["reason"].as_str() {
        return format!("run {reason}");
    }
    match b["status"]["extraFields"].get("keysEpoch") {
        Some(_) => "run keysEpoch (revoke)".into(),
        None => "run status".into(),
    }
}

fn lock_patch_variant(b: &Value) -> String {
    let meta = &b["metadata"];
    if let Some(f) = meta["finalizers"].as_array() {
        let ours = f
            .iter()
            .any(|f| f == crate::controller::reconcile::finalizer::LOCK_STATE_FINALIZER);
        return if ours {
            "finalizer on"
        } else {
            "finalizer off"
        }
        .into();
    }
    let requests = meta["annotations"].as_object().is_some_and(|a| {
        a.keys()
            .any(|k| k.starts_with(crate::core::requests::REQUEST_PREFIX))
    });
    match requests {
        true => "requests acknowledged".into(),
        false => "idle-since stamp".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogue_finds_each_call_and_its_function() {
        let text = "fn a() {\n    ctx.metrics.api_write(\"create\", \"x\");\n}\nasync fn b() {\n    ctx.metrics\n        .api_write(\"update\", &y);\n}\n#[cfg(test)]\nmod tests { fn c() { m.api_write(\"z\", \"z\") } }\n";
        let sites = sites_in("src/f.rs", text);
        let found: Vec<(u32, u32, &str)> = sites
            .iter()
            .map(|s| (s.point.line, s.point.column, s.function.as_str()))
            .collect();
        assert_eq!(found, [(2, 17, "a"), (6, 10, "b")]);
        assert_eq!(sites[0].call, "api_write(\"create\", \"x\")");
    }

    /// The catalogue is what `#[track_caller]` reports: an announcement's
    /// location is that of the `api_write` name, found the way the scan finds it.
    #[test]
    fn an_announcement_points_where_the_scan_points() {
        crate::metrics::write_sites::record();
        let metrics = crate::metrics::Metrics::new();
        metrics.api_write("create", "events");
        let a = crate::metrics::write_sites::take_oldest().expect("announced");
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(a.site.file());
        let text = std::fs::read_to_string(path).expect("this file reads");
        let found = sites_in(a.site.file(), &text.replace("#[cfg(test)]", "//"));
        let point = WritePoint {
            file: a.site.file().into(),
            line: a.site.line(),
            column: a.site.column(),
        };
        assert!(
            found.iter().any(|s| s.point == point),
            "{point:?} not in {found:?}"
        );
    }
}
