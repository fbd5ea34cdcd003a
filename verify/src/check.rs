//! Running the checker on a configuration and reporting what it found.

use crate::config::{Broken, Config};
use crate::model::LockModel;
use crate::props;
use crate::trace;
use stateright::{Checker, HasDiscoveries, Model};
use std::time::{Duration, Instant};
use tekton_mutex_core::decide::guard_switches;

pub struct Report {
    pub config: &'static str,
    /// Unique states explored.
    pub states: usize,
    pub depth: usize,
    pub time: Duration,
    /// Broken properties, each with its trace.
    pub violations: Vec<(&'static str, String)>,
}

/// Breadth-first over every interleaving; with `stop_at_first`, until a property breaks.
pub fn run(cfg: Config, threads: usize, stop_at_first: bool) -> Report {
    run_bounded(cfg, threads, stop_at_first, None)
}

/// As [`run`], stopping after about `max` states if given (for measuring).
/// A full check is depth-first with the replicas' symmetry reduced; a search
/// for a counterexample is breadth-first, for the shortest trace.
pub fn run_bounded(cfg: Config, threads: usize, stop_at_first: bool, max: Option<usize>) -> Report {
    // The decision core's guard switches are process-wide: one check at a time sets them.
    static SWITCHES: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = SWITCHES.lock().unwrap_or_else(|e| e.into_inner());
    guard_switches::set_one_hold_per_pipeline_run(cfg.guarded(Broken::OneHold));
    guard_switches::set_queued_records_trusted(!cfg.guarded(Broken::TrustRecord));
    let start = Instant::now();
    let (name, depth) = (cfg.name, cfg.max_depth);
    let finish = if stop_at_first {
        HasDiscoveries::AnyFailures
    } else {
        HasDiscoveries::All
    };
    let mut builder = LockModel::new(cfg)
        .checker()
        .threads(threads)
        .finish_when(finish);
    if let Some(max) = max {
        builder = builder.target_state_count(max);
    }
    if let Some(d) = depth {
        builder = builder.target_max_depth(d);
    }
    if stop_at_first {
        report(builder.spawn_bfs().join(), name, start)
    } else {
        report(
            builder
                .symmetry_fn(crate::model::representative)
                .spawn_dfs()
                .join(),
            name,
            start,
        )
    }
}

fn report(checker: impl Checker<LockModel>, name: &'static str, start: Instant) -> Report {
    let model = checker.model();
    let mut violations = Vec::new();
    for p in props::ALL {
        if let Some(path) = checker.discovery(p) {
            violations.push((p, trace::render(model, p, &path.into_actions())));
        }
    }
    Report {
        config: name,
        states: checker.unique_state_count(),
        depth: checker.max_depth(),
        time: start.elapsed(),
        violations,
    }
}

impl Report {
    pub fn line(&self) -> String {
        format!(
            "config {}: {} states, depth {}, {:.1} s, {} counterexample(s){}",
            self.config,
            self.states,
            self.depth,
            self.time.as_secs_f64(),
            self.violations.len(),
            self.violations
                .iter()
                .map(|v| format!(" [{}]", v.0))
                .collect::<String>()
        )
    }
}
