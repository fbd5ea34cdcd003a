//! One write of a sync against the API server, with the API server's guards:
//! compare-and-swap on resourceVersions (409), the CRD's `lastToken` rule,
//! finalizers. A grant that lands starts a section, which the ghost records.

use crate::adapter::commit_step;
use crate::config::{Broken, Config};
use crate::view::{key_name, multi_run, pr_uid, run_ref, tokens_by_key};
use crate::world::{Api, Ghost, Ledger, MutexObj, Pod, PrPhase, State, Told, Write};
use std::collections::BTreeMap;

/// What a write came to: go on with the next, or end the sync (and whether
/// the next sync of the key reads the Mutex from the API server: a 409).
pub enum Done {
    Next,
    End { conflict: bool },
}

/// Apply the next write of replica `rep`'s sync.
pub fn step(cfg: &Config, s: &mut State, rep: usize) {
    let Some(mut sync) = s.replicas[rep].sync.take() else {
        return;
    };
    if sync.writes.is_empty() {
        return;
    }
    let w = sync.writes.remove(0);
    let k = sync.key as usize;
    match apply(cfg, s, rep, k, &w) {
        Done::Next if !sync.writes.is_empty() => {
            if let (Write::Protect { .. }, Some(Write::Status { rv, .. })) =
                (&w, sync.writes.first_mut())
            {
                // protect() returns the Mutex at its new resourceVersion.
                *rv = s.api.mutexes[k].as_ref().map_or(*rv, |m| m.rv);
            }
            s.replicas[rep].sync = Some(sync);
        }
        Done::Next => {}
        Done::End { conflict } => s.replicas[rep].retry[k] |= conflict,
    }
}

fn apply(cfg: &Config, s: &mut State, rep: usize, k: usize, w: &Write) -> Done {
    let conflict = Done::End { conflict: true };
    match w {
        Write::CheckCurrent { rv } => match &s.api.mutexes[k] {
            Some(m) if m.rv == *rv => Done::Next,
            _ => conflict,
        },
        Write::Protect { rv } => match &mut s.api.mutexes[k] {
            Some(m) if m.rv == *rv => {
                m.finalizer = true;
                m.rv += 1;
                Done::Next
            }
            Some(_) => conflict,
            None => Done::End { conflict: false },
        },
        Write::Status { rv, status } => write_status(cfg, s, rep, k, *rv, status),
        Write::Commit {
            run,
            run_rv,
            epoch,
            ledger,
        } => {
            commit(cfg, s, k, *run as usize, *run_rv, *epoch, ledger);
            Done::Next
        }
        Write::Revoke { run, run_rv, .. } => {
            let r = &mut s.api.runs[*run as usize];
            if r.live() && r.rv == *run_rv && !matches!(r.told, Told::Acquired(_)) {
                r.epoch += 1;
                r.bump();
            }
            Done::Next
        }
        Write::Tell { run, run_rv, told } => {
            let i = *run as usize;
            let r = &mut s.api.runs[i];
            if r.live() && r.rv == *run_rv {
                r.told = told.clone();
                r.bump();
                match told {
                    Told::Acquired(tokens) => grant(cfg, &mut s.api, &mut s.ghost, i, tokens),
                    _ => crate::env::fail(&mut s.api, i),
                }
            }
            Done::Next
        }
        Write::Cancel { pr } => {
            cancel_pr(&mut s.api, *pr as usize);
            Done::Next
        }
        Write::HandOver { kept_out } => hand_over(s, rep, k, *kept_out),
    }
}

/// replace_status: a compare-and-swap on the resourceVersion read (unless that
/// guard is removed), refused if it lowers `lastToken` (the CRD's CEL rule).
fn write_status(cfg: &Config, s: &mut State, rep: usize, k: usize, rv: u16, st: &Ledger) -> Done {
    let Some(m) = &mut s.api.mutexes[k] else {
        return Done::End { conflict: false };
    };
    if m.rv != rv && cfg.guarded(Broken::StatusCas) {
        return Done::End { conflict: true };
    }
    if st.0.last_token < m.status.0.last_token && cfg.guarded(Broken::TokenFloor) {
        return Done::End { conflict: false }; // 422: the API server refuses it
    }
    m.status = st.clone();
    m.rv += 1;
    // ctx.written: the replica decides on what it wrote, not an older cached copy.
    s.replicas[rep].cache.mutexes[k] = Some(m.clone());
    Done::Next
}

/// commit_reserved: read the run's other keys from the API server now; tell it
/// `Acquired` if every key keeps its slot, conditional on the run being unchanged.
fn commit(
    cfg: &Config,
    s: &mut State,
    k: usize,
    i: usize,
    run_rv: u8,
    epoch: i64,
    ledger: &Ledger,
) {
    let r = &s.api.runs[i];
    if !r.live() || r.rv != run_rv || r.epoch != epoch {
        return;
    }
    let Some(m) = multi_run(cfg, r, i) else {
        return;
    };
    let mut ledgers = BTreeMap::from([(key_name(k as u8), (*ledger.0).clone())]);
    for &o in cfg.runs[i].keys.iter().filter(|&&o| o as usize != k) {
        if let Some(x) = &s.api.mutexes[o as usize] {
            ledgers.insert(key_name(o), (*x.status.0).clone());
        }
    }
    let Some(tokens) = commit_step(&run_ref(i).uid, &m, &pr_uid(i), &ledgers) else {
        return;
    };
    let tokens = tokens_by_key(cfg, i, &tokens);
    let r = &mut s.api.runs[i];
    r.told = Told::Acquired(tokens.clone());
    r.bump();
    grant(cfg, &mut s.api, &mut s.ghost, i, &tokens);
}

/// A run told `Acquired` while its PipelineRun runs starts its section: its pod
/// runs from now until it ends. Fencing and supersede are judged here.
pub fn grant(cfg: &Config, api: &mut Api, ghost: &mut Ghost, i: usize, tokens: &[i64]) {
    let pr = &mut api.prs[i];
    if pr.phase != PrPhase::Running || pr.pod != Pod::None {
        return;
    }
    pr.pod = Pod::Live;
    let spec = &cfg.runs[i];
    for (&k, &t) in spec.keys.iter().zip(tokens) {
        let top = &mut ghost.top_token[k as usize];
        if t <= *top && ghost.broken.is_none() {
            ghost.broken = Some(format!(
                "Fencing: run-{i} starts a section of k{k} with token {t}, not above {top}"
            ));
        }
        *top = (*top).max(t);
    }
    let newest = &mut ghost.newest_granted[spec.group as usize];
    if spec.supersede && newest.is_some_and(|n| n as usize > i) && ghost.broken.is_none() {
        ghost.broken = Some(format!(
            "Supersede: run-{i} granted after newer run-{} of its group",
            newest.unwrap()
        ));
    }
    *newest = Some(newest.map_or(i as u8, |n| n.max(i as u8)));
}

/// cancel_pipeline_run: a PipelineRun that still runs is asked to stop, and
/// Tekton passes the cancel on to its lock run if that has not finished.
pub fn cancel_pr(api: &mut Api, i: usize) {
    if api.prs[i].phase != PrPhase::Running {
        return;
    }
    api.prs[i].phase = PrPhase::Stopping;
    let r = &mut api.runs[i];
    if r.live() && !r.done() && !r.cancel {
        r.cancel = true;
        r.bump();
    }
}

/// finalizer::release (read fresh, refused while holders or waiters remain),
/// remembering the token floor; then ensure_mutex if runs were kept out.
fn hand_over(s: &mut State, rep: usize, k: usize, kept_out: bool) -> Done {
    let Some(m) = &s.api.mutexes[k] else {
        return Done::End { conflict: false };
    };
    if !m.finalizer || !m.deleting {
        return Done::End { conflict: false };
    }
    if !m.status.0.holders.is_empty() || !m.status.0.queue.is_empty() {
        return Done::End { conflict: true };
    }
    let floor = &mut s.replicas[rep].floors[k];
    let top = floor.map_or(0, |f| f.1);
    *floor = Some((m.uid, top.max(m.status.0.last_token)));
    s.api.mutexes[k] = None;
    if kept_out {
        create_mutex(s, k);
    }
    Done::End { conflict: false }
}

/// writes::ensure_mutex: a new, empty Mutex (AlreadyExists if there is one).
pub fn create_mutex(s: &mut State, k: usize) -> bool {
    if s.api.mutexes[k].is_some() {
        return false;
    }
    let rv = crate::canon::fresh_mutex_rv(s, k);
    let uid = s.api.next_uid;
    s.api.next_uid += 1;
    s.api.mutexes[k] = Some(MutexObj {
        uid,
        rv,
        status: Ledger::default(),
        deleting: false,
        finalizer: false,
    });
    true
}
