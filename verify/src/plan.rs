//! From a decision to the writes of one sync, in lock.rs's order:
//! (still_current), finalizer on, the ledger record of an unprotected lock's
//! token, Mutex status, multi-key commit and revoke, grants, cancels, the other
//! runs, and an idle lock's finalizer off (ledger first; a deleting one then goes).

use crate::adapter::{Decision, Outcome, Phase, RunView};
use crate::config::Config;
use crate::view::{Fetched, multi_run, pr_name, run_index, run_ref};
use crate::world::{Ledger, MutexObj, Told, Write};

/// What a sync read and decided.
pub struct Read<'a> {
    pub mutex: &'a MutexObj,
    /// The floor the decision started above (lock_facts).
    pub token_floor: i64,
    pub from_cache: bool,
    pub fetched: &'a [Fetched],
    pub views: &'a [RunView],
}

pub fn writes(cfg: &Config, r: &Read<'_>, d: &Decision) -> Vec<Write> {
    let current = &r.mutex.status.0;
    let unchanged = d.status == **current;
    let in_use = !d.status.holders.is_empty()
        || !d.status.queue.is_empty()
        || !d.status.reservations.is_empty();
    let deleting = r.mutex.deleting;
    let (grants, others) = tells(cfg, r, d);
    let mut w = Vec::new();
    if r.from_cache
        && unchanged
        && (deleting || !others.is_empty() || !grants.is_empty() || !d.cancels.is_empty())
    {
        w.push(Write::CheckCurrent { rv: r.mutex.rv });
    }
    let protected = r.mutex.finalizer;
    if in_use && !deleting && !protected {
        w.push(Write::Protect { rv: r.mutex.rv });
    }
    // An unprotected lock may go at any time: a token it hands out is recorded first.
    let raised = d.status.last_token > current.last_token.max(r.token_floor);
    if !protected && !in_use && raised {
        w.push(Write::RecordFloor {
            token: d.status.last_token,
        });
    }
    if !unchanged {
        w.push(Write::Status {
            rv: r.mutex.rv,
            status: Ledger::new(d.status.clone()),
        });
    }
    w.extend(commits(cfg, r, d));
    w.extend(revokes(r, d));
    w.extend(grants);
    for c in &d.cancels {
        let pr = (0..cfg.runs.len()).find(|&i| pr_name(i) == c.pipeline_run);
        w.extend(pr.map(|i| Write::Cancel { pr: i as u8 }));
    }
    w.extend(others);
    if !in_use && (deleting || protected) {
        let kept_out = deleting && d.outcomes.iter().any(|(_, o)| *o == Outcome::MutexDeleting);
        w.push(Write::RecordIdle);
        w.push(Write::Unprotect { rv: 0, kept_out });
    }
    w
}

/// Tell::run for each outcome: only live runs as fetched, only what changes the
/// run (`Waiting` and the like are messages the protocol never reads: not
/// modelled). A run of several keys is told `Acquired` only by the commit.
fn tells(cfg: &Config, r: &Read<'_>, d: &Decision) -> (Vec<Write>, Vec<Write>) {
    let (mut grants, mut others) = (Vec::new(), Vec::new());
    for (run, outcome) in &d.outcomes {
        let Some(i) = run_index(&run.uid) else {
            continue;
        };
        let Some(f) = r
            .fetched
            .iter()
            .find(|f| f.run == i && f.deleted_holder.is_none())
        else {
            continue;
        };
        let live = r
            .views
            .iter()
            .any(|v| v.run.uid == run.uid && matches!(v.phase, Phase::Live { .. }));
        if !live {
            continue;
        }
        let multi = cfg.runs[i].keys.len() > 1;
        let told = match outcome {
            Outcome::Acquired { token, .. } if !multi => Told::Acquired(vec![*token]),
            Outcome::Superseded { .. } => Told::Ended { superseded: true },
            Outcome::Cancelled { .. }
            | Outcome::TimedOut
            | Outcome::NotAcquired { .. }
            | Outcome::QueueFull { .. }
            | Outcome::LockDeleted
            | Outcome::Cleared { .. }
            | Outcome::Deadlock { .. }
            | Outcome::StartedWithoutGrant => Told::Ended { superseded: false },
            _ => continue,
        };
        let write = Write::Tell {
            run: i as u8,
            run_rv: f.obj.rv,
            told: told.clone(),
        };
        match told {
            Told::Acquired(_) => grants.push(write),
            _ => others.push(write),
        }
    }
    (grants, others)
}

/// multikey::commit_reserved's candidates: runs this key now keeps a slot for
/// in their epoch, not yet `Acquired`. The other keys are read at the write.
fn commits(cfg: &Config, r: &Read<'_>, d: &Decision) -> Vec<Write> {
    let mut w = Vec::new();
    for f in r.fetched.iter().filter(|f| f.deleted_holder.is_none()) {
        let Some(m) = multi_run(cfg, &f.obj, f.run) else {
            continue;
        };
        let uid = run_ref(f.run).uid;
        let kept = d
            .status
            .reservations
            .iter()
            .any(|x| x.waiter.run.uid == uid && x.epoch == m.epoch);
        if kept && m.acquired.is_none() {
            w.push(Write::Commit {
                run: f.run as u8,
                run_rv: f.obj.rv,
                epoch: m.epoch,
                ledger: Ledger::new(d.status.clone()),
            });
        }
    }
    w
}

/// multikey::revoke: only for a run read in the revoked epoch, not `Acquired`.
fn revokes(r: &Read<'_>, d: &Decision) -> Vec<Write> {
    let mut w = Vec::new();
    for x in &d.revokes {
        let Some(i) = run_index(&x.run.uid) else {
            continue;
        };
        let Some(f) = r
            .fetched
            .iter()
            .find(|f| f.run == i && f.deleted_holder.is_none())
        else {
            continue;
        };
        if f.obj.epoch == x.epoch && !matches!(f.obj.told, Told::Acquired(_)) {
            w.push(Write::Revoke {
                run: i as u8,
                run_rv: f.obj.rv,
                epoch: x.epoch,
            });
        }
    }
    w
}
