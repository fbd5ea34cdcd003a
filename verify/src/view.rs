//! The model's fetch and view layer: what sync.rs reads (cache first, the API
//! server where the product reads it) and how src/view.rs maps it to the
//! decision core's `RunView`s. Re-done here because the product's view takes
//! Kubernetes objects; the mapping follows src/view.rs line by line.

use crate::adapter::{MultiKeyRun, MultiKeys, Parent, ParentState, Phase, RunView, Timeout};
use crate::config::{Broken, Config};
use crate::world::{Api, Cache, Life, MutexObj, Pod, PrObj, PrPhase, RunObj, Told};
use jiff::{SignedDuration, Timestamp};
use std::collections::BTreeMap;
use tekton_mutex_api::mutex::{Age, RunKind, RunRef, Supersede};
use tekton_mutex_core::model::CancelMode;
use tekton_mutex_core::observe::pending;
use tekton_mutex_core::release_after;

/// Time is abstract: every decision happens at the same instant (timeouts are
/// an event of their own), so statuses do not differ by when they were written.
pub fn now() -> Timestamp {
    base() + SignedDuration::from_secs(1000)
}

fn base() -> Timestamp {
    Timestamp::from_second(1_700_000_000).unwrap()
}

pub fn key_name(k: u8) -> String {
    format!("k{k}")
}

pub fn run_ref(i: usize) -> RunRef {
    RunRef {
        kind: RunKind::CustomRun,
        name: format!("run-{i}"),
        uid: format!("run-{i}-uid"),
    }
}

pub fn pr_name(i: usize) -> String {
    format!("pr-{i}")
}

pub fn pr_uid(i: usize) -> String {
    format!("pr-{i}-uid")
}

/// The run index a uid stands for.
pub fn run_index(uid: &str) -> Option<usize> {
    uid.strip_prefix("run-")?.strip_suffix("-uid")?.parse().ok()
}

/// A run of the key as fetched: its object and its PipelineRun (None: gone).
#[derive(Clone, Debug)]
pub struct Fetched {
    pub run: usize,
    pub obj: RunObj,
    pub parent: Option<PrObj>,
    pub pods_alive: bool,
    /// Its `release-after` section is over (mark_done_sections: only for a run told Acquired).
    pub section_done: bool,
    /// A holder whose lock run was deleted (sync.rs's deleted_holders).
    pub deleted_holder: Option<tekton_mutex_api::mutex::Holder>,
}

/// fetch_runs + mark_draining_holders + deleted_holders for key `k`, read
/// from `cache` (and `api` where the product reads the API server).
pub fn fetch(cfg: &Config, cache: &Cache, api: &Api, k: u8, m: &MutexObj) -> Vec<Fetched> {
    let st = &m.status.0;
    let named = |i: usize| {
        let uid = run_ref(i).uid;
        st.holders.iter().any(|h| h.run.uid == uid)
            || st.queue.iter().any(|w| w.run.uid == uid)
            || st.reservations.iter().any(|r| r.waiter.run.uid == uid)
    };
    let mut out = Vec::new();
    for i in cfg.runs_of(k) {
        let obj = match &cache.runs[i] {
            o if o.live() => o.clone(),
            _ if named(i) && api.runs[i].live() => api.runs[i].clone(),
            _ => continue,
        };
        let parent = fetch_parent(cache, api, cfg.pr_of(i));
        let section_done = cfg.runs[i].release_after
            && matches!(obj.told, Told::Acquired(_))
            && parent.as_ref().is_some_and(|p| p.section_done);
        // members.rs's may_hold: a holder, a reserved run, a sibling of a holder's
        // token, or a grant the status does not know of.
        let uid = run_ref(i).uid;
        let claimed = token_for(cfg, &obj, i, k);
        // members.rs: a queued PipelineRun's record is vouched for by the status.
        let told = match cfg.runs[i].pending && cfg.guarded(Broken::TrustRecord) {
            true => pending::vouched_token(claimed, &uid, st),
            false => claimed,
        };
        let holds = st.holders.iter().any(|h| h.run.uid == uid)
            || st.reservations.iter().any(|r| r.waiter.run.uid == uid)
            || told.is_some_and(|t| t > st.last_token || st.holders.iter().any(|h| h.token == t));
        let ended = parent.as_ref().is_none_or(|p| p.phase == PrPhase::Done);
        let pods_alive = holds && ended && pods_alive(cfg, api, cfg.pr_of(i));
        out.push(Fetched {
            run: i,
            obj,
            parent,
            pods_alive,
            section_done,
            deleted_holder: None,
        });
    }
    hold_sharers(cfg, api, k, &mut out);
    // members.rs's deleted_holders: holders, and runs slots are reserved for.
    let reserved = st
        .reservations
        .iter()
        .map(|r| reserved_as_holder(&r.waiter, r.token));
    for h in st.holders.iter().cloned().chain(reserved) {
        let Some(i) = run_index(&h.run.uid) else {
            continue;
        };
        if out.iter().any(|f| f.run == i) || h.pipeline_run_uid.is_none() {
            continue;
        }
        let parent = fetch_parent(cache, api, cfg.pr_of(i));
        let ended = parent.as_ref().is_none_or(|p| p.phase == PrPhase::Done);
        let pods_alive = ended && pods_alive(cfg, api, cfg.pr_of(i));
        let obj = RunObj {
            life: Life::Deleted,
            ..RunObj::new()
        };
        out.push(Fetched {
            run: i,
            obj,
            parent,
            pods_alive,
            section_done: false,
            deleted_holder: Some(h),
        });
    }
    out
}

/// members.rs's hold_sharers: where a fetched run's `release-after` section is
/// over, its PipelineRun's other lock runs told `Acquired` with its token, read
/// from the API server (the cache may not show them).
fn hold_sharers(cfg: &Config, api: &Api, k: u8, out: &mut Vec<Fetched>) {
    let over: Vec<(usize, Option<i64>, Option<PrObj>)> = out
        .iter()
        .filter(|f| f.section_done)
        .map(|f| {
            (
                cfg.pr_of(f.run),
                token_for(cfg, &f.obj, f.run, k),
                f.parent.clone(),
            )
        })
        .collect();
    for (p, token, parent) in over {
        for j in cfg.runs_of_pr(p) {
            let obj = &api.runs[j];
            let shares = obj.live() && token.is_some() && token_for(cfg, obj, j, k) == token;
            if !shares || out.iter().any(|f| f.run == j) {
                continue;
            }
            out.push(Fetched {
                run: j,
                obj: obj.clone(),
                parent: parent.clone(),
                pods_alive: false,
                section_done: false,
                deleted_holder: None,
            });
        }
    }
}

/// A reserved run as the stand-in for its PipelineRun (only its names are read).
fn reserved_as_holder(
    w: &tekton_mutex_api::mutex::Waiter,
    token: i64,
) -> tekton_mutex_api::mutex::Holder {
    tekton_mutex_api::mutex::Holder {
        run: w.run.clone(),
        pipeline_run: w.pipeline_run.clone(),
        pipeline_run_uid: w.pipeline_run_uid.clone(),
        token,
        since: w.age.created,
        waited_seconds: 0,
        group: w.group.clone(),
        age: w.age.clone(),
        supersede: w.supersede,
    }
}

/// sync.rs's fetch_parent (of PipelineRun i): the cache, else the API; one being deleted is gone.
fn fetch_parent(cache: &Cache, api: &Api, i: usize) -> Option<PrObj> {
    let present = |p: &PrObj| !matches!(p.phase, PrPhase::NotYet | PrPhase::Deleted);
    let p = if present(&cache.prs[i]) {
        &cache.prs[i]
    } else {
        &api.prs[i]
    };
    present(p).then(|| p.clone())
}

/// The pod check before release, asked of the API server (never a cache).
fn pods_alive(cfg: &Config, api: &Api, i: usize) -> bool {
    cfg.guarded(Broken::PodCheck) && api.prs[i].pod == Pod::Live
}

/// This key's token in what run `i` was told, if `Acquired`.
pub fn token_for(cfg: &Config, obj: &RunObj, i: usize, k: u8) -> Option<i64> {
    let Told::Acquired(tokens) = &obj.told else {
        return None;
    };
    let at = cfg.runs[i].keys.iter().position(|&x| x == k)?;
    tokens.get(at).copied()
}

/// src/view.rs's member_view (or deleted_holder_view) for one fetched run.
pub fn run_view(cfg: &Config, api: &Api, f: &Fetched, k: u8) -> RunView {
    let (i, p) = (f.run, cfg.pr_of(f.run));
    let spec = &cfg.runs[i];
    let parent = Parent {
        name: pr_name(p),
        uid: pr_uid(p),
        state: release_after::state(parent_state(f), f.section_done),
    };
    let age = Age {
        sequence: None,
        created: base() + SignedDuration::from_secs(p as i64),
        name: pr_name(p),
    };
    let supersede = if spec.supersede {
        Supersede::Pending
    } else {
        Supersede::None
    };
    let phase = match (&f.deleted_holder, &f.obj.told) {
        (Some(_), _) => Phase::Deleted,
        (None, Told::Nothing) => Phase::Live {
            cancel_requested: f.obj.cancel,
            timeout: if api.timed_out[i] {
                Timeout::Final
            } else {
                Timeout::NotYet
            },
        },
        (None, Told::Acquired(_)) => Phase::Done { superseded: false },
        (None, Told::Ended { superseded }) => Phase::Done {
            superseded: *superseded,
        },
    };
    // A PipelineRun queued as a whole is a member of kind PipelineRun (observe/pending.rs).
    let kind = if spec.pending {
        RunKind::PipelineRun
    } else {
        RunKind::CustomRun
    };
    RunView {
        run: RunRef { kind, ..run_ref(i) },
        parent: Some(parent),
        group: format!("g{}", spec.group),
        age,
        priority: 0,
        supersede,
        cancel_mode: CancelMode::default(),
        wait: true,
        waiting_since: base(),
        cancel_message: None,
        phase,
        acquired_token: if f.deleted_holder.is_some() {
            None
        } else {
            token_for(cfg, &f.obj, i, k)
        },
        started: started(spec, f),
    }
}

/// observe/pending.rs's `started`: a queued PipelineRun whose `spec.status` is neither
/// Pending nor a stop. The model writes no `Waiting` record, so one started before any
/// record is taken as recorded (the product leaves that one alone as never queued).
fn started(spec: &crate::config::RunSpec, f: &Fetched) -> bool {
    let cleared = |p: &PrObj| p.phase == PrPhase::Running || p.started_by_tenant;
    spec.pending && f.parent.as_ref().is_some_and(cleared)
}

/// src/view.rs's parent_state.
fn parent_state(f: &Fetched) -> ParentState {
    match &f.parent {
        Some(p) if p.phase == PrPhase::Stopping => ParentState::StopRequested,
        // A pending PipelineRun is not done and not stopping (src/view.rs).
        Some(p) if matches!(p.phase, PrPhase::Running | PrPhase::Pending) => ParentState::Running,
        _ if f.pods_alive => ParentState::Draining,
        None => ParentState::Gone,
        Some(_) => ParentState::Done,
    }
}

/// What a run of several keys says about itself (multikey::run_of).
pub fn multi_run(cfg: &Config, obj: &RunObj, i: usize) -> Option<MultiKeyRun> {
    let keys = &cfg.runs[i].keys;
    (keys.len() > 1).then(|| MultiKeyRun {
        keys: keys.iter().map(|&k| key_name(k)).collect(),
        epoch: obj.epoch,
        acquired: match &obj.told {
            Told::Acquired(t) => Some(
                keys.iter()
                    .map(|&k| key_name(k))
                    .zip(t.iter().copied())
                    .collect(),
            ),
            _ => None,
        },
    })
}

/// multikey::keys_of over the fetched runs.
pub fn multi_keys(cfg: &Config, fetched: &[Fetched], k: u8) -> MultiKeys {
    let runs = fetched
        .iter()
        .filter(|f| f.deleted_holder.is_none())
        .filter_map(|f| Some((run_ref(f.run).uid, multi_run(cfg, &f.obj, f.run)?)))
        .collect();
    MultiKeys {
        key: key_name(k),
        runs,
    }
}

/// The tokens a run was told, by key name.
pub fn tokens_by_key(cfg: &Config, i: usize, t: &BTreeMap<String, i64>) -> Vec<i64> {
    cfg.runs[i].keys.iter().map(|&k| t[&key_name(k)]).collect()
}
