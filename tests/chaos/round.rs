//! One round on the local control plane: create the runs in bursts, inject the faults on
//! schedule, wait for every run to end (bounded), then hand the observations to the checker.

use super::admission::{self, Author, AuthorStart};
use super::api_faults::{self, Identity};
use super::checker::{self, Age, Deploy, EndSeen, RunFacts, Violation};
use super::faults::{self, Replica};
use super::manifest;
use super::observe::{self, LockFinal, PrFinal, Watches, now_ms};
use super::plan::{FaultKind, RoundPlan, RunPlan, Shape, Supersede};
use super::restore;
use super::tenants::Fairness;
use super::tenants_round;
use crate::support::controller::install_crd;
use crate::support::{TestNamespace, apply_yaml, dynamic_api, repo_root, secs, wait_until};
use anyhow::{Context, Result};
use kube::api::{DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

/// A timestamped line of the round's timeline (ms since the round started).
pub type Line = (u64, String);

pub struct RoundResult {
    pub seed: u64,
    pub runs: usize,
    pub faults: BTreeMap<&'static str, usize>,
    pub violations: Vec<Violation>,
    pub stuck: Vec<String>,
    /// Handover latencies (ms) on capacity-1 keys, and whether a fault was near.
    pub handovers: Vec<(u64, bool)>,
    pub timeline: Vec<Line>,
    pub wall: Duration,
    /// The `cluster-tenants` round's fairness figure, when it ran.
    pub fairness: Option<Fairness>,
}

impl RoundResult {
    /// Takes in the tenants' round, which ran after this one: its timeline after this one's.
    fn absorb(&mut self, other: RoundResult) {
        let shift = self.wall.as_millis() as u64;
        self.runs += other.runs;
        for (k, n) in other.faults {
            *self.faults.entry(k).or_default() += n;
        }
        self.violations
            .extend(other.violations.into_iter().map(|mut v| {
                v.at_ms = v.at_ms.saturating_add(shift);
                v
            }));
        self.stuck.extend(other.stuck);
        let lines = other.timeline.into_iter();
        self.timeline
            .extend(lines.map(|(t, l)| (t + shift, format!("[tenants] {l}"))));
        self.wall += other.wall;
        self.fairness = other.fairness;
    }
}

/// A fault broken into the instants at which something is done.
#[derive(Clone, Debug)]
enum Op {
    Kill,
    Restart,
    ReplicaUp,
    ReplicaDown,
    Pause,
    Resume,
    Restart2(&'static str, u64),
    Cancel(usize, &'static str),
    DeleteRun(usize),
    DeleteLockRun(usize),
    Repoint(usize, usize),
    DeleteReserved,
    DeleteMutex(usize),
    WipeMutex(usize),
    /// A copy of run `.0`, Pending again if `.1`.
    Copy(usize, bool),
    /// Restore key `.0`'s snapshot, the controller down `.1` ms around it; then probe `.2`.
    Restore(usize, u64, usize),
    DenyOn,
    DenyOff,
    /// The author of run `.0` (or of another queued run still waiting) starts it.
    AuthorStart(usize),
    /// Key `.0`'s selector edited, or its Mutex deleted (`.1`, see plan::SELECTOR_EDITS).
    SelectorEdit(usize, &'static str),
    /// API Priority and Fairness refuses every request of the controller (429), then, `.0` ms
    /// after it began (however late the schedule ran it), not.
    ThrottleOn,
    ThrottleOff(u64),
    /// The watches expire (410 Gone) while a holder (run `.0` if it holds) is deleted.
    WatchExpiry(usize),
    /// An admission policy refuses the controller's writes to run `.0` (or, if it does not wait,
    /// to another waiting run), then is lifted `.0` ms after it began.
    RefuseOn(usize),
    RefuseOff(u64),
    /// etcd snapshotted once a run waits (run `.0`, preferably), then restored from it `.0` ms
    /// after the snapshot began.
    EtcdSnapshot(usize),
    EtcdRestore(u64),
}

fn ops(plan: &RoundPlan) -> Vec<(u64, FaultKind, Op)> {
    let mut out = vec![];
    for f in &plan.faults {
        let (at, end, k) = (f.at_ms, f.at_ms + f.for_ms, f.kind);
        let mut add = |t, op| out.push((t, k, op));
        match k {
            FaultKind::ControllerKill => {
                add(at, Op::Kill);
                add(end, Op::Restart);
            }
            FaultKind::ControllerReplica => {
                add(at, Op::ReplicaUp);
                add(end, Op::ReplicaDown);
            }
            FaultKind::ControllerPause => {
                add(at, Op::Pause);
                add(end, Op::Resume);
            }
            FaultKind::ApiserverRestart => add(at, Op::Restart2("kube-apiserver", f.for_ms)),
            FaultKind::EtcdRestart => add(at, Op::Restart2("etcd", f.for_ms)),
            FaultKind::UserCancel => add(at, Op::Cancel(f.run, f.mode)),
            FaultKind::UserDeleteRun => add(at, Op::DeleteRun(f.run)),
            FaultKind::UserDeleteLockRun => add(at, Op::DeleteLockRun(f.run)),
            FaultKind::Repoint => add(at, Op::Repoint(f.run, f.key)),
            FaultKind::DeleteReserved => add(at, Op::DeleteReserved),
            // A pipeline shape (plan::Shape::Sibling), counted per run: nothing to do on schedule.
            FaultKind::SiblingReleaseAfter => {}
            FaultKind::MutexDelete => add(at, Op::DeleteMutex(f.key)),
            FaultKind::MutexWipe => add(at, Op::WipeMutex(f.key)),
            FaultKind::RerunCopy => add(at, Op::Copy(f.run, false)),
            FaultKind::RequeuedCopy => add(at, Op::Copy(f.run, true)),
            // Pipeline shapes (plan::Shape::Matrix, Opposite), counted per run.
            FaultKind::MatrixKeys | FaultKind::OppositeOrders => {}
            // Its snapshot is taken on schedule by a task of its own (spawn_snapshots).
            FaultKind::MutexRestore => add(at, Op::Restore(f.key, f.for_ms, f.run)),
            FaultKind::AdmissionDeny => {
                add(at, Op::DenyOn);
                add(end, Op::DenyOff);
            }
            FaultKind::AuthorStart => add(at, Op::AuthorStart(f.run)),
            FaultKind::SelectorEdit => add(at, Op::SelectorEdit(f.key, f.mode)),
            // A round of its own, after this one (tenants_round.rs).
            FaultKind::ClusterTenants => {}
            FaultKind::ApfThrottle => {
                add(at, Op::ThrottleOn);
                add(end, Op::ThrottleOff(f.for_ms));
            }
            FaultKind::WatchExpiry => add(at, Op::WatchExpiry(f.run)),
            FaultKind::RefuseRunWrites => {
                add(at, Op::RefuseOn(f.run));
                add(end, Op::RefuseOff(f.for_ms));
            }
            FaultKind::EtcdRestore => {
                add(at, Op::EtcdSnapshot(f.run));
                add(end, Op::EtcdRestore(f.for_ms));
            }
        }
    }
    out.sort_by_key(|(t, _, _)| *t);
    out
}

/// What the campaign's "users" did, for the checker.
#[derive(Default)]
struct UserActs {
    cancelled: BTreeSet<String>,
    deleted: BTreeSet<String>,
    lock_deleted: BTreeSet<String>,
    repointed: BTreeSet<String>,
    /// Runs the campaign created beyond the plan's: copies and restore probes.
    extra: Vec<Extra>,
    /// Mutex status wipes: key, ms since the round started.
    wipes: Vec<(String, u64)>,
    /// Runs whose author's start the API server let through, and how many it refused.
    author_let_through: BTreeSet<String>,
    author_refused: usize,
    /// Runs whose writes an admission policy refused the controller for a while.
    refused: BTreeSet<String>,
    /// etcd restores, for the checker.
    restores: Vec<checker::EtcdRestore>,
}

/// A run created by a fault: a copy (the original's plan under its own name) or a probe.
struct Extra {
    run: RunPlan,
    /// A copy of a run queued as a whole, started (not Pending): it runs unguarded.
    unguarded_copy: bool,
    /// The token annotation a copy was created with.
    copied_token: Option<String>,
}

struct Stage<'a> {
    plan: &'a RoundPlan,
    client: Client,
    ns: String,
    t0: u64,
    log_dir: PathBuf,
    replicas: [Option<Replica>; 2],
    started: usize,
    denials: usize,
    acts: UserActs,
    timeline: Arc<StdMutex<Vec<Line>>>,
    /// Mutex snapshots by key, for restores (None: there was none), taken on schedule by a
    /// task of their own (a restore may hold up the schedule).
    snapshots: Snapshots,
    /// Restores with the controller up, each waiting for its key to be idle on its own; their
    /// probes once done.
    background: Vec<tokio::task::JoinHandle<Option<Extra>>>,
    /// The author of the round's runs, with an `author-start` in the plan.
    author: Option<Author>,
    /// The controller's own identity, with an API-level fault that singles it out.
    identity: Option<Identity>,
    /// API-level faults in force (they may overlap).
    throttles: usize,
    refusals: usize,
    /// When the latest throttle and refusal began (ms since the epoch): each lasts its time.
    throttle_since: u64,
    refuse_since: u64,
    /// The etcd snapshot taken, and when it began (ms since the epoch).
    etcd_snapshot: Option<(PathBuf, u64)>,
}

type Snapshots = Arc<StdMutex<BTreeMap<usize, Option<tekton_mutex::model::mutex::Mutex>>>>;

/// Takes the restores' snapshots on schedule.
fn spawn_snapshots(
    plan: &RoundPlan,
    client: Client,
    ns: &str,
    t0: u64,
    timeline: Arc<StdMutex<Vec<Line>>>,
    snapshots: Snapshots,
) -> tokio::task::JoinHandle<()> {
    let mut plan_: Vec<(u64, usize, String)> = plan
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::MutexRestore)
        .map(|f| (f.snapshot_ms(), f.key, plan.keys[f.key].name.clone()))
        .collect();
    plan_.sort();
    let ns = ns.to_string();
    tokio::spawn(async move {
        for (at, k, key) in plan_ {
            sleep_until(t0 + at).await;
            let r = faults::snapshot_mutex(&client, &ns, &key).await;
            let text = match &r {
                Ok(Some(m)) => format!(
                    "lastToken {}",
                    m.status.as_ref().map_or(0, |s| s.last_token)
                ),
                Ok(None) => "none there".into(),
                Err(e) => format!("failed: {e:#}"),
            };
            snapshots
                .lock()
                .unwrap()
                .entry(k)
                .or_insert(r.ok().flatten());
            let t = now_ms().saturating_sub(t0);
            let line = format!("FAULT user snapshots Mutex {key} (a backup): {text}");
            timeline.lock().unwrap().push((t, line));
        }
    })
}

/// A Velero-style restore of `key` with the controller up: once the key is idle (bounded), then
/// the probe. Returns what happened, and the probe if it was created.
async fn restore_with_probe(
    client: Client,
    ns: String,
    key: String,
    snapshot: Option<tekton_mutex::model::mutex::Mutex>,
    probe: (RunPlan, serde_json::Value),
    how: String,
) -> (String, Option<Extra>) {
    let text = match snapshot {
        None => "no snapshot: nothing restored".to_string(),
        Some(snap) if !faults::wait_idle(&client, &ns, &key, secs(120)).await => {
            let _ = snap;
            "still in use after 120 s: not restored".to_string()
        }
        Some(snap) => faults::restore_mutex(&client, &ns, &snap)
            .await
            .unwrap_or_else(|e| format!("failed: {e:#}")),
    };
    let (probe_text, extra) = create_probe(&client, &ns, probe).await;
    let text = format!("user restores Mutex {key} from its snapshot{how}: {text}; {probe_text}");
    (text, extra)
}

/// Creates a restore's probe run.
async fn create_probe(
    client: &Client,
    ns: &str,
    (run, body): (RunPlan, serde_json::Value),
) -> (String, Option<Extra>) {
    let r = faults::create_run(client, ns, body).await;
    let text = format!("probe {}: {}", run.name, outcome(&r));
    let extra = r.is_ok().then_some(Extra {
        run,
        unguarded_copy: false,
        copied_token: None,
    });
    (text, extra)
}

impl Stage<'_> {
    fn note(&self, text: String) {
        let t = now_ms().saturating_sub(self.t0);
        self.timeline.lock().unwrap().push((t, text));
    }

    fn start_replica(&mut self, slot: usize) -> Result<()> {
        // A replica that exited by itself is started again, as its Deployment would.
        if self.replicas[slot].as_mut().is_some_and(|r| r.exited()) {
            self.replicas[slot] = None;
            self.note(format!("replica {slot} had exited: started again"));
        }
        if self.plan.unguarded || self.replicas[slot].is_some() {
            return Ok(());
        }
        self.started += 1;
        let log = self
            .log_dir
            .join(format!("controller-{}-{}.log", slot, self.started));
        let kubeconfig = self.identity.as_ref().map(|i| i.kubeconfig.as_path());
        self.replicas[slot] = Some(Replica::start_as(&self.ns, &log, kubeconfig)?);
        Ok(())
    }

    fn run_name(&self, i: usize) -> &str {
        &self.plan.runs[i.min(self.plan.runs.len() - 1)].name
    }

    async fn apply(&mut self, op: &Op) -> Result<String> {
        let (c, ns) = (self.client.clone(), self.ns.clone());
        let key = |k: usize| self.plan.keys[k].name.clone();
        Ok(match op {
            Op::Kill => match self.replicas[0].take() {
                Some(mut r) => {
                    r.kill();
                    "controller SIGKILL".into()
                }
                None => "controller SIGKILL: none running".into(),
            },
            Op::Restart => {
                self.start_replica(0)?;
                "controller restarted".into()
            }
            Op::ReplicaUp if self.replicas[1].is_some() => "second replica: already running".into(),
            Op::ReplicaUp => {
                self.start_replica(1)?;
                "second replica started".into()
            }
            Op::ReplicaDown => match self.replicas[1].take() {
                Some(_) => "second replica killed".into(),
                None => "second replica: none running".into(),
            },
            Op::Pause => match self.replicas.iter_mut().flatten().find(|r| !r.paused) {
                Some(r) => {
                    r.signal("STOP")?;
                    "a replica SIGSTOP".into()
                }
                None => "SIGSTOP: no replica running".into(),
            },
            Op::Resume => {
                for r in self.replicas.iter_mut().flatten().filter(|r| r.paused) {
                    r.signal("CONT")?;
                }
                "replicas SIGCONT".into()
            }
            Op::Restart2(name, down) => {
                self.note(format!("FAULT {name} SIGTERM, to be restarted"));
                faults::restart_component(name, Duration::from_millis(*down)).await?;
                faults::wait_api(&c).await?;
                format!("{name} restarted (down {down} ms + start-up)")
            }
            Op::Cancel(..)
            | Op::DeleteRun(_)
            | Op::DeleteLockRun(_)
            | Op::Repoint(..)
            | Op::DeleteReserved
            | Op::Copy(..) => self.act(op).await?,
            Op::AuthorStart(i) => self.author_start(*i).await,
            Op::SelectorEdit(k, how) => admission::edit_selector(&c, &ns, &key(*k), how)
                .await
                .unwrap_or_else(|e| format!("user edits a selector: failed: {e:#}")),
            Op::Restore(k, down, probe) => self.restore(*k, *down, *probe).await?,
            Op::ThrottleOn | Op::ThrottleOff(_) | Op::RefuseOn(_) | Op::RefuseOff(_) => {
                self.api_fault(op).await?
            }
            Op::WatchExpiry(i) => self.watch_expiry(*i).await?,
            Op::EtcdSnapshot(i) => self.etcd_snapshot(*i).await?,
            Op::EtcdRestore(after) => self.etcd_restore(*after).await?,
            Op::DeleteMutex(k) => {
                let r = faults::delete_mutex(&c, &ns, &key(*k)).await;
                format!("user deletes Mutex {}: {}", key(*k), outcome(&r))
            }
            Op::WipeMutex(k) => {
                let r = faults::wipe_mutex_status(&c, &ns, &key(*k)).await;
                if r.is_ok() {
                    let t = now_ms().saturating_sub(self.t0);
                    self.acts.wipes.push((key(*k), t));
                }
                format!("user wipes Mutex {} status: {}", key(*k), outcome(&r))
            }
            Op::DenyOn => {
                self.denials += 1;
                faults::deny_cancels(&c, &ns, self.run_name(0)).await?;
                "admission policy denies PipelineRun cancels".into()
            }
            Op::DenyOff => {
                self.denials = self.denials.saturating_sub(1);
                if self.denials == 0 {
                    faults::allow_cancels(&c, &ns).await?;
                }
                "admission policy lifted".into()
            }
        })
    }

    /// An API-level fault that singles out the controller's identity (issue 49).
    async fn api_fault(&mut self, op: &Op) -> Result<String> {
        let (c, ns) = (self.client.clone(), self.ns.clone());
        let Some(id) = self.identity.as_ref() else {
            return Ok(format!(
                "{op:?}: no identity of the controller's (unguarded)"
            ));
        };
        let seen = |ok: bool| if ok { "" } else { " (not seen enforced)" };
        Ok(match op {
            Op::ThrottleOn => {
                self.throttles += 1;
                self.throttle_since = now_ms();
                let ok = api_faults::throttle_on(&c, &ns, id).await?;
                format!(
                    "APF throttles the controller: every request 429{}",
                    seen(ok)
                )
            }
            Op::ThrottleOff(for_ms) => {
                sleep_until(self.throttle_since + for_ms).await; // the fault's time
                self.throttles = self.throttles.saturating_sub(1);
                let n = api_faults::throttled_requests(&c, &ns).await;
                if self.throttles == 0 {
                    api_faults::throttle_off(&c, &ns).await?;
                }
                format!("APF throttle lifted: {n:?} requests refused with 429 (one the probe's)")
            }
            Op::RefuseOn(i) => {
                // A waiting run, so that its grant comes while its writes are refused.
                let planned = self.run_name(*i).to_string();
                let Some(pr) = faults::a_waiter(&c, &ns, &planned).await? else {
                    return Ok("admission refusal: no run waits, none refused".into());
                };
                self.refusals += 1;
                self.refuse_since = now_ms();
                let ok = api_faults::refuse_on(&c, &ns, &pr, id).await?;
                self.acts.refused.insert(pr.clone());
                format!(
                    "admission refuses the controller's writes to {pr}{}",
                    seen(ok)
                )
            }
            Op::RefuseOff(for_ms) => {
                sleep_until(self.refuse_since + for_ms).await; // the fault's time
                if self.refusals == 0 {
                    return Ok("admission refusal: none in force".into());
                }
                self.refusals -= 1;
                if self.refusals == 0 {
                    api_faults::refuse_off(&c, &ns).await?;
                }
                "admission refusal of the run's writes lifted".into()
            }
            _ => unreachable!("not an API-level fault: {op:?}"),
        })
    }

    /// The controller stops hearing (SIGSTOP); a holder is deleted (run `i` if it holds, else
    /// another) and its lock run goes; etcd is compacted and the API server restarted, so that
    /// no watch can resume where it was (410 Gone: the controller must list again); then the
    /// controller goes on (SIGCONT).
    async fn watch_expiry(&mut self, i: usize) -> Result<String> {
        let (c, ns) = (self.client.clone(), self.ns.clone());
        let mut stopped = vec![];
        for (slot, r) in self.replicas.iter_mut().enumerate() {
            if let Some(r) = r.as_mut().filter(|r| !r.paused) {
                r.signal("STOP")?;
                stopped.push(slot);
            }
        }
        // The status the stopped controller last wrote may name holders gone since.
        let mut deleted = "no key held: nothing deleted".to_string();
        for pr in faults::holders(&c, &ns, self.run_name(i)).await? {
            if faults::delete_run(&c, &ns, &pr).await.is_ok() {
                self.acts.deleted.insert(pr.clone());
                let gone = faults::wait_lock_runs_gone(&c, &ns, &pr, secs(20)).await;
                deleted = format!("holder {pr} deleted (its lock run gone: {gone})");
                break;
            }
        }
        let revision = faults::compact_etcd();
        faults::restart_component("kube-apiserver", Duration::ZERO).await?;
        faults::wait_api(&c).await?;
        for slot in stopped {
            if let Some(r) = self.replicas[slot].as_mut() {
                r.signal("CONT")?;
            }
        }
        Ok(format!(
            "watches expire: controller stopped, {deleted}, etcd compacted ({revision:?}), \
             kube-apiserver restarted, controller goes on"
        ))
    }

    /// etcd snapshotted once a run waits for a key (bounded: else as it is).
    async fn etcd_snapshot(&mut self, i: usize) -> Result<String> {
        let path = self.log_dir.join("etcd.snapshot");
        let began = now_ms();
        let planned = self.run_name(i).to_string();
        let waiter = restore::snapshot(&self.client, &self.ns, &planned, &path).await;
        if waiter.is_ok() {
            self.etcd_snapshot = Some((path, began));
        }
        Ok(match waiter {
            Ok(Some(w)) => format!("etcd snapshot taken ({w} waits for its key)"),
            Ok(None) => "etcd snapshot taken (no run waited within 20 s)".into(),
            Err(e) => format!("etcd snapshot: failed: {e:#}"),
        })
    }

    /// etcd restored from the round's snapshot, `after` ms after it began; then the faults in
    /// force are what the schedule says (a restore may bring back a policy lifted since the
    /// snapshot), and the runs the restore erased count as deleted.
    async fn etcd_restore(&mut self, after: u64) -> Result<String> {
        let Some((path, since)) = self.etcd_snapshot.take() else {
            return Ok("etcd restore: no snapshot".into());
        };
        sleep_until(since + after).await; // the fault's time
        let (c, ns) = (self.client.clone(), self.ns.clone());
        let begin = now_ms();
        self.note("FAULT etcd restore begins: kube-apiserver and etcd stopped".into());
        let pods = restore::restore(&c, &ns, &path).await?;
        let end = now_ms();
        // Best effort, noted: the API server has just come back.
        let mut lifted = vec![];
        if self.throttles == 0 {
            lifted.push(api_faults::throttle_off(&c, &ns).await);
        }
        if self.refusals == 0 {
            lifted.push(api_faults::refuse_off(&c, &ns).await);
        }
        if self.denials == 0 {
            lifted.push(faults::allow_cancels(&c, &ns).await);
        }
        for r in lifted.iter().filter(|r| r.is_err()) {
            self.note(format!("etcd restore: lifting a policy: {}", outcome(r)));
        }
        let rel = |ms: u64| ms.saturating_sub(self.t0);
        let created: Vec<String> = (self.plan.runs.iter())
            .filter(|r| r.at_ms < rel(begin))
            .chain(self.acts.extra.iter().map(|e| &e.run))
            .map(|r| r.name.clone())
            .collect();
        let erased = restore::erased(&c, &ns, &created).await?;
        self.acts.deleted.extend(erased.iter().cloned());
        self.acts.restores.push(checker::EtcdRestore {
            snapshot: rel(since),
            begin: rel(begin),
            end: rel(end),
        });
        Ok(format!(
            "etcd restored from the snapshot of +{:.1}s (down {} ms), Tekton restarted, \
             {pods} pods deleted to run again; runs it erased: {erased:?}",
            rel(since) as f64 / 1000.0,
            end - begin
        ))
    }

    /// A user's action on a run; what was done is recorded for the checker.
    async fn act(&mut self, op: &Op) -> Result<String> {
        let (c, ns) = (self.client.clone(), self.ns.clone());
        Ok(match op {
            Op::Cancel(i, mode) => {
                let pr = self.run_name(*i).to_string();
                let r = faults::cancel_run(&c, &ns, &pr, mode).await;
                if r.is_ok() {
                    self.acts.cancelled.insert(pr.clone());
                }
                format!("user cancels {pr} ({mode}): {}", outcome(&r))
            }
            Op::DeleteRun(i) => {
                let pr = self.run_name(*i).to_string();
                let r = faults::delete_run(&c, &ns, &pr).await;
                if r.is_ok() {
                    self.acts.deleted.insert(pr.clone());
                }
                format!("user deletes PipelineRun {pr}: {}", outcome(&r))
            }
            Op::DeleteLockRun(i) => {
                let pr = self.run_name(*i).to_string();
                let r = faults::delete_lock_run(&c, &ns, &pr).await;
                if matches!(r, Ok(n) if n > 0) {
                    self.acts.lock_deleted.insert(pr.clone());
                }
                format!("user deletes the lock run of {pr}: {r:?}")
            }
            Op::Repoint(i, k) => {
                let pr = self.run_name(*i).to_string();
                let to = self.other_key(*i, *k);
                let r = faults::repoint_lock_run(&c, &ns, &pr, &to).await;
                if matches!(r, Ok(n) if n > 0) {
                    self.acts.repointed.insert(pr.clone());
                }
                format!("user re-points the lock run of {pr} at {to}: {r:?}")
            }
            Op::DeleteReserved => {
                let r = faults::delete_reserved_lock_run(&c, &ns, secs(20)).await;
                if let Ok(Some(pr)) = &r {
                    self.acts.lock_deleted.insert(pr.clone());
                }
                format!("user deletes a reserved multi-key lock run: {r:?}")
            }
            Op::Copy(i, pending) => {
                let run = &self.plan.runs[(*i).min(self.plan.runs.len() - 1)];
                let n = self.acts.extra.len() + 1;
                let name = format!(
                    "{}-{}{n}",
                    run.name,
                    if *pending { "again" } else { "rerun" }
                );
                let r = faults::copy_run(&c, &ns, &run.name, &name, *pending).await;
                let text = match &r {
                    Ok(copied) => format!(
                        "{} ({}, token {:?})",
                        if copied.pending { "Pending" } else { "started" },
                        if copied.queued {
                            "of a queued run"
                        } else {
                            "of a lock task's run"
                        },
                        copied.token
                    ),
                    Err(e) => format!("failed: {e:#}"),
                };
                if let Ok(copied) = r {
                    let mut copy = run.clone();
                    copy.name = name.clone();
                    copy.at_ms = now_ms().saturating_sub(self.t0);
                    self.acts.extra.push(Extra {
                        run: copy,
                        unguarded_copy: copied.queued && !copied.pending,
                        copied_token: copied.token,
                    });
                }
                let what = if *pending {
                    "re-queued copy"
                } else {
                    "rerun copy"
                };
                format!("user makes a {what} of {} as {name}: {text}", run.name)
            }
            _ => unreachable!("not a user's action: {op:?}"),
        })
    }

    /// A Velero-style restore of key `k`'s snapshot once the key is idle (bounded), then the
    /// probe run `probe` on the key. With the controller up (`down` 0) it waits on its own, the
    /// schedule goes on; else the controller is killed once the key is idle and restarted
    /// `down` ms after the restore.
    async fn restore(&mut self, k: usize, down: u64, probe: usize) -> Result<String> {
        let (c, ns) = (self.client.clone(), self.ns.clone());
        let key = self.plan.keys[k].name.clone();
        let snapshot = self.snapshots.lock().unwrap().get(&k).cloned().flatten();
        let run = self.plan.probes[probe].clone();
        let body = manifest::pipeline_run(self.plan, &run);
        if down == 0 {
            let (timeline, t0) = (self.timeline.clone(), self.t0);
            self.background.push(tokio::spawn(async move {
                let (text, extra) =
                    restore_with_probe(c, ns, key, snapshot, (run, body), String::new()).await;
                let t = now_ms().saturating_sub(t0);
                timeline.lock().unwrap().push((t, format!("FAULT {text}")));
                extra
            }));
            return Ok(format!(
                "restore of Mutex {} begins (once it is idle)",
                self.plan.keys[k].name
            ));
        }
        // Waits for the key to be idle with the controller up, then takes it down.
        let Some(snap) = snapshot else {
            let (probe_text, extra) = create_probe(&c, &ns, (run, body)).await;
            self.acts.extra.extend(extra);
            return Ok(format!(
                "user restores Mutex {key}: no snapshot; {probe_text}"
            ));
        };
        if !faults::wait_idle(&c, &ns, &key, secs(120)).await {
            let (probe_text, extra) = create_probe(&c, &ns, (run, body)).await;
            self.acts.extra.extend(extra);
            return Ok(format!(
                "user restores Mutex {key}: still in use after 120 s, not restored; {probe_text}"
            ));
        }
        for r in self.replicas.iter_mut() {
            if let Some(mut r) = r.take() {
                r.kill();
            }
        }
        self.note(format!("FAULT controller SIGKILL for the restore of {key}"));
        let r = faults::restore_mutex(&c, &ns, &snap)
            .await
            .unwrap_or_else(|e| format!("failed: {e:#}"));
        tokio::time::sleep(Duration::from_millis(down)).await; // the fault's downtime
        self.start_replica(0)?;
        let (probe_text, extra) = create_probe(&c, &ns, (run, body)).await;
        let text = format!(
            "user restores Mutex {key} from its snapshot (controller down {down} ms): {r}; \
             {probe_text}"
        );
        self.acts.extra.extend(extra);
        Ok(text)
    }

    /// The author of run `i` starts it while it waits (clears its `spec.status`); if it is not
    /// waiting, the author of another queued run that is (the latest created first; bounded).
    /// The cluster install's policy should refuse it.
    async fn author_start(&mut self, i: usize) -> String {
        let Some(author) = self.author.clone() else {
            return "author start: no author (an unguarded round)".into();
        };
        let planned = self.run_name(i).to_string();
        let queued = self
            .plan
            .runs
            .iter()
            .rev()
            .filter(|r| r.shape == Shape::Queued);
        let others = queued.filter(|r| r.name != planned);
        let candidates: Vec<String> = std::iter::once(planned.clone())
            .chain(others.map(|r| r.name.clone()))
            .collect();
        let what = "clears its spec.status while it waits";
        match admission::author_start(&self.client, &self.ns, &author, &candidates).await {
            Ok(AuthorStart::Refused { pr, message }) => {
                self.acts.author_refused += 1;
                format!("author of {pr} {what}: refused ({message})")
            }
            Ok(AuthorStart::LetThrough { pr }) => {
                self.acts.author_let_through.insert(pr.clone());
                format!("author of {pr} {what}: LET THROUGH")
            }
            Ok(AuthorStart::NoneWaiting) => "author start: no queued run waited (15 s)".into(),
            Err(e) => format!("author start: failed: {e:#}"),
        }
    }

    /// Key `k`, or the next one if `k` is run `i`'s own: where a re-point sends it.
    fn other_key(&self, i: usize, k: usize) -> String {
        let run = &self.plan.runs[i.min(self.plan.runs.len() - 1)];
        let own = self.plan.groups[run.group].key;
        let to = if k == own {
            (k + 1) % self.plan.keys.len()
        } else {
            k
        };
        self.plan.keys[to].name.clone()
    }

    /// Runs the fault schedule; returns how many faults of each kind were injected.
    async fn inject(&mut self) -> Result<BTreeMap<&'static str, usize>> {
        let mut counts = BTreeMap::new();
        for (at, kind, op) in ops(self.plan) {
            sleep_until(self.t0 + at).await;
            let text = self.apply(&op).await?;
            let second_half = matches!(
                op,
                Op::Restart
                    | Op::ReplicaDown
                    | Op::Resume
                    | Op::DenyOff
                    | Op::ThrottleOff(_)
                    | Op::RefuseOff(_)
                    | Op::EtcdRestore(_)
            );
            if !second_half {
                *counts.entry(kind.name()).or_default() += 1;
            }
            self.note(format!("FAULT {text}"));
        }
        // Whatever the schedule left: resume, one replica, no denial.
        self.apply(&Op::Resume).await?;
        self.start_replica(0)?;
        if self.denials > 0 {
            faults::allow_cancels(&self.client, &self.ns).await?;
            self.denials = 0;
        }
        if self.throttles > 0 {
            api_faults::throttle_off(&self.client, &self.ns).await?;
            self.throttles = 0;
        }
        if self.refusals > 0 {
            api_faults::refuse_off(&self.client, &self.ns).await?;
            self.refusals = 0;
        }
        for task in std::mem::take(&mut self.background) {
            self.acts.extra.extend(task.await?);
        }
        Ok(counts)
    }
}

pub(super) fn outcome(r: &Result<()>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => format!("failed: {e:#}"),
    }
}

/// Sleeps until a wall-clock instant (ms since the epoch): the round's schedule, not a wait for
/// a condition.
pub(super) async fn sleep_until(ms: u64) {
    let now = now_ms();
    if ms > now {
        tokio::time::sleep(Duration::from_millis(ms - now)).await;
    }
}

/// Creates the runs on schedule, retrying while the API server is away.
fn spawn_creations(
    plan: &RoundPlan,
    client: Client,
    ns: &str,
    t0: u64,
    timeline: Arc<StdMutex<Vec<Line>>>,
) -> tokio::task::JoinHandle<Result<()>> {
    let runs: Vec<_> = plan
        .runs
        .iter()
        .map(|r| (r.at_ms, r.name.clone(), manifest::pipeline_run(plan, r)))
        .collect();
    spawn_bodies(runs, client, ns, t0, timeline)
}

/// Creates PipelineRuns `(at_ms, name, body)` on schedule, retrying while the API server is away.
pub(super) fn spawn_bodies(
    runs: Vec<(u64, String, serde_json::Value)>,
    client: Client,
    ns: &str,
    t0: u64,
    timeline: Arc<StdMutex<Vec<Line>>>,
) -> tokio::task::JoinHandle<Result<()>> {
    let ns = ns.to_string();
    tokio::spawn(async move {
        let api = dynamic_api(&client, Some(&ns), "tekton.dev/v1", "PipelineRun").await?;
        for (at, name, body) in runs {
            sleep_until(t0 + at).await;
            let pr: DynamicObject = serde_json::from_value(body)?;
            let stored = wait_until(
                &format!("PipelineRun {name} to be created"),
                secs(120),
                || {
                    let (api, pr) = (api.clone(), pr.clone());
                    async move {
                        match api.create(&PostParams::default(), &pr).await {
                            Ok(stored) => Ok(Some(Some(stored))),
                            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(None)),
                            Err(_) => Ok(None),
                        }
                    }
                },
            )
            .await?;
            // What a selector's admission made of it.
            let marked = stored
                .as_ref()
                .and_then(|s| s.annotations().get("tekton-mutex.dev/pending-for").cloned())
                .map(|by| format!(" (made Pending at create for {by})"))
                .unwrap_or_default();
            let t = now_ms().saturating_sub(t0);
            timeline
                .lock()
                .unwrap()
                .push((t, format!("created {name}{marked}")));
        }
        Ok(())
    })
}

/// The round: the main one in its namespace, then the tenants' round if drawn (alone when it
/// is the only kind asked for: the main round then has no runs).
pub async fn run(plan: &RoundPlan) -> Result<RoundResult> {
    let tenants = plan.tenants.as_deref();
    match tenants {
        Some(t) if plan.runs.is_empty() => tenants_round::run(plan.seed, t).await,
        _ => {
            let mut result = run_main(plan).await?;
            if let Some(t) = tenants {
                result.absorb(tenants_round::run(plan.seed, t).await?);
            }
            Ok(result)
        }
    }
}

async fn run_main(plan: &RoundPlan) -> Result<RoundResult> {
    let wall = Instant::now();
    let ns = TestNamespace::create(&format!("chaos-{}", plan.seed)).await?;
    let client = ns.client();
    let log_dir = repo_root()
        .join("target/chaos")
        .join(format!("{}-{}", plan.seed, ns.name()));
    std::fs::create_dir_all(&log_dir)?;
    install_crd(&repo_root().join("config/300-crd.yaml")).await?;
    // Admission first: the cluster install's policies see the locks as they are created.
    let policies = admission::install(plan, &ns).await?;
    if !plan.unguarded {
        let yaml: Vec<String> = manifest::mutexes(plan)
            .iter()
            .map(|m| m.to_string())
            .collect();
        apply_yaml(&client, Some(ns.name()), &yaml.join("\n---\n")).await?;
        admission::wait_selecting(plan, &ns).await?;
    }
    let watches = Watches::start(&client, ns.name());
    let timeline = Arc::new(StdMutex::new(Vec::new()));
    // The only-a-grant-starts policy of an author-start lets only the release's own identity
    // start a queued run: such a round keeps the controller on the admin identity, and its
    // faults that single out the controller's identity do nothing that round.
    let has = |kind: fn(FaultKind) -> bool| plan.faults.iter().any(|f| kind(f.kind));
    let singled_out = has(|k| k.needs_identity()) && !has(|k| k == FaultKind::AuthorStart);
    let identity = match singled_out && !plan.unguarded {
        true => Some(Identity::create(&client, ns.name(), &log_dir).await?),
        false => None,
    };
    let t0 = now_ms();
    let mut stage = Stage {
        plan,
        client: client.clone(),
        ns: ns.name().to_string(),
        t0,
        log_dir,
        replicas: [None, None],
        started: 0,
        denials: 0,
        acts: UserActs::default(),
        timeline: timeline.clone(),
        snapshots: Snapshots::default(),
        background: vec![],
        author: policies.author.clone(),
        identity,
        throttles: 0,
        refusals: 0,
        throttle_since: 0,
        refuse_since: 0,
        etcd_snapshot: None,
    };
    stage.start_replica(0)?;
    let snapshots = spawn_snapshots(
        plan,
        client.clone(),
        ns.name(),
        t0,
        timeline.clone(),
        stage.snapshots.clone(),
    );
    let creations = spawn_creations(plan, client.clone(), ns.name(), t0, timeline.clone());
    let mut counts = stage.inject().await?;
    let siblings = plan.runs.iter().filter(|r| r.shape == Shape::Sibling);
    if siblings.clone().count() > 0 {
        counts.insert(FaultKind::SiblingReleaseAfter.name(), siblings.count());
    }
    for (kind, shaped) in [
        (
            FaultKind::MatrixKeys,
            (|s| matches!(s, Shape::Matrix(..))) as fn(Shape) -> bool,
        ),
        (FaultKind::OppositeOrders, |s| {
            matches!(s, Shape::Opposite(..))
        }),
    ] {
        let n = plan.runs.iter().filter(|r| shaped(r.shape)).count();
        if n > 0 && !plan.unguarded {
            counts.insert(kind.name(), n);
        }
    }
    // Not a fault: the queued shape is part of the random mix, counted beside the faults.
    let queued = plan
        .runs
        .iter()
        .filter(|r| r.shape == Shape::Queued)
        .count();
    if queued > 0 && !plan.unguarded {
        counts.insert("queued-pipelineruns", queued);
    }
    creations.await??;
    snapshots.await?;
    let stuck = wait_all_done(plan, &client, ns.name(), t0, &stage.acts).await?;
    if !stuck.is_empty() {
        // Each stuck run's key, as its lock's Ready condition explains it (issue 49).
        let keys: BTreeSet<String> = plan
            .runs
            .iter()
            .filter(|r| stuck.contains(&r.name))
            .map(|r| plan.key_of(r).name.clone())
            .collect();
        let keys: Vec<String> = keys.into_iter().collect();
        for line in faults::readiness(&client, ns.name(), &keys).await {
            stage.note(line);
        }
    }
    settle(&client, ns.name(), &watches).await;
    let prs = observe::pipeline_runs(&client, ns.name()).await?;
    let locks = observe::lock_runs(&client, ns.name()).await?;
    drop(stage.replicas);
    if let Some(id) = &stage.identity {
        id.remove(&client).await;
    }
    counts.extend(expired_watches(plan, &stage.log_dir));
    let seen = std::mem::take(&mut *watches.seen.lock().unwrap());
    let end_ms = now_ms().saturating_sub(t0);
    let deploys = deploys(&seen, t0, end_ms);
    let facts = run_facts(plan, &prs, &locks, &stage.acts, &deploys);
    counts.extend(admission_counts(plan, &prs, &facts, &stage.acts));
    drop(policies);
    // Not a fault: cycles across keys the controller broke (their youngest run's wait ended
    // with reason Deadlock), counted beside the faults.
    let deadlocks = facts
        .iter()
        .filter(|f| f.lock_reason.as_deref() == Some("Deadlock"))
        .count();
    if deadlocks > 0 {
        counts.insert("deadlocks-broken", deadlocks);
    }
    // Not a fault: grants taken back because the run could not be told (issue 49), counted.
    let revoked = facts.iter().filter(|f| {
        let m = f.lock_message.as_deref().unwrap_or_default();
        m.contains("could not be delivered")
    });
    if revoked.clone().count() > 0 {
        counts.insert("grants-taken-back-undelivered", revoked.count());
    }
    let created_runs = plan.runs.len() + stage.acts.extra.len();
    let capacity = plan
        .keys
        .iter()
        .map(|k| (k.name.clone(), k.capacity))
        .collect();
    let violations = checker::check(&checker::Round {
        capacity: &capacity,
        deploys: &deploys,
        runs: &facts,
        stuck: &stuck,
        wipes: &stage.acts.wipes,
        restores: &stage.acts.restores,
    });
    let mut timeline = std::mem::take(&mut *timeline.lock().unwrap());
    let planned = ops(plan)
        .into_iter()
        .map(|(t, kind, op)| (t, format!("PLANNED {} {op:?}", kind.name())));
    timeline.extend(planned);
    timeline.extend(mark_lines(&deploys));
    timeline.extend(completion_lines(&prs, t0));
    timeline.sort();
    let text: Vec<String> = timeline
        .iter()
        .map(|(t, l)| format!("+{:>7.3}s  {l}", *t as f64 / 1000.0))
        .collect();
    std::fs::write(stage.log_dir.join("timeline.txt"), text.join("\n") + "\n")?;
    Ok(RoundResult {
        seed: plan.seed,
        runs: created_runs,
        faults: counts,
        handovers: handovers(plan, &deploys, &prs, &timeline, t0),
        violations,
        stuck,
        timeline,
        wall: wall.elapsed(),
        fairness: None,
    })
}

/// With a `watch-expiry` in the round: how many times the controllers' logs say a watch could
/// not resume (410 Gone, "too old resource version"): the fault observed.
fn expired_watches(plan: &RoundPlan, log_dir: &std::path::Path) -> Option<(&'static str, usize)> {
    if !plan.faults.iter().any(|f| f.kind == FaultKind::WatchExpiry) || plan.unguarded {
        return None;
    }
    let logs = std::fs::read_dir(log_dir).ok()?.flatten();
    let text: String = logs
        .filter(|e| e.file_name().to_string_lossy().starts_with("controller-"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect();
    Some((
        "watches-expired-410",
        text.matches("too old resource version").count(),
    ))
}

/// Not faults, counted beside them (issue 46): the selected runs, those no lock took (they ran
/// unlocked once the selector stopped taking them), those the controller told and left
/// Pending; and the authors' starts refused or let through.
fn admission_counts(
    plan: &RoundPlan,
    prs: &BTreeMap<String, PrFinal>,
    facts: &[RunFacts],
    acts: &UserActs,
) -> Vec<(&'static str, usize)> {
    let selected = plan.runs.iter().filter(|r| r.shape == Shape::Selected);
    let counted = [
        ("selected-pipelineruns", selected.count()),
        (
            "selected-unlocked",
            facts.iter().filter(|f| f.unlocked).count(),
        ),
        ("selected-told-and-pending", told_selected(plan, prs).len()),
        ("author-start-refused", acts.author_refused),
        ("author-start-let-through", acts.author_let_through.len()),
    ];
    let guarded = !plan.unguarded;
    counted
        .into_iter()
        .filter(|(_, n)| *n > 0 && guarded)
        .collect()
}

/// Selected runs the controller told why they wait for nothing and left Pending: the admission
/// policy made them Pending for the selector, which no longer takes them, and no lock took
/// them (no key). They end only when someone acts; the controller that lets them go starts them.
fn told_selected(plan: &RoundPlan, prs: &BTreeMap<String, PrFinal>) -> BTreeSet<String> {
    plan.runs
        .iter()
        .filter(|r| r.shape == Shape::Selected && !plan.unguarded)
        .filter(|r| {
            prs.get(&r.name).is_some_and(|p| {
                p.spec_status.as_deref() == Some("PipelineRunPending")
                    && p.key.is_none()
                    && p.error.is_some()
            })
        })
        .map(|r| r.name.clone())
        .collect()
}

/// Waits, up to the round's liveness bound, until every PipelineRun a user did not delete is
/// done (or, selected, told and left Pending: `told_selected`); returns those that are not.
async fn wait_all_done(
    plan: &RoundPlan,
    client: &Client,
    ns: &str,
    t0: u64,
    acts: &UserActs,
) -> Result<Vec<String>> {
    let deadline = t0 + plan.liveness_bound_ms();
    let expected: Vec<&str> = plan
        .runs
        .iter()
        .chain(acts.extra.iter().map(|e| &e.run))
        .map(|r| r.name.as_str())
        .filter(|n| !acts.deleted.contains(*n))
        .collect();
    let budget = Duration::from_millis(deadline.saturating_sub(now_ms()));
    let pending = |prs: &BTreeMap<String, PrFinal>| -> Vec<String> {
        let told = told_selected(plan, prs);
        expected
            .iter()
            .filter(|n| prs.get(**n).is_none_or(|p| !p.done) && !told.contains(**n))
            .map(|n| n.to_string())
            .collect()
    };
    let done = wait_until("every PipelineRun to end", budget, || async {
        let prs = observe::pipeline_runs(client, ns).await.unwrap_or_default();
        Ok(pending(&prs).is_empty().then_some(()))
    })
    .await;
    if done.is_ok() {
        return Ok(vec![]);
    }
    let prs = observe::pipeline_runs(client, ns)
        .await
        .context("listing PipelineRuns")?;
    Ok(pending(&prs))
}

/// Lets the last steps stopped by SIGTERM write their end marks (bounded by the grace period).
pub(super) async fn settle(client: &Client, ns: &str, watches: &Watches) {
    let _ = client;
    let _ = ns;
    let _ = wait_until("every deploy to have ended", secs(45), || async {
        let seen = watches.seen.lock().unwrap();
        let open = seen.marks.values().filter(|m| !m.end).any(|m| {
            !seen.marks.contains_key(&end_mark(m))
                && !seen
                    .pods_gone_ms
                    .contains_key(&(m.pr.clone(), m.task.clone()))
        });
        Ok((!open).then_some(()))
    })
    .await;
}

/// The name of the end mark that pairs with start mark `m` (see the deploy script).
fn end_mark(m: &observe::Mark) -> String {
    observe::mark_name(&format!("mark-{}-{}-end", m.pr, m.key), m.token)
}

pub(super) fn deploys(seen: &observe::Seen, t0: u64, end_ms: u64) -> Vec<Deploy> {
    let rel = |ms: u64| ms.saturating_sub(t0);
    seen.marks
        .values()
        .filter(|m| !m.end)
        .map(|m| {
            let (end, end_seen) = match seen.marks.get(&end_mark(m)) {
                Some(e) => (rel(e.ms), EndSeen::Mark),
                None => match seen.pods_gone_ms.get(&(m.pr.clone(), m.task.clone())) {
                    Some(&g) => (rel(g), EndSeen::PodGone),
                    None => (end_ms, EndSeen::Unknown),
                },
            };
            Deploy {
                pr: m.pr.clone(),
                key: m.key.clone(),
                group: m.group.clone(),
                token: m.token,
                start_ms: rel(m.ms),
                end_ms: end.max(rel(m.ms)),
                end_seen,
            }
        })
        .collect()
}

/// Whether selected run `name` was taken by no lock: it carries no key at the end; deleted, none
/// of its deploys had a token (its step found no key, or was told).
fn taken_by_no_lock(name: &str, pr: Option<&PrFinal>, deploys: &[Deploy]) -> bool {
    match pr {
        Some(p) => p.key.is_none(),
        None => deploys
            .iter()
            .filter(|d| d.pr == name)
            .all(|d| d.token == 0),
    }
}

/// The facts of a round's runs, where the campaign's users did nothing to them.
pub(super) fn facts_of(
    plan: &RoundPlan,
    prs: &BTreeMap<String, PrFinal>,
    locks: &BTreeMap<String, LockFinal>,
    deploys: &[Deploy],
) -> Vec<RunFacts> {
    run_facts(plan, prs, locks, &UserActs::default(), deploys)
}

fn run_facts(
    plan: &RoundPlan,
    prs: &BTreeMap<String, PrFinal>,
    locks: &BTreeMap<String, LockFinal>,
    acts: &UserActs,
    deploys: &[Deploy],
) -> Vec<RunFacts> {
    let extra = acts
        .extra
        .iter()
        .map(|e| (&e.run, e.unguarded_copy, e.copied_token.clone()));
    let mut facts: Vec<RunFacts> = plan
        .runs
        .iter()
        .map(|r| (r, false, None))
        .chain(extra)
        .map(|(r, unguarded_copy, copied_token)| {
            let group = &plan.groups[r.group];
            let pr = prs.get(&r.name);
            // A copy started unguarded has its original's record: not its own.
            let lock = locks.get(&r.name).filter(|_| !unguarded_copy);
            let selected = r.shape == Shape::Selected && !plan.unguarded;
            let unlocked = selected && taken_by_no_lock(&r.name, pr, deploys);
            RunFacts {
                group: group.name.clone(),
                supersede_running: group.supersede == Supersede::Running && !plan.unguarded,
                cancel_mode: r.cancel_mode.to_string(),
                newer_in_group: false,
                name: r.name.clone(),
                key: plan.key_of(r).name.clone(),
                supersede_on: group.supersede != Supersede::None && !plan.unguarded,
                age: pr.map(|p| Age {
                    has_sequence: r.sequence.is_some(),
                    sequence: r.sequence.unwrap_or(0),
                    created_s: p.created_s,
                    name: r.name.clone(),
                }),
                has_pipeline_timeout: r.pipeline_timeout_s.is_some(),
                user_cancelled: acts.cancelled.contains(&r.name),
                lock_run_deleted: acts.lock_deleted.contains(&r.name),
                repointed: acts.repointed.contains(&r.name),
                done: pr.map(|p| p.done),
                reason: pr.and_then(|p| p.reason.clone()),
                spec_status: pr.and_then(|p| p.spec_status.clone()),
                superseded_by: pr.and_then(|p| p.superseded_by.clone()),
                lock_seen: lock.is_some(),
                lock_status: lock.and_then(|l| l.status.clone()),
                lock_reason: lock.and_then(|l| l.reason.clone()),
                lock_message: lock.and_then(|l| l.message.clone()),
                cross: r.shape.cross() && !plan.unguarded,
                unguarded_copy,
                copied_token,
                token: pr.and_then(|p| p.token.clone()),
                completion_s: pr.and_then(|p| p.completion_s),
                queued: (r.shape == Shape::Queued && !plan.unguarded) || (selected && !unlocked),
                author_started: acts.author_let_through.contains(&r.name),
                unlocked,
                refused_writes: acts.refused.contains(&r.name),
            }
        })
        .collect();
    let ages: Vec<(String, Option<Age>)> = facts
        .iter()
        .map(|f| (f.group.clone(), f.age.clone()))
        .collect();
    for f in &mut facts {
        f.newer_in_group = ages
            .iter()
            .any(|(g, a)| *g == f.group && a.is_some() && *a > f.age);
    }
    facts
}

pub(super) fn mark_lines(deploys: &[Deploy]) -> Vec<Line> {
    deploys
        .iter()
        .flat_map(|d| {
            let what = format!("{} key {} group {} token {}", d.pr, d.key, d.group, d.token);
            [
                (d.start_ms, format!("deploy START {what}")),
                (d.end_ms, format!("deploy END ({:?}) {what}", d.end_seen)),
            ]
        })
        .collect()
}

pub(super) fn completion_lines(prs: &BTreeMap<String, PrFinal>, t0: u64) -> Vec<Line> {
    prs.iter()
        .filter_map(|(name, p)| {
            let t = (p.completion_s? * 1000) as u64;
            Some((
                t.saturating_sub(t0),
                format!("{name} done ({:?}, second resolution)", p.reason),
            ))
        })
        .collect()
}

/// Capacity-1 handovers: the next deploy's start minus the previous one's end, when the next
/// run already existed; flagged when a fault was injected in between (or just before).
fn handovers(
    plan: &RoundPlan,
    deploys: &[Deploy],
    prs: &BTreeMap<String, PrFinal>,
    timeline: &[Line],
    t0: u64,
) -> Vec<(u64, bool)> {
    let faults: Vec<u64> = timeline
        .iter()
        .filter(|(_, l)| l.starts_with("FAULT"))
        .map(|(t, _)| *t)
        .collect();
    let mut out = vec![];
    for key in plan.keys.iter().filter(|k| k.capacity == 1) {
        let mut ds: Vec<&Deploy> = deploys.iter().filter(|d| d.key == key.name).collect();
        ds.sort_by_key(|d| d.start_ms);
        for w in ds.windows(2) {
            let (a, b) = (w[0], w[1]);
            let created = prs.get(&b.pr).map(|p| (p.created_s * 1000) as u64);
            if b.start_ms < a.end_ms || created.is_none_or(|c| c.saturating_sub(t0) > a.end_ms) {
                continue;
            }
            let near = faults
                .iter()
                .any(|&f| f + 5_000 >= a.end_ms && f <= b.start_ms);
            out.push((b.start_ms - a.end_ms, near));
        }
    }
    out
}
