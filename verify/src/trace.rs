//! Counterexamples as readable traces: each step, then what the API server holds.

use crate::action::Action;
use crate::config::Config;
use crate::model::LockModel;
use crate::world::{Life, MutexObj, Pod, PrPhase, State, Told, Write};
use std::fmt::Write as _;

/// What a write is, for the trace.
pub fn write_name(w: &Write) -> String {
    match w {
        Write::CheckCurrent { rv } => format!("check the Mutex is still at rv {rv}"),
        Write::Protect { rv } => format!("add finalizer (CAS rv {rv})"),
        Write::Status { rv, status } => {
            format!("write status (CAS rv {rv}): {}", ledger(&status.0))
        }
        Write::Commit { run, .. } => format!("commit run-{run} on all its keys"),
        Write::Revoke { run, epoch, .. } => format!("revoke run-{run}'s slots of epoch {epoch}"),
        Write::Tell { run, told, .. } => format!("tell run-{run} {}", told_name(told)),
        Write::Cancel { pr } => format!("cancel pr-{pr}"),
        Write::RecordFloor { token } => format!("record token {token} in the ledger"),
        Write::RecordIdle => "read fresh: idle, so record lastToken in the ledger".into(),
        Write::Unprotect { rv, kept_out } => {
            format!("take the finalizer off (CAS rv {rv}; recreate: {kept_out})")
        }
    }
}

fn told_name(t: &Told) -> String {
    match t {
        Told::Nothing => "-".into(),
        Told::Acquired(t) => format!("Acquired{t:?}"),
        Told::Ended { superseded: true } => "Superseded".into(),
        Told::Ended { .. } => "Ended".into(),
    }
}

fn ledger(st: &tekton_mutex_api::mutex::MutexStatus) -> String {
    let holders: Vec<String> = st
        .holders
        .iter()
        .map(|h| format!("{}#{}", h.run.name, h.token))
        .collect();
    let queue: Vec<&str> = st.queue.iter().map(|w| w.run.name.as_str()).collect();
    let kept: Vec<String> = st
        .reservations
        .iter()
        .map(|r| format!("{}#{}@{}", r.waiter.run.name, r.token, r.epoch))
        .collect();
    format!(
        "holders {holders:?} queue {queue:?} reserved {kept:?} lastToken {}",
        st.last_token
    )
}

fn mutex(m: &Option<MutexObj>) -> String {
    match m {
        None => "absent".into(),
        Some(m) => format!(
            "uid {} rv {}{}{} {}",
            m.uid,
            m.rv,
            if m.finalizer { " finalizer" } else { "" },
            if m.deleting { " DELETING" } else { "" },
            ledger(&m.status.0)
        ),
    }
}

/// The API server's state in a few lines.
pub fn summary(cfg: &Config, s: &State) -> String {
    let mut out = String::new();
    for (k, m) in s.api.mutexes.iter().enumerate() {
        let _ = writeln!(out, "      Mutex k{k}: {}", mutex(m));
    }
    let _ = writeln!(out, "      token ledger: {:?}", s.api.ledger);
    for i in 0..cfg.runs.len() {
        let (r, p) = (&s.api.runs[i], &s.api.prs[cfg.pr_of(i)]);
        if r.life == Life::NotYet && p.phase == PrPhase::NotYet {
            continue;
        }
        let pod = match p.pod {
            Pod::None => "",
            Pod::Live => " pod LIVE",
            Pod::Ended => " pod ended",
        };
        let _ = writeln!(
            out,
            "      pr-{} {:?}{pod}{}{}; run-{i} {:?} {}{}",
            cfg.pr_of(i),
            p.phase,
            if p.section_done { " section over" } else { "" },
            if p.started_by_tenant {
                " started by its tenant"
            } else {
                ""
            },
            r.life,
            told_name(&r.told),
            if r.cancel { " cancel" } else { "" }
        );
    }
    out
}

/// A whole counterexample: the steps from the initial state, replayed with
/// the resourceVersions as they come, each write named.
pub fn render(m: &LockModel, property: &str, actions: &[Action]) -> String {
    let cfg = &m.cfg;
    // hack/verify.sh --broken: the decision core itself gives one slot too many.
    let core = match std::env::var("TEKTON_MUTEX_BROKEN") {
        Ok(v) if cfg!(feature = "chaos-broken-capacity") => format!(", decision core broken: {v}"),
        _ => String::new(),
    };
    let mut out = format!(
        "Counterexample to {property} (config {}, guard removed: {:?}{core})\n",
        cfg.name, cfg.broken
    );
    let mut s = m.init();
    for (n, a) in actions.iter().enumerate() {
        let mut line = a.describe();
        if let Action::Write { rep, then_crash } = a
            && let Some(w) = s.replicas[*rep as usize]
                .sync
                .as_ref()
                .and_then(|x| x.writes.first())
        {
            let crash = if *then_crash { ", then crashes" } else { "" };
            line = format!("replica {rep}: {}{crash}", write_name(w));
        }
        let _ = writeln!(out, "  {:>2}. {line}", n + 1);
        let Some(next) = m.apply_raw(&s, a) else {
            let _ = writeln!(out, "      (step not enabled on replay)");
            break;
        };
        s = next;
        if matters(a) {
            out.push_str(&summary(cfg, &s));
        }
    }
    if let Some(b) = &s.ghost.broken {
        let _ = writeln!(out, "  broken: {b}");
    }
    if let Some(x) = crate::props::over_capacity(cfg, &s) {
        let _ = writeln!(out, "  broken: Exclusion: {x}");
    }
    if property == crate::props::NO_LOST_WAITER
        && let Some(x) = crate::props::lost_waiter(cfg, &s)
    {
        let _ = writeln!(
            out,
            "  broken: {x} (calm continuation: every sync done, every watch event in, every section and grace period over)"
        );
    }
    out
}

/// Steps after which the trace shows the API server's state.
fn matters(a: &Action) -> bool {
    !matches!(a, Action::Sync { .. } | Action::Relist { .. })
}
