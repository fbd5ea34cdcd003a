//! Scheduled deploy windows (issue 48): is a lock open for new grants at a given time? Pure:
//! the time and each window's time zone come in as parameters (the controller resolves zone
//! names; the core has no time zone database).
//!
//! The rules, in the order they apply:
//! 1. A deny window that is open closes the lock, until it ends (if several are open, until the
//!    last of them ends). A deny window wins over an allow window.
//! 2. With any allow windows, the lock is open only while one of them is: outside them it is
//!    closed until the next one opens.
//! 3. Otherwise it is open.
//!
//! A window is open from each start of its schedule for its duration; a start while it is open
//! (its schedule starts again, or it overlaps itself) keeps it open for `duration` from that
//! start. No window takes the key from a holder: a closed lock only grants nothing new.

mod cron;

use cron::Cron;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, ToSpan};
use tekton_mutex_api::window::{MAX_WINDOWS, Window, WindowKind, WindowOverride};

/// The longest a window may stay open from one start.
pub const MAX_DURATION: SignedDuration = SignedDuration::from_hours(31 * 24);

/// How far ahead the next opening of an allow window is looked for: a schedule that starts less
/// often than once a year says "no allow window opens within a year".
const LOOK_AHEAD_DAYS: i32 = 366;

/// A window, parsed and with its time zone.
#[derive(Clone, Debug)]
pub struct ParsedWindow {
    pub name: String,
    pub kind: WindowKind,
    cron: Cron,
    duration: SignedDuration,
    zone: TimeZone,
    /// The zone as the spec names it, for messages.
    zone_name: String,
}

/// Whether the lock grants anything new now, and if not, why and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    Open,
    Closed {
        /// "deny window weekend-freeze until Mon 08:00 Europe/Berlin".
        message: String,
        /// When it opens again (None: not within a year, or a window is invalid).
        until: Option<Timestamp>,
    },
    /// Closed by a window, but open by an operator's override until `until`.
    Overridden {
        /// "deny window weekend-freeze until Mon 08:00 Europe/Berlin, overridden until Tue
        /// 2026-12-08 10:00 UTC: hotfix for INC-42".
        message: String,
        until: Timestamp,
    },
}

/// An operator's override of the windows (`spec.windowOverride`), read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    pub until: Timestamp,
    pub reason: String,
}

/// The override as the spec gives it, or why it cannot be read.
pub fn parse_override(o: &WindowOverride) -> Result<Override, String> {
    let until = o.until.parse::<Timestamp>().map_err(|e| {
        format!(
            "windowOverride: until {:?} is not an RFC 3339 time ({e})",
            o.until
        )
    })?;
    if o.reason.trim().is_empty() {
        // The CRD refuses it too (minLength 1): an override always says why.
        return Err("windowOverride: reason is empty; say why the windows are overridden".into());
    }
    Ok(Override {
        until,
        reason: o.reason.clone(),
    })
}

/// The gate once an operator's override is applied: a lock closed by a window opens until the
/// override ends. An open gate, an ended override and invalid windows (which must be fixed, not
/// overridden) leave the gate as it is.
pub fn overridden(gate: Gate, by: Option<&Override>, now: Timestamp) -> Gate {
    let (Gate::Closed { message, .. }, Some(o)) = (&gate, by) else {
        return gate;
    };
    if o.until <= now || message.starts_with(INVALID) {
        return gate;
    }
    let until = o.until.strftime("%a %Y-%m-%d %H:%M UTC");
    Gate::Overridden {
        message: format!("{message}, overridden until {until}: {}", o.reason),
        until: o.until,
    }
}

/// The windows of a lock parsed, each with its zone from `zone` (the controller's time zone
/// database). An invalid window is an error that names it: the lock is then closed, never open
/// by mistake.
pub fn parse_all(
    windows: &[Window],
    zone: impl Fn(&str) -> Option<TimeZone>,
) -> Result<Vec<ParsedWindow>, String> {
    if windows.len() > MAX_WINDOWS {
        return Err(format!("{} windows; at most {MAX_WINDOWS}", windows.len()));
    }
    windows.iter().map(|w| parse(w, &zone)).collect()
}

fn parse(w: &Window, zone: impl Fn(&str) -> Option<TimeZone>) -> Result<ParsedWindow, String> {
    let invalid = |what: String| format!("window {}: {what}", w.name);
    let cron =
        Cron::parse(&w.schedule).map_err(|e| invalid(format!("schedule {:?}: {e}", w.schedule)))?;
    let duration = crate::duration::parse_go_duration(&w.duration)
        .ok()
        .and_then(|d| SignedDuration::try_from(d).ok())
        .filter(|d| *d >= SignedDuration::from_mins(1) && *d <= MAX_DURATION)
        .ok_or_else(|| {
            invalid(format!(
                "duration {:?}: a Go duration from 1m to 744h (31 days)",
                w.duration
            ))
        })?;
    let zone_name = w.time_zone.clone().unwrap_or_else(|| "UTC".into());
    let zone = zone(&zone_name)
        .ok_or_else(|| invalid(format!("time zone {zone_name:?} is not an IANA time zone")))?;
    Ok(ParsedWindow {
        name: w.name.clone(),
        kind: w.kind,
        cron,
        duration,
        zone,
        zone_name,
    })
}

impl ParsedWindow {
    /// A civil start time as an instant in the window's zone: in a gap (spring), the first
    /// minute after it; in a fold (autumn), the first of the two.
    fn instant(&self, start: DateTime) -> Option<Timestamp> {
        self.zone.to_ambiguous_timestamp(start).compatible().ok()
    }

    /// The latest start at or before `now`, looking back no further than the duration.
    fn last_start(&self, now: Timestamp) -> Option<Timestamp> {
        let today = self.zone.to_datetime(now).date();
        let days_back = (self.duration.as_hours() / 24 + 2) as i32;
        let starts = (0..=days_back).filter_map(|back| {
            let date = today.checked_sub(back.days()).ok()?;
            let mut before = self
                .cron
                .starts_on(date)
                .rev()
                .filter_map(|s| self.instant(s));
            before.find(|t| *t <= now)
        });
        latest_of_two_days(starts, |a, b| a.max(b))
            .filter(|l| now.duration_since(*l) < self.duration)
    }

    /// When the window, open at `now`, closes (None if it is not open).
    fn open_until(&self, now: Timestamp) -> Option<Timestamp> {
        self.last_start(now)
            .and_then(|s| s.checked_add(self.duration).ok())
    }

    /// The first start after `now`, within a year.
    fn next_start(&self, now: Timestamp) -> Option<Timestamp> {
        let today = self.zone.to_datetime(now).date();
        let starts = (0..=LOOK_AHEAD_DAYS).filter_map(|ahead| {
            let date = today.checked_add(ahead.days()).ok()?;
            let mut after = self.cron.starts_on(date).filter_map(|s| self.instant(s));
            after.find(|t| *t > now)
        });
        latest_of_two_days(starts, |a, b| a.min(b))
    }

    /// `at` as the window's people read it: "Mon 08:00 Europe/Berlin" within a week, else with
    /// the date.
    fn local(&self, at: Timestamp, now: Timestamp) -> String {
        let zoned = at.to_zoned(self.zone.clone());
        let within_a_week = at.duration_since(now) < SignedDuration::from_hours(6 * 24);
        let format = if within_a_week {
            "%a %H:%M"
        } else {
            "%a %Y-%m-%d %H:%M"
        };
        format!("{} {}", zoned.strftime(format), self.zone_name)
    }
}

/// The first day's start, settled against the next day's (`pick`): a day's starts lie within an
/// hour of its civil times, so a daylight saving change can put the next day's before it.
fn latest_of_two_days(
    mut days: impl Iterator<Item = Timestamp>,
    pick: fn(Timestamp, Timestamp) -> Timestamp,
) -> Option<Timestamp> {
    let first = days.next()?;
    Some(days.next().map_or(first, |second| pick(first, second)))
}

/// How many times a deny window's end is followed into another start (or another deny window)
/// that keeps the lock closed, to say when it really opens.
const MAX_HOPS: usize = 64;

/// The open deny window that ends last, and its end.
fn deny_until(windows: &[ParsedWindow], at: Timestamp) -> Option<(Timestamp, &ParsedWindow)> {
    windows
        .iter()
        .filter(|w| w.kind == WindowKind::Deny)
        .filter_map(|w| w.open_until(at).map(|until| (until, w)))
        .max_by_key(|(until, _)| *until)
}

/// How a closing message of an invalid window begins (the lock is then not `Ready`).
pub const INVALID: &str = "invalid ";

/// The closing message of a lock whose windows cannot be read (`parse_all`'s error).
pub fn invalid(error: &str) -> String {
    format!("{INVALID}{error}; nothing new is granted until it is fixed")
}

/// Is the lock open for new grants at `now`, given its windows?
pub fn gate(windows: &[ParsedWindow], now: Timestamp) -> Gate {
    if let Some((mut until, w)) = deny_until(windows, now) {
        // A start (of it or another deny window) before it ends keeps the lock closed on.
        for _ in 0..MAX_HOPS {
            match deny_until(windows, until) {
                Some((later, _)) if later > until => until = later,
                _ => break,
            }
        }
        let message = format!("deny window {} until {}", w.name, w.local(until, now));
        return Gate::Closed {
            message,
            until: Some(until),
        };
    }
    let allow: Vec<&ParsedWindow> = windows
        .iter()
        .filter(|w| w.kind == WindowKind::Allow)
        .collect();
    if allow.is_empty() || allow.iter().any(|w| w.open_until(now).is_some()) {
        return Gate::Open;
    }
    let next = allow
        .into_iter()
        .filter_map(|w| w.next_start(now).map(|at| (at, w)))
        .min_by_key(|(at, _)| *at);
    match next {
        Some((at, w)) => Gate::Closed {
            message: format!("outside allow window {} until {}", w.name, w.local(at, now)),
            until: Some(at),
        },
        None => Gate::Closed {
            message: "outside every allow window, and none opens within a year".into(),
            until: None,
        },
    }
}

/// When an open lock next closes, and which window closes it: "Fri 18:00 Europe/Berlin (deny
/// window weekend-freeze)" (None: not within a year, or windows that never close it). For
/// people (`tkn mutex`); the controller needs no wake for it, a grant judges the gate itself.
pub fn next_close(windows: &[ParsedWindow], now: Timestamp) -> Option<String> {
    let deny = windows
        .iter()
        .filter(|w| w.kind == WindowKind::Deny)
        .filter_map(|w| w.next_start(now).map(|at| (at, w, "deny window")));
    let allow_ends = allow_end(windows, now).map(|(at, w)| (at, w, "end of allow window"));
    let (at, w, what) = deny.chain(allow_ends).min_by_key(|(at, ..)| *at)?;
    Some(format!("{} ({what} {})", w.local(at, now), w.name))
}

/// When the allow windows open at `now` stop covering it (following one into another that is
/// open by then), and the last of them.
fn allow_end(windows: &[ParsedWindow], now: Timestamp) -> Option<(Timestamp, &ParsedWindow)> {
    let open_until = |at: Timestamp| {
        windows
            .iter()
            .filter(|w| w.kind == WindowKind::Allow)
            .filter_map(|w| w.open_until(at).map(|until| (until, w)))
            .max_by_key(|(until, _)| *until)
    };
    let (mut until, mut w) = open_until(now)?;
    for _ in 0..MAX_HOPS {
        match open_until(until) {
            Some((later, next)) if later > until => (until, w) = (later, next),
            _ => break,
        }
    }
    Some((until, w))
}

#[cfg(test)]
mod tests;
