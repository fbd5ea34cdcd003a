//! The coverage report: write points crashed, plans run, and every violation,
//! each with its scenario, plan, seed and a trace of the history that broke it.

use super::fault::Write;
use super::plans;
use super::run::{Plan, Record};
use super::scenarios::Scenario;
use super::store::{Change, Kind};
use super::watch::{Fired, WatchPlan};
use super::write_points::{Site, WritePoint};
use std::collections::{BTreeMap, BTreeSet};

/// Violations whose trace is printed in full.
const TRACED: usize = 3;
/// Violations listed; the rest are counted.
const SHOWN: usize = 40;

/// Plans of one kind of fault on one cached kind: how many ran, how many did what they meant.
#[derive(Clone, Copy, Default)]
pub struct Tally {
    pub plans: usize,
    /// Stale: served stale. Unobserved: the event never shown.
    pub fired: usize,
    /// Unobserved only: no later event came, the event was delivered late.
    pub late: usize,
}

#[derive(Default)]
pub struct Coverage {
    pub seed: u64,
    pub sites: Vec<Site>,
    /// Crash plans that killed the process right after a landed write at the point.
    crashed: BTreeMap<WritePoint, usize>,
    /// Writes that reached the API server at each point, across every run.
    written: BTreeMap<WritePoint, usize>,
    variants: BTreeMap<WritePoint, BTreeMap<String, (usize, usize)>>,
    pub scenarios: usize,
    pub crash_plans: usize,
    /// Crash plans that crash the recovery of another crash too.
    pub recrash_plans: usize,
    pub stale: BTreeMap<Kind, Tally>,
    pub unobserved: BTreeMap<Kind, Tally>,
    /// The unobserved states the issue names, by name: plans run, events never shown.
    pub named: BTreeMap<&'static str, Tally>,
    pub violations: Vec<String>,
    traces: Vec<String>,
}

impl Coverage {
    pub fn new(seed: u64, sites: Vec<Site>) -> Coverage {
        Coverage {
            seed,
            sites,
            ..Default::default()
        }
    }

    /// Account for one run of `scenario` under `plan`. Its writes must repeat
    /// those of `parent` (the run its crashes extend: the fault-free run, or the
    /// run of its first crash) up to its last crash, and its outcome must be the
    /// fault-free run's (`base`).
    pub fn run(
        &mut self,
        scenario: &Scenario,
        plan: &Plan,
        parent: &Record,
        base: &Record,
        r: &Record,
    ) {
        let mut problems: Vec<String> = r.violations.clone();
        for w in r.writes.iter().filter(|w| w.sent()) {
            self.note_write(w, false);
            if !self.sites.iter().any(|s| s.point == w.point) {
                problems.push(format!(
                    "a write at {} that the catalogue does not list",
                    w.point
                ));
            }
        }
        if !plan.crashes.is_empty() {
            self.crash_plans += 1;
            self.recrash_plans += usize::from(plan.crashes.len() > 1);
            problems.extend(self.crashed_at(plan, parent, r));
        }
        let tally = |m: &mut BTreeMap<Kind, Tally>, kind: Kind| {
            let t = m.entry(kind).or_default();
            t.plans += 1;
            t.fired += usize::from(r.fired == Fired::Yes);
            t.late += usize::from(r.fired == Fired::Lagged);
        };
        match plan.watch {
            WatchPlan::Stale { kind, .. } => tally(&mut self.stale, kind),
            WatchPlan::Unobserved { kind, .. } => tally(&mut self.unobserved, kind),
            WatchPlan::None => {}
        }
        if plan != &Plan::NONE {
            problems.extend(differences(&base.summary, &r.summary));
        }
        self.fail(scenario, plan, r, problems);
    }

    /// The write after which the plan's last crash came, counted as crashed.
    fn crashed_at(&mut self, plan: &Plan, parent: &Record, r: &Record) -> Option<String> {
        let Some(i) = plans::crash_point(plan, parent) else {
            return Some(format!(
                "{plan:?} crashes after more writes than its parent run made"
            ));
        };
        let crashed = &parent.writes[i];
        if crashed.landed() {
            *self.crashed.entry(crashed.point.clone()).or_default() += 1;
            self.note_write(crashed, true);
        }
        same_prefix(parent, r, i + 1)
    }

    /// An unobserved plan the issue names ("a run created then deleted", ...).
    pub fn named(&mut self, name: &'static str, r: &Record) {
        let t = self.named.entry(name).or_default();
        t.plans += 1;
        t.fired += usize::from(r.fired == Fired::Yes);
        t.late += usize::from(r.fired == Fired::Lagged);
    }

    /// The fault-free run itself, and a second one that must repeat it exactly.
    pub fn baseline(&mut self, scenario: &Scenario, base: &Record, again: &Record) {
        self.scenarios += 1;
        let mut problems = base.violations.clone();
        let lines = |r: &Record| {
            r.writes
                .iter()
                .map(|w| format!("{} {}", w.line, w.variant))
                .collect::<Vec<_>>()
        };
        if lines(base) != lines(again) || base.summary != again.summary {
            problems.push("two fault-free runs differ: the harness is not deterministic".into());
        }
        self.fail(scenario, &Plan::NONE, base, problems);
    }

    fn note_write(&mut self, w: &Write, crashed: bool) {
        let v = self
            .variants
            .entry(w.point.clone())
            .or_default()
            .entry(w.variant.clone())
            .or_default();
        match crashed {
            true => v.1 += 1,
            false => {
                v.0 += 1;
                *self.written.entry(w.point.clone()).or_default() += 1;
            }
        }
    }

    fn fail(&mut self, scenario: &Scenario, plan: &Plan, r: &Record, problems: Vec<String>) {
        if problems.is_empty() {
            return;
        }
        let at = format!(
            "scenario {}, seed {}, plan {plan:?}",
            scenario.name, self.seed
        );
        self.violations
            .extend(problems.iter().map(|p| format!("{at}: {p}")));
        if self.traces.len() < TRACED {
            self.traces
                .push(format!("{at}\n{}\n{}", problems.join("\n"), trace(r)));
        }
    }

    pub fn uncrashed(&self) -> Vec<&Site> {
        self.sites
            .iter()
            .filter(|s| !self.crashed.contains_key(&s.point))
            .collect()
    }

    /// The report, as `--nocapture` prints it and hack/verify.sh reads it.
    pub fn lines(&self) -> Vec<String> {
        let total = self.sites.len();
        let crashed = total - self.uncrashed().len();
        let mut out = vec![format!("sieve: {crashed}/{total} write points crashed")];
        out.extend(self.site_lines());
        let sum = |m: &BTreeMap<Kind, Tally>| m.values().map(|t| t.plans).sum::<usize>();
        out.push(format!(
            "sieve: {} crash plans ({} of them crash the recovery too), {} stale plans, {} unobserved plans, {} scenarios, seed {}",
            self.crash_plans, self.recrash_plans, sum(&self.stale), sum(&self.unobserved), self.scenarios, self.seed
        ));
        for (kind, t) in &self.stale {
            out.push(format!(
                "sieve:   stale {kind:?}: {} plans, {} served stale",
                t.plans, t.fired
            ));
        }
        for (kind, t) in &self.unobserved {
            out.push(format!(
                "sieve:   unobserved {kind:?}: {} plans, {} events never shown, {} only late",
                t.plans, t.fired, t.late
            ));
        }
        for (name, t) in &self.named {
            out.push(format!(
                "sieve:   unobserved {name}: {} plans, {} never shown",
                t.plans, t.fired
            ));
        }
        out.push("sieve:   Pod: watched only to wake keys (a pass here wakes every key), and read by quorum LISTs: no stale or unobserved plan applies".into());
        out.push(format!("sieve: {} violations", self.violations.len()));
        let shown = self.violations.iter().take(SHOWN);
        out.extend(shown.map(|v| format!("sieve: violation: {v}")));
        if self.violations.len() > SHOWN {
            out.push(format!(
                "sieve: ... and {} more violations",
                self.violations.len() - SHOWN
            ));
        }
        out.extend(self.traces.iter().map(|t| format!("sieve: trace of {t}")));
        out
    }

    fn site_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in &self.sites {
            let count = |m: &BTreeMap<WritePoint, usize>| m.get(&s.point).copied().unwrap_or(0);
            out.push(format!(
                "sieve:   {} {} {}: crashed {}, written {}",
                s.point,
                s.function,
                s.call,
                count(&self.crashed),
                count(&self.written)
            ));
            for (variant, (seen, crashed)) in self.variants.get(&s.point).into_iter().flatten() {
                out.push(format!(
                    "sieve:       {variant}: crashed {crashed}, written {seen}"
                ));
            }
        }
        out
    }
}

/// A run under a crash plan repeats the fault-free run's writes up to the crash.
fn same_prefix(base: &Record, r: &Record, n: usize) -> Option<String> {
    let key = |w: &Write| (w.line.clone(), w.variant.clone());
    let (a, b): (Vec<_>, Vec<_>) = (
        base.writes[..n].iter().map(key).collect(),
        r.writes.iter().take(n).map(key).collect(),
    );
    (a != b).then(|| format!("its first {n} writes are not the fault-free run's: {b:?}"))
}

/// The differential check: same grants, same final state as the fault-free run.
fn differences(base: &[String], r: &[String]) -> Vec<String> {
    let (a, b): (BTreeSet<&String>, BTreeSet<&String>) =
        (base.iter().collect(), r.iter().collect());
    let mut out: Vec<String> = a
        .difference(&b)
        .map(|l| format!("differs from the fault-free run: lacks `{l}`"))
        .collect();
    out.extend(
        b.difference(&a)
            .map(|l| format!("differs from the fault-free run: has `{l}`")),
    );
    if out.is_empty() && base != r {
        out.push("differs from the fault-free run: the grants came in another order".into());
    }
    out
}

/// The history of a run, one change a line, and its writes.
pub fn trace(r: &Record) -> String {
    let mut out: Vec<String> = r.log.iter().map(change_line).collect();
    out.push(format!("writes ({} restarts):", r.restarts));
    out.extend(
        r.writes
            .iter()
            .map(|w| format!("  {} {} -> {} [{}]", w.line, w.variant, w.code, w.point)),
    );
    out.join("\n")
}

fn change_line(c: &Change) -> String {
    let o = &c.object;
    let cond = &o["status"]["conditions"][0];
    let what = match c.key.kind {
        _ if c.deleted => "deleted".to_string(),
        Kind::Mutex | Kind::ClusterMutex => {
            let st = &o["status"];
            let names = |l: &serde_json::Value| -> Vec<String> {
                l.as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| e["run"]["name"].as_str().unwrap_or("?").to_string())
                    .collect()
            };
            format!(
                "holders={:?} queue={:?} lastToken={} finalizers={} deleting={}",
                names(&st["holders"]),
                names(&st["queue"]),
                st["lastToken"],
                o["metadata"]["finalizers"],
                !o["metadata"]["deletionTimestamp"].is_null()
            )
        }
        Kind::CustomRun => format!(
            "{}/{} spec.status={}",
            cond["status"], cond["reason"], o["spec"]["status"]
        ),
        Kind::PipelineRun => format!(
            "{}/{} spec.status={}",
            cond["status"], cond["reason"], o["spec"]["status"]
        ),
        Kind::Pod => format!("phase={}", o["status"]["phase"]),
        _ => format!("{}", o["data"]),
    };
    format!("  rv {} {:?} {}: {what}", c.rv, c.actor, c.key)
}
