//! Scheduled deploy windows on a lock (issue 48): `deny` windows in which nothing new is
//! granted, and `allow` windows outside of which nothing new is granted. What a window is; when
//! one is open is `tekton_mutex_core::window`'s.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A window in which a lock grants nothing new (`deny`), or, with any `allow` window, the only
/// times it grants anything new. Holders keep the key through any window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Window {
    /// A name for messages, Events and metrics (`weekend-freeze`).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// `deny` or `allow`. A deny window wins over an allow window.
    pub kind: WindowKind,
    /// When the window opens: a cron schedule of five fields (minute, hour, day of month, month,
    /// day of week), read in `timeZone`, as a Kubernetes CronJob's. Each start opens it for
    /// `duration`; a start while it is open keeps it open `duration` from that start.
    #[schemars(length(min = 6, max = 256), regex(pattern = SCHEDULE_PATTERN))]
    pub schedule: String,
    /// How long the window stays open from each start: a Go duration (`62h`, `90m`), from
    /// one minute to 31 days.
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    pub duration: String,
    /// The IANA time zone the schedule is read in (`Europe/Berlin`); UTC when absent. Daylight
    /// saving changes follow it: a start in the hour skipped in spring is at the first minute
    /// after the gap; a start in the hour repeated in autumn is at its first occurrence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    Deny,
    Allow,
}

impl WindowKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WindowKind::Deny => "deny",
            WindowKind::Allow => "allow",
        }
    }
}

/// An operator's override of a lock's windows (`tkn mutex override-window`), as Argo CD's manual
/// sync inside a window: until `until`, a closed window does not hold back new grants. It never
/// opens a lock whose windows are invalid (they must be fixed), and never unfreezes one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowOverride {
    /// When the override ends: an RFC 3339 time (`2026-12-08T10:00:00Z`).
    #[schemars(length(min = 1, max = 40))]
    pub until: String,
    /// Why: shown in the lock's status and its `Ready` condition (`hotfix for INC-42`).
    #[schemars(length(min = 1, max = 1024))]
    pub reason: String,
}

/// What the API server checks of a schedule (the CRD's pattern): five fields, or a macro such as
/// `@daily`. Every schedule it refuses, the controller refuses too (a test holds the two
/// together); the controller checks the rest and reports it on the lock.
pub const SCHEDULE_PATTERN: &str = r"^\s*(@[a-z]+|\S+(\s+\S+){4})\s*$";

/// What the API server checks of a duration (the CRD's pattern): a Go duration's shape. Its
/// range (1m to 744h) is the controller's to check, as is the rest of the schedule.
pub const DURATION_PATTERN: &str =
    r"^\s*\+?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+\s*$";

/// The most windows a lock may have.
pub const MAX_WINDOWS: usize = 16;
