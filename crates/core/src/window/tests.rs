//! Windows against the clock: across midnight, across each other, across daylight saving
//! changes, and the messages a waiting run shows.

use super::*;
use proptest::prelude::*;

fn zone(name: &str) -> Option<TimeZone> {
    TimeZone::get(name).ok()
}

fn window(name: &str, kind: WindowKind, schedule: &str, duration: &str, tz: &str) -> Window {
    Window {
        name: name.into(),
        kind,
        schedule: schedule.into(),
        duration: duration.into(),
        time_zone: Some(tz.into()),
    }
}

fn parsed(windows: &[Window]) -> Vec<ParsedWindow> {
    parse_all(windows, zone).unwrap()
}

/// An instant given as Berlin's civil time.
fn berlin(civil: &str) -> Timestamp {
    civil
        .parse::<DateTime>()
        .unwrap()
        .in_tz("Europe/Berlin")
        .unwrap()
        .timestamp()
}

fn weekend_freeze() -> Window {
    // "no production deploys from Friday 18:00 to Monday 08:00, Berlin time"
    window(
        "weekend-freeze",
        WindowKind::Deny,
        "0 18 * * fri",
        "62h",
        "Europe/Berlin",
    )
}

#[test]
fn a_weekend_freeze_closes_friday_evening_and_opens_monday_morning() {
    let w = parsed(&[weekend_freeze()]);
    assert_eq!(gate(&w, berlin("2026-12-04T17:59")), Gate::Open);
    let closed = gate(&w, berlin("2026-12-04T18:00"));
    assert_eq!(
        closed,
        Gate::Closed {
            message: "deny window weekend-freeze until Mon 08:00 Europe/Berlin".into(),
            until: Some(berlin("2026-12-07T08:00")),
        }
    );
    assert!(matches!(
        gate(&w, berlin("2026-12-06T23:59")),
        Gate::Closed { .. }
    ));
    assert_eq!(gate(&w, berlin("2026-12-07T08:00")), Gate::Open);
}

/// "staging only in office hours"
fn office_hours() -> Window {
    window(
        "office-hours",
        WindowKind::Allow,
        "0 9 * * mon-fri",
        "9h",
        "Europe/Berlin",
    )
}

#[test]
fn office_hours_allow_only_inside_them_across_midnight_too() {
    let office = office_hours();
    let w = parsed(&[office]);
    assert_eq!(gate(&w, berlin("2026-12-07T12:00")), Gate::Open);
    let evening = gate(&w, berlin("2026-12-07T18:00"));
    assert_eq!(
        evening,
        Gate::Closed {
            message: "outside allow window office-hours until Tue 09:00 Europe/Berlin".into(),
            until: Some(berlin("2026-12-08T09:00")),
        }
    );
    // Friday evening: Monday is next.
    let weekend = gate(&w, berlin("2026-12-11T20:00"));
    assert!(
        matches!(weekend, Gate::Closed { until: Some(t), .. } if t == berlin("2026-12-14T09:00"))
    );
    // A night shift across midnight.
    let night = parsed(&[window(
        "night",
        WindowKind::Allow,
        "0 22 * * *",
        "4h",
        "UTC",
    )]);
    let at = |s: &str| {
        s.parse::<DateTime>()
            .unwrap()
            .in_tz("UTC")
            .unwrap()
            .timestamp()
    };
    assert_eq!(gate(&night, at("2026-12-08T01:59")), Gate::Open);
    assert!(matches!(
        gate(&night, at("2026-12-08T02:00")),
        Gate::Closed { .. }
    ));
}

#[test]
fn a_deny_window_wins_over_an_allow_window() {
    let office = window(
        "office-hours",
        WindowKind::Allow,
        "0 9 * * *",
        "9h",
        "Europe/Berlin",
    );
    let release = window(
        "release-freeze",
        WindowKind::Deny,
        "0 12 24 12 *",
        "336h",
        "Europe/Berlin",
    );
    let w = parsed(&[office, release]);
    let closed = gate(&w, berlin("2026-12-28T10:00"));
    assert!(
        matches!(&closed, Gate::Closed { message, until: Some(t) }
            if message.starts_with("deny window release-freeze until")
                && *t == berlin("2027-01-07T12:00")),
        "{closed:?}"
    );
    assert_eq!(gate(&w, berlin("2027-01-07T12:00")), Gate::Open);
}

#[test]
fn a_start_while_open_keeps_it_open_from_that_start() {
    // Mondays and Tuesdays at 20:00 for 36 hours: Tuesday's start comes while Monday's is
    // open, so Monday evening it is closed until Thursday 08:00, 36 hours after Tuesday's.
    let w = parsed(&[window(
        "long",
        WindowKind::Deny,
        "0 20 * * mon,tue",
        "36h",
        "UTC",
    )]);
    let at = |s: &str| {
        s.parse::<DateTime>()
            .unwrap()
            .in_tz("UTC")
            .unwrap()
            .timestamp()
    };
    for now in ["2026-12-07T21:00", "2026-12-08T21:00"] {
        let closed = gate(&w, at(now));
        assert!(
            matches!(&closed, Gate::Closed { until: Some(t), message }
                if *t == at("2026-12-10T08:00") && message.ends_with("until Thu 08:00 UTC")),
            "{now}: {closed:?}"
        );
    }
    assert_eq!(gate(&w, at("2026-12-10T08:00")), Gate::Open);
}

#[test]
fn daylight_saving_changes_follow_the_zone() {
    // Spring, Berlin: 02:00 to 03:00 does not exist on 2027-03-28; a 02:30 start is at 03:30.
    let spring = parsed(&[window(
        "gap",
        WindowKind::Deny,
        "30 2 * * *",
        "1h",
        "Europe/Berlin",
    )]);
    assert_eq!(gate(&spring, berlin("2027-03-28T03:29")), Gate::Open);
    assert!(matches!(
        gate(&spring, berlin("2027-03-28T03:30")),
        Gate::Closed { .. }
    ));
    // Autumn, Berlin: 02:00 to 03:00 happens twice on 2026-10-25; the start is the first.
    let fold = parsed(&[window(
        "fold",
        WindowKind::Deny,
        "30 2 * * *",
        "30m",
        "Europe/Berlin",
    )]);
    let first = "2026-10-25T02:30+02:00".parse::<Timestamp>().unwrap();
    let second = "2026-10-25T02:30+01:00".parse::<Timestamp>().unwrap();
    assert!(matches!(gate(&fold, first), Gate::Closed { .. }));
    assert_eq!(
        gate(&fold, second),
        Gate::Open,
        "the repeated hour does not start it again"
    );
    // A 62 h weekend freeze over the autumn change lasts 62 real hours: 07:00 local on Monday.
    let freeze = parsed(&[weekend_freeze()]);
    let closed = gate(&freeze, berlin("2026-10-24T12:00"));
    assert!(matches!(closed, Gate::Closed { .. }), "{closed:?}");
    let friday = parsed(&[window(
        "f",
        WindowKind::Deny,
        "0 18 * * fri",
        "62h",
        "Europe/Berlin",
    )]);
    let until = match gate(&friday, berlin("2026-10-24T12:00")) {
        Gate::Closed { until, .. } => until,
        other => panic!("{other:?}"),
    };
    assert_eq!(until, Some(berlin("2026-10-26T07:00")));
}

#[test]
fn invalid_windows_are_errors_that_name_them() {
    let bad = [
        window("a", WindowKind::Deny, "0 18 * * fri", "0s", "UTC"),
        window("b", WindowKind::Deny, "0 18 * * fri", "800h", "UTC"),
        window("c", WindowKind::Deny, "0 18 * fri", "1h", "UTC"),
        window("d", WindowKind::Deny, "0 18 * * fri", "1h", "Mars/Olympus"),
    ];
    for (w, says) in bad
        .iter()
        .zip(["duration", "duration", "schedule", "time zone"])
    {
        let e = parse_all(std::slice::from_ref(w), zone).unwrap_err();
        assert!(
            e.starts_with(&format!("window {}:", w.name)) && e.contains(says),
            "{e}"
        );
    }
    let none: Vec<ParsedWindow> = parsed(&[]);
    assert_eq!(gate(&none, berlin("2026-12-07T08:00")), Gate::Open);
}

/// The CRD's patterns refuse only what the controller refuses: a window the API server lets in
/// may still be refused by the controller (its range, each cron field, the zone), never the
/// other way round; and the usual ones pass both.
#[test]
fn the_api_servers_patterns_refuse_nothing_the_controller_accepts() {
    use tekton_mutex_api::window::{DURATION_PATTERN, SCHEDULE_PATTERN};
    let schedule_ok = regex::Regex::new(SCHEDULE_PATTERN).unwrap();
    let duration_ok = regex::Regex::new(DURATION_PATTERN).unwrap();
    let accepted = |schedule: &str, duration: &str| {
        let w = window("w", WindowKind::Deny, schedule, duration, "UTC");
        parse_all(&[w], zone).is_ok()
    };
    let schedules = [
        "0 18 * * fri",
        "*/15 9-17 * * mon-fri",
        "@daily",
        "@weekly",
        "@hourly",
        " 0 0 1 1 * ",
        "0 18 * fri",
        "0 18 * * fri *",
        "@sometimes",
        "",
        "daily",
        "0 18 * * fri\n",
        "60 0 * * *",
    ];
    let durations = [
        "62h", "90m", "1h30m", "1.5h", ".5h", "744h", "1m", "30s", "0s", "1d", "62", "h", "-1h",
        "1h 30m", "+1h", "2H", "1e3h", "", "1µs",
    ];
    for s in schedules {
        let (api, controller) = (schedule_ok.is_match(s), accepted(s, "1h"));
        assert!(
            api || !controller,
            "the CRD refuses schedule {s:?}, the controller takes it"
        );
    }
    for d in durations {
        let (api, controller) = (duration_ok.is_match(d), accepted("0 18 * * fri", d));
        assert!(
            api || !controller,
            "the CRD refuses duration {d:?}, the controller takes it"
        );
    }
    for (s, d) in [
        ("0 18 * * fri", "62h"),
        ("@daily", "90m"),
        ("0 9 * * mon-fri", "1h30m"),
    ] {
        assert!(schedule_ok.is_match(s) && duration_ok.is_match(d) && accepted(s, d));
    }
}

#[test]
fn an_open_lock_says_when_a_window_next_closes_it() {
    let freeze = parsed(&[weekend_freeze()]);
    assert_eq!(
        next_close(&freeze, berlin("2026-12-03T10:00")).as_deref(),
        Some("Fri 18:00 Europe/Berlin (deny window weekend-freeze)")
    );
    let office = office_hours();
    let both = parsed(&[weekend_freeze(), office]);
    assert_eq!(
        next_close(&both, berlin("2026-12-07T10:00")).as_deref(),
        Some("Mon 18:00 Europe/Berlin (end of allow window office-hours)")
    );
    // Outside every allow window nothing closes it any more: it is closed.
    let none: Vec<ParsedWindow> = parsed(&[]);
    assert_eq!(next_close(&none, berlin("2026-12-07T10:00")), None);
}

fn override_until(civil: &str, reason: &str) -> Override {
    Override {
        until: berlin(civil),
        reason: reason.into(),
    }
}

#[test]
fn an_override_opens_a_closed_window_until_it_ends_and_nothing_else() {
    let w = parsed(&[weekend_freeze()]);
    let hotfix = override_until("2026-12-05T12:00", "hotfix for INC-42");
    let saturday = berlin("2026-12-05T10:00");
    assert_eq!(
        overridden(gate(&w, saturday), Some(&hotfix), saturday),
        Gate::Overridden {
            message: "deny window weekend-freeze until Mon 08:00 Europe/Berlin, overridden \
                      until Sat 2026-12-05 11:00 UTC: hotfix for INC-42"
                .into(),
            until: berlin("2026-12-05T12:00"),
        }
    );
    // Ended: the window holds again. Open anyway: nothing to override.
    let later = berlin("2026-12-05T12:00");
    assert_eq!(
        overridden(gate(&w, later), Some(&hotfix), later),
        gate(&w, later)
    );
    let thursday = berlin("2026-12-03T10:00");
    assert_eq!(
        overridden(gate(&w, thursday), Some(&hotfix), thursday),
        Gate::Open
    );
    // Invalid windows are fixed, not overridden.
    let invalid = Gate::Closed {
        message: invalid("window a: duration \"0s\""),
        until: None,
    };
    assert_eq!(
        overridden(invalid.clone(), Some(&hotfix), saturday),
        invalid
    );
}

#[test]
fn an_override_must_say_when_it_ends() {
    let read = |until: &str| {
        parse_override(&WindowOverride {
            until: until.into(),
            reason: "why".into(),
        })
    };
    assert_eq!(
        read("2026-12-08T10:00:00Z").unwrap().until,
        "2026-12-08T10:00:00Z".parse::<Timestamp>().unwrap()
    );
    assert_eq!(
        read("2026-12-08T11:00:00+01:00").unwrap().until,
        "2026-12-08T10:00:00Z".parse::<Timestamp>().unwrap()
    );
    let e = read("tomorrow").unwrap_err();
    assert!(e.contains("windowOverride: until \"tomorrow\""), "{e}");
    // The CRD's lengths (1 to 40, 1 to 1024) refuse only what this refuses too: an empty
    // reason or time; a short one it takes, this takes too.
    let blank = parse_override(&WindowOverride {
        until: "2026-12-08T10:00:00Z".into(),
        reason: " ".into(),
    });
    assert!(blank.unwrap_err().contains("reason is empty"));
    assert!(read("").is_err());
    assert!(read("2026-12-08T10:00Z").is_ok());
}

proptest! {
    /// Any short string the CRD's duration pattern refuses, the controller refuses too.
    #[test]
    fn the_duration_pattern_refuses_nothing_the_controller_takes(d in "[0-9.+hmsuµn -]{0,8}") {
        let pattern = regex::Regex::new(tekton_mutex_api::window::DURATION_PATTERN).unwrap();
        let w = window("w", WindowKind::Deny, "0 18 * * fri", &d, "UTC");
        prop_assert!(pattern.is_match(&d) || parse_all(&[w], zone).is_err(), "{:?}", d);
    }

    /// At any minute, a daily deny window (shorter than a day, so it never overlaps itself) is
    /// closed exactly when it started within its duration before (checked minute by minute
    /// against the schedule), and the time it says it opens is the first at which it is open.
    #[test]
    fn a_deny_window_is_closed_exactly_within_its_duration_of_a_start(
        hour in 0u8..24, minute in 0u8..60, hours in 1i64..24, offset in 0i64..(14 * 24 * 60),
    ) {
        let schedule = format!("{minute} {hour} * * *");
        let w = parsed(&[window("w", WindowKind::Deny, &schedule, &format!("{hours}h"), "UTC")]);
        let now = berlin("2026-12-01T00:00") + SignedDuration::from_mins(offset);
        let closed = (0..hours * 60).any(|back| {
            let t = now - SignedDuration::from_mins(back);
            let civil = TimeZone::UTC.to_datetime(t);
            civil.hour() as u8 == hour && civil.minute() as u8 == minute && civil.second() == 0
        });
        match gate(&w, now) {
            Gate::Open => prop_assert!(!closed),
            Gate::Closed { until: Some(until), .. } => {
                prop_assert!(closed);
                prop_assert_eq!(gate(&w, until), Gate::Open);
                prop_assert!(gate(&w, until - SignedDuration::from_secs(1)) != Gate::Open);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }
}
