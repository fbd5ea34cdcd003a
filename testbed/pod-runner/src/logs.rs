//! Step output on disk, and reading it back the way a kubelet serves container logs.
//!
//! A step's stdout and stderr go, through one pipe, to `<pod dir>/<container>.log` exactly as
//! written (other tools read that file). Beside it, `logmeta/<container>.times` holds one
//! RFC 3339 timestamp per line of the log (when the line's first byte arrived), for
//! `timestamps` and `sinceSeconds`, and `logmeta/<container>.ended` marks a container that will
//! write no more, so a follower knows when to stop.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k8s_openapi::jiff::Timestamp;

const META: &str = "logmeta";

pub fn log_path(pod_dir: &Path, container: &str) -> PathBuf {
    pod_dir.join(format!("{container}.log"))
}

fn times_path(pod_dir: &Path, container: &str) -> PathBuf {
    pod_dir.join(META).join(format!("{container}.times"))
}

fn ended_path(pod_dir: &Path, container: &str) -> PathBuf {
    pod_dir.join(META).join(format!("{container}.ended"))
}

/// Appends a container's output, timestamping each line as it starts.
pub struct StepLog {
    raw: File,
    times: File,
    at_line_start: bool,
}

impl StepLog {
    pub fn open(pod_dir: &Path, container: &str) -> Result<Self> {
        std::fs::create_dir_all(pod_dir.join(META))?;
        // Readable too: a log that already has output is read for its last byte below (a
        // write-only descriptor refused that read with EBADF, failing every step of a pod
        // recreated under the same name, as after an etcd restore).
        let open = |p: PathBuf| {
            OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(&p)
                .with_context(|| format!("opening {}", p.display()))
        };
        let raw = open(log_path(pod_dir, container))?;
        // A log that already has output (a pod recreated under the same name) continues it.
        let at_line_start = raw.metadata()?.len() == 0 || ends_with_newline(&raw)?;
        Ok(Self {
            raw,
            times: open(times_path(pod_dir, container))?,
            at_line_start,
        })
    }

    /// Writes `bytes`. The timestamps go first, so a reader that sees a line finds its time.
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let Some((last, before_last)) = bytes.split_last() else {
            return Ok(());
        };
        // A line starts at the first byte (if the previous write ended one) and after every
        // newline but a final one.
        let starts =
            usize::from(self.at_line_start) + before_last.iter().filter(|b| **b == b'\n').count();
        self.at_line_start = *last == b'\n';
        let now = Timestamp::now().to_string();
        let stamps = format!("{now}\n").repeat(starts);
        self.times.write_all(stamps.as_bytes())?;
        self.raw.write_all(bytes)
    }

    /// Marks the container as done: followers stop once they have read everything.
    pub fn end(pod_dir: &Path, container: &str) {
        let _ = std::fs::create_dir_all(pod_dir.join(META));
        let _ = File::create(ended_path(pod_dir, container));
    }
}

fn ends_with_newline(f: &File) -> Result<bool> {
    let mut f = f.try_clone()?;
    f.seek(SeekFrom::End(-1))?;
    let mut last = [0u8; 1];
    f.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

/// The options of a kubelet `containerLogs` request.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub timestamps: bool,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<u64>,
    /// Only lines written at or after this time (`sinceSeconds` or `sinceTime`).
    pub since: Option<Timestamp>,
}

impl LogOptions {
    /// Parses the query string the API server passes on.
    pub fn from_query(query: &str) -> std::result::Result<Self, String> {
        let mut o = LogOptions::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let bad = |what: &str| format!("invalid {k}={v:?}: {what}");
            match k.as_ref() {
                "follow" => o.follow = v == "true" || v == "1",
                "timestamps" => o.timestamps = v == "true" || v == "1",
                "tailLines" => o.tail_lines = Some(v.parse().map_err(|_| bad("not a count"))?),
                "limitBytes" => o.limit_bytes = Some(v.parse().map_err(|_| bad("not a count"))?),
                "sinceSeconds" => {
                    let secs: i64 = v.parse().map_err(|_| bad("not seconds"))?;
                    let since = Timestamp::now()
                        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(secs))
                        .map_err(|e| bad(&e.to_string()))?;
                    o.since = Some(since);
                }
                "sinceTime" => o.since = Some(v.parse().map_err(|_| bad("not RFC 3339"))?),
                "previous" if v == "true" => {
                    return Err("previous terminated container not found: \
                                the pod-runner never restarts containers"
                        .into());
                }
                _ => {}
            }
        }
        Ok(o)
    }
}

/// One line of a log with its timestamp.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub time: String,
    /// Without its trailing newline.
    pub text: Vec<u8>,
}

/// Reads a container's log from the start, as it grows.
pub struct LogTail {
    raw: PathBuf,
    times: PathBuf,
    ended: PathBuf,
    offset: u64,
    times_offset: u64,
    pending_times: Vec<String>,
    partial: Vec<u8>,
}

impl LogTail {
    pub fn new(pod_dir: &Path, container: &str) -> Self {
        Self {
            raw: log_path(pod_dir, container),
            times: times_path(pod_dir, container),
            ended: ended_path(pod_dir, container),
            offset: 0,
            times_offset: 0,
            pending_times: Vec::new(),
            partial: Vec::new(),
        }
    }

    pub fn started(&self) -> bool {
        self.raw.exists()
    }

    pub fn ended(&self) -> bool {
        self.ended.exists()
    }

    /// The complete lines written since the last call; with `flush`, the last unterminated
    /// line too (for a container that has ended).
    pub fn read_lines(&mut self, flush: bool) -> std::io::Result<Vec<Line>> {
        let new = read_from(&self.raw, &mut self.offset)?;
        self.partial.extend_from_slice(&new);
        let stamps = read_from(&self.times, &mut self.times_offset)?;
        self.pending_times
            .extend(String::from_utf8_lossy(&stamps).lines().map(str::to_string));
        let mut lines = Vec::new();
        while let Some(nl) = self.partial.iter().position(|b| *b == b'\n') {
            let text: Vec<u8> = self.partial.drain(..=nl).take(nl).collect();
            lines.push(Line {
                time: self.next_time(),
                text,
            });
        }
        if flush && !self.partial.is_empty() {
            let text = std::mem::take(&mut self.partial);
            lines.push(Line {
                time: self.next_time(),
                text,
            });
        }
        Ok(lines)
    }

    fn next_time(&mut self) -> String {
        if self.pending_times.is_empty() {
            Timestamp::now().to_string() // written by something other than StepLog
        } else {
            self.pending_times.remove(0)
        }
    }
}

fn read_from(path: &Path, offset: &mut u64) -> std::io::Result<Vec<u8>> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    f.seek(SeekFrom::Start(*offset))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    *offset += buf.len() as u64;
    Ok(buf)
}

/// Formats lines for the response, applying `since` and `timestamps`.
pub fn render(lines: &[Line], opts: &LogOptions) -> Vec<u8> {
    let mut out = Vec::new();
    for line in lines {
        if let Some(since) = opts.since
            && line.time.parse::<Timestamp>().is_ok_and(|t| t < since)
        {
            continue;
        }
        if opts.timestamps {
            out.extend_from_slice(line.time.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&line.text);
        out.push(b'\n');
    }
    out
}

/// The last `n` lines, or all.
pub fn tail(lines: Vec<Line>, n: Option<usize>) -> Vec<Line> {
    match n {
        Some(n) if n < lines.len() => lines[lines.len() - n..].to_vec(),
        _ => lines,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pod-runner-logs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn every_line_gets_the_time_it_started() {
        let dir = temp_dir("times");
        let mut log = StepLog::open(&dir, "step-a").unwrap();
        log.write(b"one\ntw").unwrap();
        log.write(b"o\nthree\n").unwrap();
        log.write(b"four").unwrap();
        let raw = std::fs::read_to_string(log_path(&dir, "step-a")).unwrap();
        assert_eq!(
            raw, "one\ntwo\nthree\nfour",
            "the raw log is the output as written"
        );
        let times = std::fs::read_to_string(times_path(&dir, "step-a")).unwrap();
        assert_eq!(times.lines().count(), 4, "{times}");

        let mut tail = LogTail::new(&dir, "step-a");
        let lines = tail.read_lines(false).unwrap();
        let texts: Vec<_> = lines.iter().map(|l| l.text.clone()).collect();
        assert_eq!(texts, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
        assert!(!tail.ended());
        StepLog::end(&dir, "step-a");
        assert!(tail.ended());
        let last = tail.read_lines(true).unwrap();
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].text, b"four");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A pod recreated under the same name continues its step's log, on a new line.
    #[test]
    fn a_log_with_output_is_continued() {
        let dir = temp_dir("again");
        StepLog::open(&dir, "step-a")
            .unwrap()
            .write(b"first")
            .unwrap();
        let mut again = StepLog::open(&dir, "step-a").unwrap();
        assert!(!again.at_line_start);
        again.write(b"\nsecond\n").unwrap();
        let raw = std::fs::read_to_string(log_path(&dir, "step-a")).unwrap();
        assert_eq!(raw, "first\nsecond\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn render_applies_timestamps_and_since_and_tail() {
        let line = |t: &str, s: &str| Line {
            time: t.into(),
            text: s.as_bytes().to_vec(),
        };
        let lines = vec![
            line("2026-01-01T00:00:01Z", "a"),
            line("2026-01-01T00:00:02Z", "b"),
            line("2026-01-01T00:00:03Z", "c"),
        ];
        assert_eq!(render(&lines, &LogOptions::default()), b"a\nb\nc\n");
        let opts = LogOptions {
            timestamps: true,
            ..Default::default()
        };
        assert_eq!(
            String::from_utf8(render(&tail(lines.clone(), Some(1)), &opts)).unwrap(),
            "2026-01-01T00:00:03Z c\n"
        );
        let since = LogOptions {
            since: Some("2026-01-01T00:00:02Z".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(render(&lines, &since), b"b\nc\n");
    }

    #[test]
    fn options_parse_from_the_api_servers_query() {
        let o = LogOptions::from_query("follow=true&tailLines=5&timestamps=true&limitBytes=10")
            .unwrap();
        assert!(o.follow && o.timestamps);
        assert_eq!((o.tail_lines, o.limit_bytes), (Some(5), Some(10)));
        assert!(LogOptions::from_query("tailLines=x").is_err());
        assert!(LogOptions::from_query("previous=true").is_err());
        assert!(
            LogOptions::from_query("sinceSeconds=10")
                .unwrap()
                .since
                .is_some()
        );
    }
}
