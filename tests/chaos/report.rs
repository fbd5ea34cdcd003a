//! The campaign's report: rounds, runs, faults by kind, violations by invariant (seed and a
//! timeline excerpt each), stuck runs, and the handover latency distribution.

use super::checker::Violation;
use super::round::{Line, RoundResult};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Lines of the round's timeline around a violation (all of its end for liveness and reasons).
pub fn excerpt(timeline: &[Line], v: &Violation) -> Vec<String> {
    let names: Vec<&str> = v
        .detail
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| (w.starts_with('c') || w.starts_with('p')) && w.contains('-') && w.len() > 4)
        .collect();
    let near = |t: u64| {
        if v.at_ms == u64::MAX {
            true
        } else {
            t + 8_000 >= v.at_ms && t <= v.at_ms + 3_000
        }
    };
    let of_key = format!("key {} ", v.key);
    let relevant = |l: &str| {
        l.starts_with("FAULT") || l.contains(&of_key) || names.iter().any(|n| l.contains(n))
    };
    let lines: Vec<String> = timeline
        .iter()
        .filter(|(t, l)| near(*t) && relevant(l))
        .map(|(t, l)| format!("      +{:>7.3}s  {l}", *t as f64 / 1000.0))
        .collect();
    let skip = lines.len().saturating_sub(30);
    lines.into_iter().skip(skip).collect()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn distribution(mut v: Vec<u64>) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.sort_unstable();
    format!(
        "n={} min={} p50={} p90={} max={} ms",
        v.len(),
        v[0],
        percentile(&v, 0.5),
        percentile(&v, 0.9),
        v[v.len() - 1]
    )
}

/// The report; `mode` says what was run if not the product as built (unguarded, broken build).
pub fn render(results: &[RoundResult], faults_arg: &str, mode: &str) -> String {
    let mut s = String::new();
    let runs: usize = results.iter().map(|r| r.runs).sum();
    let wall: f64 = results.iter().map(|r| r.wall.as_secs_f64()).sum();
    let _ = writeln!(s, "\n=== chaos campaign report ===");
    let _ = writeln!(
        s,
        "rounds: {}   runs: {runs}   wall: {wall:.0}s   faults: {faults_arg}{}",
        results.len(),
        if mode.is_empty() {
            String::new()
        } else {
            format!("   ({mode})")
        }
    );
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    for r in results {
        for (k, n) in &r.faults {
            *faults.entry(k).or_default() += n;
        }
    }
    let _ = writeln!(s, "faults injected, by kind:");
    for (k, n) in &faults {
        let _ = writeln!(s, "  {k:<22} {n}");
    }
    let mut by_inv: BTreeMap<String, Vec<(&RoundResult, &Violation)>> = BTreeMap::new();
    for r in results {
        for v in &r.violations {
            by_inv
                .entry(v.invariant.to_string())
                .or_default()
                .push((r, v));
        }
    }
    let total: usize = by_inv.values().map(Vec::len).sum();
    let _ = writeln!(s, "violations: {total}");
    for (inv, list) in &by_inv {
        let mut seeds: Vec<u64> = list.iter().map(|(r, _)| r.seed).collect();
        seeds.dedup();
        let _ = writeln!(s, "  {inv}: {} (seeds {seeds:?})", list.len());
    }
    for (inv, list) in &by_inv {
        for (r, v) in list {
            let _ = writeln!(s, "\n  [{inv}] seed {} key {}: {}", r.seed, v.key, v.detail);
            for line in excerpt(&r.timeline, v) {
                let _ = writeln!(s, "{line}");
            }
        }
    }
    let _ = writeln!(s, "\nstuck runs:");
    let mut any_stuck = false;
    for r in results.iter().filter(|r| !r.stuck.is_empty()) {
        any_stuck = true;
        let _ = writeln!(s, "  seed {}: {}", r.seed, r.stuck.join(", "));
    }
    if !any_stuck {
        let _ = writeln!(s, "  none");
    }
    let all = results.iter().flat_map(|r| r.handovers.iter());
    let near: Vec<u64> = all.clone().filter(|(_, f)| *f).map(|(l, _)| *l).collect();
    let calm: Vec<u64> = all.filter(|(_, f)| !*f).map(|(l, _)| *l).collect();
    let _ = writeln!(
        s,
        "\nhandover latency (previous deploy's end mark to the next one's start mark, \
         capacity-1 keys; includes Tekton starting the next pod):"
    );
    let _ = writeln!(s, "  with a fault within 5 s: {}", distribution(near));
    let _ = writeln!(s, "  without:                 {}", distribution(calm));
    fairness(&mut s, results);
    s
}

/// The `cluster-tenants` rounds' fairness figure: per tenant, over rounds, the longest its
/// earliest waiter waited for the tenant's next grant; and the most runs of another tenant,
/// created later, that passed one run.
fn fairness(s: &mut String, results: &[RoundResult]) {
    let figures: Vec<_> = results.iter().filter_map(|r| r.fairness.as_ref()).collect();
    if figures.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\nfairness ({} cluster-tenants rounds; per round, the longest a tenant's earliest waiter \
         waited for the tenant's next grant):",
        figures.len()
    );
    let mut by_role: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for f in &figures {
        for (role, ms) in &f.turn_wait_ms {
            by_role.entry(role).or_default().push(*ms);
        }
    }
    for (role, waits) in by_role {
        let _ = writeln!(s, "  {role:<7} {}", distribution(waits));
    }
    let most = figures.iter().map(|f| f.most_overtakers).max().unwrap_or(0);
    let _ = writeln!(
        s,
        "  most runs of another tenant, created later, granted before one run: {most}"
    );
}
