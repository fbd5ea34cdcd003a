//! A lock's scheduled windows at a given time (issue 48), as the controller and `tkn mutex`
//! judge them: the core decides whether they are open (`core::window`, pure, the time passed
//! in); this resolves their time zones in the time zone database the binary carries (the image
//! may have none) and applies an operator's override.

use crate::core::window::{self, Gate};
use crate::model::mutex::LockSpec;
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// Whether the lock's windows let it grant anything new at `now`, an operator's override
/// applied. An invalid window closes it, saying which and why: a window written wrong must never
/// mean "always open". An override that cannot be read is said beside the window it would open.
pub fn gate(spec: &LockSpec, now: Timestamp) -> Gate {
    if spec.windows.is_empty() {
        return Gate::Open;
    }
    let gate = match parsed(spec) {
        Ok(windows) => window::gate(&windows, now),
        Err(e) => Gate::Closed {
            message: window::invalid(&e),
            until: None,
        },
    };
    match spec.window_override.as_ref().map(window::parse_override) {
        None => gate,
        Some(Ok(o)) => window::overridden(gate, Some(&o), now),
        Some(Err(e)) => match gate {
            Gate::Closed { message, until } => Gate::Closed {
                message: format!("{message} ({e}: not applied)"),
                until,
            },
            open => open,
        },
    }
}

/// The lock's windows, parsed with their zones from the database the binary carries.
fn parsed(spec: &LockSpec) -> Result<Vec<window::ParsedWindow>, String> {
    window::parse_all(&spec.windows, |name| TimeZone::get(name).ok())
}

/// What the windows say now, for people (`tkn mutex list` and `describe`): None without any;
/// "open", with when a window next closes it; "closed: " and why until when; or "open: " and
/// the override that lets it through. Judged from the spec, so an idle lock shows it too.
pub fn now_line(spec: &LockSpec, now: Timestamp) -> Option<String> {
    if spec.windows.is_empty() {
        return None;
    }
    Some(match gate(spec, now) {
        Gate::Open => match parsed(spec).ok().and_then(|w| window::next_close(&w, now)) {
            Some(closes) => format!("open until {closes}"),
            None => "open".into(),
        },
        Gate::Closed { message, .. } => format!("closed: {message}"),
        Gate::Overridden { message, .. } => format!("open: {message}"),
    })
}
