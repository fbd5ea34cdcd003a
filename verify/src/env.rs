//! Everything outside the controller: Tekton moving PipelineRuns and pods
//! along, and users disturbing the lock.

use crate::config::{Broken, Config};
use crate::tekton;
use crate::world::{Ledger, Life, Pod, PrPhase, State, Told};
use tekton_mutex_api::mutex::{MAX_TOKEN, MutexStatus};

/// What Tekton, a pod or a user does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Env {
    /// A user starts PipelineRun i; Tekton creates its lock run.
    Create(u8),
    /// The guarded task of PipelineRun i ends; the PipelineRun is done.
    Finish(u8),
    /// A stopping PipelineRun is marked done (its pods may still be in their grace period).
    Stopped(u8),
    /// The grace period of a stopped or deleted PipelineRun's pod is over.
    PodEnds(u8),
    /// A user cancels PipelineRun i.
    Cancel(u8),
    /// A user deletes PipelineRun i (its lock run goes with it).
    DeletePr(u8),
    /// A user deletes the lock run of PipelineRun i.
    DeleteRun(u8),
    /// The waiting lock run i times out.
    Timeout(u8),
    /// The tasks PipelineRun i's `release-after` lock run names end (their pods too).
    SectionEnds(u8),
    /// A user deletes the Mutex of key k.
    DeleteMutex(u8),
    /// A user empties the Mutex's status (holders, queue, marks, reservations).
    Wipe(u8),
    /// A tenant writes, on its own queued PipelineRun i, a record claiming a grant with
    /// the largest token (the record is an annotation it may edit).
    Forge(u8),
    /// A tenant clears `spec.status` on its own queued PipelineRun i while it waits: Tekton
    /// starts it, grant or not (refused by the admission policy config/401).
    StartOwn(u8),
    /// A tenant raises key k's entry in its namespace's token ledger (allowed: tokens skip).
    RaiseLedger(u8),
    /// A tenant removes key k's entry from the token ledger, or deletes the ledger: the
    /// floor is 0 again (refused by the admission policy config/402).
    LowerLedger(u8),
}

impl Env {
    /// Does it spend the trace's budget of disturbances?
    pub fn disturbs(self) -> bool {
        !matches!(
            self,
            Env::Create(_)
                | Env::Finish(_)
                | Env::Stopped(_)
                | Env::PodEnds(_)
                | Env::SectionEnds(_)
        )
    }
}

pub fn candidates(cfg: &Config, out: &mut Vec<Env>) {
    let u = cfg.users;
    for i in 0..cfg.runs.len() as u8 {
        // A PipelineRun queued as a whole has no lock run of its own to delete.
        let lock_run = !cfg.runs[i as usize].pending;
        out.extend((u.delete_run && lock_run).then_some(Env::DeleteRun(i)));
        out.extend((u.forge && !lock_run).then_some(Env::Forge(i)));
        out.extend((u.start_own && !lock_run).then_some(Env::StartOwn(i)));
        out.extend(u.timeout.then_some(Env::Timeout(i)));
        if !cfg.is_pr(i as usize) {
            continue; // a sibling lock run: its PipelineRun's events are its own
        }
        out.extend([
            Env::Create(i),
            Env::Finish(i),
            Env::Stopped(i),
            Env::PodEnds(i),
        ]);
        let sections = cfg
            .runs_of_pr(i as usize)
            .any(|j| cfg.runs[j].release_after);
        out.extend(sections.then_some(Env::SectionEnds(i)));
        out.extend(u.cancel.then_some(Env::Cancel(i)));
        out.extend(u.delete_pr.then_some(Env::DeletePr(i)));
    }
    for k in 0..cfg.keys {
        out.extend(u.delete_mutex.then_some(Env::DeleteMutex(k)));
        out.extend(u.wipe.then_some(Env::Wipe(k)));
        if u.ledger {
            out.extend([Env::RaiseLedger(k), Env::LowerLedger(k)]);
        }
    }
}

/// Apply `e`; false if it cannot happen now.
pub fn apply(cfg: &Config, s: &mut State, e: Env) -> bool {
    let api = &mut s.api;
    match e {
        Env::Create(i)
        | Env::Finish(i)
        | Env::Stopped(i)
        | Env::PodEnds(i)
        | Env::SectionEnds(i)
        | Env::Cancel(i)
        | Env::DeletePr(i) => cfg.is_pr(i as usize) && pipeline_run(cfg, api, e, i as usize),
        Env::DeleteRun(i) => {
            let run = &mut api.runs[i as usize];
            !cfg.runs[i as usize].pending && run.live() && {
                run.life = Life::Deleted;
                run.bump();
                tekton::fail(cfg, api, i as usize);
                true
            }
        }
        Env::Timeout(i) => {
            let (run, t) = (&api.runs[i as usize], &mut api.timed_out[i as usize]);
            let can = run.live() && !run.done() && !*t;
            *t |= can;
            can
        }
        Env::DeleteMutex(k) => match &mut api.mutexes[k as usize] {
            Some(m) if m.deleting => false,
            Some(m) if m.finalizer => {
                m.deleting = true;
                m.rv += 1;
                true
            }
            Some(_) => {
                api.mutexes[k as usize] = None;
                true
            }
            None => false,
        },
        Env::Wipe(k) => wipe(cfg, api, k as usize),
        Env::Forge(i) => forge(cfg, api, i as usize),
        Env::StartOwn(i) => start_own(cfg, api, i as usize),
        Env::RaiseLedger(k) => {
            api.ledger[k as usize] += 1;
            true
        }
        Env::LowerLedger(k) => {
            let entry = &mut api.ledger[k as usize];
            // Policy 402: nobody but the controller lowers an entry or removes it.
            !cfg.guarded(Broken::NoAdmission) && *entry != 0 && {
                *entry = 0;
                true
            }
        }
    }
}

/// A tenant starts its queued PipelineRun i by hand, unless policy 401 refuses it. Its tasks
/// run at once (the whole PipelineRun is the guarded section). The record's version moves
/// with it: it is the same object, so a grant decided on the Pending one gets a 409.
fn start_own(cfg: &Config, api: &mut crate::world::Api, i: usize) -> bool {
    let pr = &mut api.prs[i];
    let refused = cfg.guarded(Broken::NoAdmission);
    !refused && pr.phase == PrPhase::Pending && {
        pr.phase = PrPhase::Running;
        pr.pod = Pod::Live;
        pr.started_by_tenant = true;
        api.runs[i].bump();
        true
    }
}

/// A tenant's record on its queued PipelineRun i: `Acquired`, with the largest token.
fn forge(cfg: &Config, api: &mut crate::world::Api, i: usize) -> bool {
    let forged = Told::Acquired(vec![MAX_TOKEN; cfg.runs[i].keys.len()]);
    let run = &mut api.runs[i];
    run.live() && run.told != forged && {
        run.told = forged;
        run.bump();
        true
    }
}

/// What happens to PipelineRun p (and its lock runs): Tekton's, a pod's or a user's move.
fn pipeline_run(cfg: &Config, api: &mut crate::world::Api, e: Env, p: usize) -> bool {
    match e {
        Env::Create(_) => {
            let created = tekton(api, e, p);
            if created && cfg.runs[p].pending {
                api.prs[p].phase = PrPhase::Pending;
            }
            for j in cfg.runs_of_pr(p).filter(|&j| created && j != p) {
                api.runs[j].life = Life::Live;
                api.runs[j].bump();
            }
            created
        }
        Env::SectionEnds(_) => {
            let pr = &mut api.prs[p];
            let ends = pr.phase == PrPhase::Running && pr.pod == Pod::Live && !pr.section_done;
            pr.section_done |= ends;
            ends
        }
        Env::Cancel(_) => {
            // A pending PipelineRun may be cancelled too: Tekton ends it unstarted.
            let running = matches!(api.prs[p].phase, PrPhase::Running | PrPhase::Pending);
            running && {
                crate::tekton::cancel_pr(cfg, api, p);
                true
            }
        }
        Env::DeletePr(_) => delete_pr(cfg, api, p),
        _ => tekton(api, e, p),
    }
}

/// A user empties Mutex k's status.
fn wipe(cfg: &Config, api: &mut crate::world::Api, k: usize) -> bool {
    let Some(m) = &mut api.mutexes[k] else {
        return false;
    };
    // The CRD defaults lastToken to 0 and its CEL rule refuses a lower one:
    // a wipe that the API server takes keeps it.
    let keep = if cfg.guarded(Broken::TokenFloor) {
        m.status.0.last_token
    } else {
        0
    };
    let wiped = Ledger::new(MutexStatus {
        last_token: keep,
        ..MutexStatus::default()
    });
    wiped != m.status && {
        m.status = wiped;
        m.rv += 1;
        true
    }
}

/// Tekton's and the pods' own moves.
fn tekton(api: &mut crate::world::Api, e: Env, i: usize) -> bool {
    let (pr, run) = (&mut api.prs[i], &mut api.runs[i]);
    match e {
        Env::Create(_) if pr.phase == PrPhase::NotYet => {
            pr.phase = PrPhase::Running;
            run.life = Life::Live;
            run.bump();
        }
        Env::Finish(_) if pr.pod == Pod::Live && pr.phase == PrPhase::Running => {
            pr.pod = Pod::Ended;
            pr.phase = PrPhase::Done;
        }
        Env::Stopped(_) if pr.phase == PrPhase::Stopping => pr.phase = PrPhase::Done,
        Env::PodEnds(_) if pr.pod == Pod::Live && pr.phase != PrPhase::Running => {
            pr.pod = Pod::Ended
        }
        _ => return false,
    }
    true
}

/// A user deletes PipelineRun p; its lock runs go with it.
fn delete_pr(cfg: &Config, api: &mut crate::world::Api, p: usize) -> bool {
    let pr = &mut api.prs[p];
    if matches!(pr.phase, PrPhase::NotYet | PrPhase::Deleted) {
        return false;
    }
    if cfg.users.prune_only && (pr.phase != PrPhase::Done || pr.pod == Pod::Live) {
        return false;
    }
    pr.phase = PrPhase::Deleted;
    for j in cfg.runs_of_pr(p) {
        let run = &mut api.runs[j];
        if run.live() {
            run.life = Life::Deleted;
            run.bump();
        }
    }
    true
}
