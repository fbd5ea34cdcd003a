//! One write of a sync against the API server, with the API server's guards:
//! compare-and-swap on resourceVersions (409), the CRD's `lastToken` rule,
//! finalizers. A grant that lands starts a section, which the ghost records.

use crate::adapter::commit_step;
use crate::config::{Broken, Config};
use crate::tekton;
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
            let now = s.api.mutexes[k].as_ref().map(|m| m.rv);
            match (&w, sync.writes.first_mut()) {
                // protect() returns the Mutex at its new resourceVersion.
                (Write::Protect { .. }, Some(Write::Status { rv, .. }))
                // unprotect's patch carries the version its fresh read saw.
                | (Write::RecordIdle, Some(Write::Unprotect { rv, .. })) => {
                    *rv = now.unwrap_or(*rv);
                }
                _ => {}
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
                    Told::Acquired(tokens) => {
                        start_pending(&mut s.api, cfg.pr_of(i));
                        grant(cfg, &mut s.api, &mut s.ghost, i, tokens)
                    }
                    _ => tekton::fail(cfg, &mut s.api, i),
                }
            }
            Done::Next
        }
        Write::Cancel { pr } => {
            tekton::cancel_pr(cfg, &mut s.api, *pr as usize);
            Done::Next
        }
        Write::RecordFloor { token } => {
            s.api.ledger[k] = s.api.ledger[k].max(*token);
            Done::Next
        }
        Write::RecordIdle => record_idle(s, k),
        Write::Unprotect { rv, kept_out } => unprotect(s, k, *rv, *kept_out),
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
    let Some(tokens) = commit_step(&run_ref(i).uid, &m, &pr_uid(cfg.pr_of(i)), &ledgers) else {
        return;
    };
    let tokens = tokens_by_key(cfg, i, &tokens);
    let r = &mut s.api.runs[i];
    r.told = Told::Acquired(tokens.clone());
    r.bump();
    grant(cfg, &mut s.api, &mut s.ghost, i, &tokens);
}

/// The grant of a PipelineRun queued as a whole clears its `spec.status` in the
/// same patch (conditional on the version read): Tekton starts it.
fn start_pending(api: &mut Api, p: usize) {
    if api.prs[p].phase == PrPhase::Pending {
        api.prs[p].phase = PrPhase::Running;
    }
}

/// A run told `Acquired` while its PipelineRun runs starts its section: its pod
/// runs from now until it ends. Fencing and supersede are judged here.
pub fn grant(cfg: &Config, api: &mut Api, ghost: &mut Ghost, i: usize, tokens: &[i64]) {
    let pr = &mut api.prs[cfg.pr_of(i)];
    if pr.phase != PrPhase::Running || pr.pod != Pod::None {
        return;
    }
    pr.pod = Pod::Live;
    let spec = &cfg.runs[i];
    for (&k, &t) in spec.keys.iter().zip(tokens) {
        let verdict = ghost.fences[k as usize].admit(t);
        if let (Err(why), None) = (verdict, &ghost.broken) {
            ghost.broken = Some(format!("Fencing: run-{i} starts a section of k{k}: {why}"));
        }
    }
    let verdict = ghost.newest_granted[spec.group as usize].admit(&(i as u8));
    if let (true, Err(why), None) = (spec.supersede, verdict, &ghost.broken) {
        ghost.broken = Some(format!(
            "Supersede: run-{i} granted after a newer run of its group ({why})"
        ));
    }
}

/// finalizer::unprotect up to its patch: read fresh, refused (409) while
/// anyone is in the Mutex; its `lastToken` goes in the ledger first.
fn record_idle(s: &mut State, k: usize) -> Done {
    let Some(m) = &s.api.mutexes[k] else {
        return Done::End { conflict: false };
    };
    if !m.finalizer {
        return Done::End { conflict: false };
    }
    let st = &m.status.0;
    if !st.holders.is_empty() || !st.queue.is_empty() || !st.reservations.is_empty() {
        return Done::End { conflict: true };
    }
    s.api.ledger[k] = s.api.ledger[k].max(st.last_token);
    Done::Next
}

/// finalizer::unprotect's patch (a CAS on the version read), then hand_over: a
/// Mutex being deleted goes once its finalizer is off, and is created again if
/// runs were kept out.
fn unprotect(s: &mut State, k: usize, rv: u16, kept_out: bool) -> Done {
    let Some(m) = &mut s.api.mutexes[k] else {
        return Done::End { conflict: false };
    };
    if m.rv != rv {
        return Done::End { conflict: true };
    }
    if !m.deleting {
        m.finalizer = false;
        m.rv += 1;
        return Done::End { conflict: false };
    }
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
