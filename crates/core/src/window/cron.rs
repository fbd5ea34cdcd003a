//! Five-field cron schedules (minute, hour, day of month, month, day of week), as a Kubernetes
//! CronJob reads them: `*`, lists, ranges, steps, month and day names, 0 or 7 for Sunday, and
//! the `@daily`-style macros. Day of month and day of week, both restricted, match on either
//! (as cron does); otherwise both must.

use jiff::civil::{Date, DateTime, Time};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    /// Day of month and day of week both restricted: a day matches on either.
    either_day: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

impl Cron {
    pub fn parse(schedule: &str) -> Result<Cron, String> {
        let expanded = match schedule.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(format!(
                "{} fields, not 5 (minute hour day-of-month month day-of-week)",
                fields.len()
            ));
        };
        let weekdays = field(weekday, 0, 7, &WEEKDAYS, "day of week")?;
        Ok(Cron {
            minutes: field(minute, 0, 59, &[], "minute")?,
            hours: field(hour, 0, 23, &[], "hour")? as u32,
            days: field(day, 1, 31, &[], "day of month")? as u32,
            months: field(month, 1, 12, &MONTHS, "month")? as u16,
            // 7 is Sunday too.
            weekdays: ((weekdays | (weekdays >> 7)) & 0x7f) as u8,
            either_day: !day.starts_with('*') && !weekday.starts_with('*'),
        })
    }

    /// Does the schedule start anything on `date` (its day of month, month and day of week)?
    pub fn on(&self, date: Date) -> bool {
        if self.months & (1 << date.month()) == 0 {
            return false;
        }
        let day = self.days & (1 << date.day()) != 0;
        let weekday = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        if self.either_day {
            day || weekday
        } else {
            day && weekday
        }
    }

    /// The times of day the schedule starts at, earliest first.
    pub fn times(&self) -> impl DoubleEndedIterator<Item = Time> + '_ {
        (0..24i8)
            .filter(|h| self.hours & (1 << h) != 0)
            .flat_map(move |h| {
                (0..60i8)
                    .filter(move |m| self.minutes & (1 << m) != 0)
                    .map(move |m| Time::constant(h, m, 0, 0))
            })
    }

    /// The civil start times on `date`, earliest first.
    pub fn starts_on(&self, date: Date) -> impl DoubleEndedIterator<Item = DateTime> + '_ {
        let on = self.on(date);
        self.times()
            .filter(move |_| on)
            .map(move |t| date.to_datetime(t))
    }
}

/// One field as a bit set over `min..=max`.
fn field(text: &str, min: u32, max: u32, names: &[&str], what: &str) -> Result<u64, String> {
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, number(s, what)?),
            None => (item, 1),
        };
        if step == 0 {
            return Err(format!("{what}: a step of 0 in {item:?}"));
        }
        let (from, to) = match range {
            "*" => (min, max),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a, min, names, what)?, value(b, min, names, what)?),
                // `a/n` runs from a to the end.
                None if item.contains('/') => (value(r, min, names, what)?, max),
                None => {
                    let v = value(r, min, names, what)?;
                    (v, v)
                }
            },
        };
        if from < min || to > max || from > to {
            return Err(format!("{what}: {item:?} is outside {min}-{max}"));
        }
        for v in (from..=to).step_by(step as usize) {
            bits |= 1 << v;
        }
    }
    Ok(bits)
}

fn value(text: &str, min: u32, names: &[&str], what: &str) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    match names.iter().position(|n| *n == lower) {
        // Months are named from 1, days of the week from 0.
        Some(i) => Ok(i as u32 + min),
        None => number(text, what),
    }
}

fn number(text: &str, what: &str) -> Result<u32, String> {
    text.parse()
        .map_err(|_| format!("{what}: {text:?} is not a number or a name"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    #[test]
    fn fields_lists_ranges_steps_and_names() {
        let c = Cron::parse("0,30 8-18/2 * jan-mar,dec MON-fri").unwrap();
        let times: Vec<Time> = c.times().collect();
        assert_eq!(times.len(), 12);
        assert_eq!(times[0], Time::constant(8, 0, 0, 0));
        assert_eq!(times[11], Time::constant(18, 30, 0, 0));
        assert!(c.on(date(2026, 12, 7))); // a Monday in December
        assert!(!c.on(date(2026, 12, 6))); // a Sunday
        assert!(!c.on(date(2026, 6, 8))); // a Monday in June
    }

    #[test]
    fn sunday_is_0_and_7_and_macros_expand() {
        let sunday = date(2026, 12, 6);
        assert!(Cron::parse("0 0 * * 7").unwrap().on(sunday));
        assert!(Cron::parse("0 0 * * 0").unwrap().on(sunday));
        assert_eq!(
            Cron::parse("@weekly").unwrap(),
            Cron::parse("0 0 * * sun").unwrap()
        );
        assert_eq!(Cron::parse("@daily").unwrap().times().count(), 1);
    }

    #[test]
    fn day_of_month_and_day_of_week_restricted_match_on_either() {
        let c = Cron::parse("0 0 1 * mon").unwrap();
        assert!(c.on(date(2026, 12, 1))); // the 1st, a Tuesday
        assert!(c.on(date(2026, 12, 7))); // a Monday
        assert!(!c.on(date(2026, 12, 8)));
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        for (bad, says) in [
            ("0 0 * *", "4 fields"),
            ("60 * * * *", "minute"),
            ("* 24 * * *", "hour"),
            ("* * 0 * *", "day of month"),
            ("* * * 13 *", "month"),
            ("* * * * 8", "day of week"),
            ("*/0 * * * *", "step of 0"),
            ("5-1 * * * *", "outside"),
            ("x * * * *", "not a number"),
        ] {
            let e = Cron::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
