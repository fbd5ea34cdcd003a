//! Prometheus metrics (the `prometheus-client` crate), named `tekton_mutex_*`
//! in the style of Tekton's `tekton_pipelines_controller_*`.
//!
//! Labels are bounded: `namespace` (one series per namespace that uses a
//! Mutex, never per key or run), `verb`/`resource` (a fixed set of writes),
//! `kind`/`controller` (a fixed set of errors), `param` (the Mutex params). One gauge is
//! per lock object, and only while it has waiters: the oldest waiter's age, since a stuck
//! queue must be found by name before anyone waits on it.

use crate::core::params;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::{Mutex, MutexStatus};
use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Ns {
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Param {
    pub namespace: String,
    /// The param at fault, or the kind of mistake (bounded, see `reason_of`).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorKind {
    pub controller: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Write {
    pub verb: String,
    pub resource: String,
}

type Seconds = Family<Ns, Histogram, fn() -> Histogram>;

/// Waits range from a fraction of a second to hours.
fn wait_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.25, 2.0, 16))
}

/// Handover is driven by watch events: milliseconds to a few seconds.
fn handover_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

pub struct Metrics {
    registry: Registry,
    pub grants: Family<Ns, Counter>,
    pub supersedes: Family<Ns, Counter>,
    pub cancels: Family<Ns, Counter>,
    pub timeouts: Family<Ns, Counter>,
    pub started_without_grant: Family<Ns, Counter>,
    pub invalid_params: Family<Param, Counter>,
    pub reconcile_errors: Family<ErrorKind, Counter>,
    pub api_writes: Family<Write, Counter>,
    pub api_write_failures: Family<Write, Counter>,
    pub wait_seconds: Seconds,
    pub handover_seconds: Seconds,
    /// When the watch first showed a holder's PipelineRun done, by (namespace, key, PipelineRun).
    done_seen: std::sync::Mutex<HashMap<(String, String, String), Timestamp>>,
    /// Keys whose slot was freed with waiters queued but not yet handed over.
    freed: std::sync::Mutex<HashMap<(String, String), Timestamp>>,
    mutexes: Arc<OnceLock<Store<Mutex>>>,
    cluster_mutexes: Arc<OnceLock<Store<ClusterMutex>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut m = Metrics {
            registry: Registry::default(),
            grants: Family::default(),
            supersedes: Family::default(),
            cancels: Family::default(),
            timeouts: Family::default(),
            started_without_grant: Family::default(),
            invalid_params: Family::default(),
            reconcile_errors: Family::default(),
            api_writes: Family::default(),
            api_write_failures: Family::default(),
            wait_seconds: Family::new_with_constructor(wait_buckets),
            handover_seconds: Family::new_with_constructor(handover_buckets),
            done_seen: Default::default(),
            freed: Default::default(),
            mutexes: Default::default(),
            cluster_mutexes: Default::default(),
        };
        m.register_all();
        m
    }

    /// Every metric, in the registry /metrics renders.
    fn register_all(&mut self) {
        let m = self;
        let r = &mut m.registry;
        r.register(
            "tekton_mutex_grants",
            "Slots granted (fencing tokens handed out)",
            m.grants.clone(),
        );
        r.register(
            "tekton_mutex_supersedes",
            "Runs marked Superseded",
            m.supersedes.clone(),
        );
        r.register(
            "tekton_mutex_cancels",
            "Superseded PipelineRuns cancelled",
            m.cancels.clone(),
        );
        r.register(
            "tekton_mutex_timeouts",
            "Runs that timed out waiting",
            m.timeouts.clone(),
        );
        r.register(
            "tekton_mutex_started_without_grant",
            "Queued PipelineRuns someone else started while they waited: cancelled",
            m.started_without_grant.clone(),
        );
        r.register(
            "tekton_mutex_invalid_params",
            "Runs failed as InvalidParams, by reason (the param at fault)",
            m.invalid_params.clone(),
        );
        r.register(
            "tekton_mutex_reconcile_errors",
            "Reconciles that failed and were retried, by kind of error",
            m.reconcile_errors.clone(),
        );
        r.register(
            "tekton_mutex_api_writes",
            "Writes to the Kubernetes API, by verb and resource",
            m.api_writes.clone(),
        );
        r.register(
            "tekton_mutex_api_write_failures",
            "Writes the API server refused (conflicts aside), by verb and resource",
            m.api_write_failures.clone(),
        );
        r.register(
            "tekton_mutex_wait_seconds",
            "How long a run waited before it was granted (its waitedSeconds)",
            m.wait_seconds.clone(),
        );
        r.register(
            "tekton_mutex_handover_seconds",
            "From the watch event that shows a holder done to the next grant written",
            m.handover_seconds.clone(),
        );
        r.register_collector(Box::new(LockGauges(m.mutexes.clone())));
        r.register_collector(Box::new(OldestWaiters {
            mutexes: m.mutexes.clone(),
            cluster_mutexes: m.cluster_mutexes.clone(),
        }));
    }

    /// The holders and waiters gauges read the Mutex cache from now on.
    pub fn watch_mutexes(&self, store: Store<Mutex>) {
        let _ = self.mutexes.set(store);
    }

    /// The oldest-waiter gauge reads the ClusterMutex cache too from now on.
    pub fn watch_cluster_mutexes(&self, store: Store<ClusterMutex>) {
        let _ = self.cluster_mutexes.set(store);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "could not encode metrics");
        }
        out
    }

    /// Count one write to the API server, made right after this call. Every
    /// write the controller makes is announced here, from its call site: the
    /// in-process fault suite (controller/tests/sieve) attributes each write it sees
    /// to that site, and fails on a write that was not announced.
    #[track_caller]
    pub fn api_write(&self, verb: &str, resource: &str) {
        #[cfg(test)]
        write_sites::announce(std::panic::Location::caller(), verb, resource);
        self.api_writes
            .get_or_create(&Write {
                verb: verb.into(),
                resource: resource.into(),
            })
            .inc();
    }

    /// A write the API server refused for a reason other than a conflict.
    pub fn api_write_failed(&self, verb: &str, resource: &str) {
        self.api_write_failures
            .get_or_create(&Write {
                verb: verb.into(),
                resource: resource.into(),
            })
            .inc();
    }

    pub fn reconcile_error(&self, controller: &str, kind: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorKind {
                controller: controller.into(),
                kind: kind.into(),
            })
            .inc();
    }

    pub fn invalid(&self, namespace: &str, message: &str) {
        self.invalid_params
            .get_or_create(&Param {
                namespace: namespace.into(),
                reason: reason_of(message).into(),
            })
            .inc();
    }

    /// A PipelineRun event: if it shows a holder's PipelineRun done, the
    /// release starts now as far as the controller can see (for handover).
    pub fn pipeline_run_seen(&self, namespace: &str, name: &str, done: bool, keys: &[String]) {
        let Some(store) = self.mutexes.get().filter(|_| done) else {
            return;
        };
        let mut seen = self.done_seen.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            let m = store.get(&kube::runtime::reflector::ObjectRef::new(key).within(namespace));
            let holds = m.and_then(|m| m.status.clone()).is_some_and(|s| {
                s.holders
                    .iter()
                    .any(|h| h.pipeline_run.as_deref() == Some(name))
            });
            if holds {
                let id = (namespace.to_string(), key.clone(), name.to_string());
                seen.entry(id).or_insert_with(Timestamp::now);
            }
        }
    }

    /// Counts what a written Mutex status changed: grants with their wait,
    /// and the handover from a freed slot to the next grant.
    /// `seen` is when the sync that wrote it started.
    pub fn status_written(
        &self,
        namespace: &str,
        key: &str,
        before: &MutexStatus,
        after: &MutexStatus,
        seen: Timestamp,
    ) {
        let ns = Ns {
            namespace: namespace.into(),
        };
        let held = |s: &MutexStatus, uid: &str| s.holders.iter().any(|h| h.run.uid == uid);
        let granted = after
            .holders
            .iter()
            .filter(|h| !held(before, &h.run.uid))
            .inspect(|h| {
                self.grants.get_or_create(&ns).inc();
                self.wait_seconds
                    .get_or_create(&ns)
                    .observe(h.waited_seconds as f64);
            })
            .count();
        let released = self.released_at(namespace, key, before, after, seen);
        let slot = (namespace.to_string(), key.to_string());
        let mut freed = self.freed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = released.filter(|_| !before.queue.is_empty()) {
            freed.entry(slot.clone()).or_insert(at);
        }
        if granted > 0
            && let Some(since) = freed.remove(&slot)
        {
            let latency =
                Duration::try_from(Timestamp::now().duration_since(since)).unwrap_or_default();
            self.handover_seconds
                .get_or_create(&ns)
                .observe(latency.as_secs_f64());
        }
        if after.queue.is_empty() {
            freed.remove(&slot);
        }
    }

    /// When the earliest holder this write let go was seen done (else `seen`).
    fn released_at(
        &self,
        namespace: &str,
        key: &str,
        before: &MutexStatus,
        after: &MutexStatus,
        seen: Timestamp,
    ) -> Option<Timestamp> {
        let mut done = self.done_seen.lock().unwrap_or_else(|e| e.into_inner());
        before
            .holders
            .iter()
            .filter(|h| !after.holders.iter().any(|a| a.run.uid == h.run.uid))
            .map(|h| {
                let id = (
                    namespace.to_string(),
                    key.to_string(),
                    h.pipeline_run.clone().unwrap_or_default(),
                );
                done.remove(&id).unwrap_or(seen).min(seen)
            })
            .min()
    }
}

/// A bounded reason for an InvalidParams message: the known param it names
/// (messages start with it), else the kind of mistake.
fn reason_of(message: &str) -> &'static str {
    let mut fields =
        (params::PARAMS.iter().map(|p| p.name)).chain(params::RUN_SPEC_FIELDS.iter().copied());
    let named = message
        .strip_prefix("param \"")
        .or_else(|| message.strip_prefix("spec."))
        .or_else(|| message.starts_with("key ").then_some("key"));
    if let Some(rest) = named
        && let Some(p) = fields.find(|p| {
            rest.strip_prefix(p)
                .is_some_and(|r| r.is_empty() || r.starts_with(['"', ' ']))
        })
    {
        return p;
    }
    if message.starts_with("unknown param") {
        "unknown-param"
    } else if message.starts_with("customSpec") {
        "spec"
    } else {
        "other"
    }
}

/// Holders and waiters per namespace, read from the Mutex cache at scrape
/// time, so a warm standby reports them too.
#[derive(Debug)]
struct LockGauges(Arc<OnceLock<Store<Mutex>>>);

impl Collector for LockGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut holders: BTreeMap<String, i64> = BTreeMap::new();
        let mut waiters: BTreeMap<String, i64> = BTreeMap::new();
        if let Some(store) = self.0.get() {
            for m in store.state() {
                let ns = m.namespace().unwrap_or_default();
                let s = m.status.clone().unwrap_or_default();
                *holders.entry(ns.clone()).or_default() += s.holders.len() as i64;
                *waiters.entry(ns).or_default() += s.queue.len() as i64;
            }
        }
        for (name, help, values) in [
            (
                "tekton_mutex_holders",
                "Runs holding a slot, per namespace",
                holders,
            ),
            (
                "tekton_mutex_waiters",
                "Runs waiting for a slot, per namespace",
                waiters,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (namespace, v) in values {
                let labels = Ns { namespace };
                ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Lock {
    kind: String,
    /// Empty for a ClusterMutex.
    namespace: String,
    name: String,
}

/// The age of each lock object's oldest waiter, read from the caches at scrape time (a warm
/// standby reports it too), so an alert fires while a queue is stuck, not after its grant.
#[derive(Debug)]
struct OldestWaiters {
    mutexes: Arc<OnceLock<Store<Mutex>>>,
    cluster_mutexes: Arc<OnceLock<Store<ClusterMutex>>>,
}

impl Collector for OldestWaiters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = Timestamp::now();
        // Per lock: its oldest waiter's age, and the waiters a window holds back (read at once,
        // so that no status is copied).
        let gauges =
            |status: Option<&MutexStatus>| (oldest_wait(status, now), held_by_window(status));
        let mut locks: Vec<(Lock, LockGaugeValues)> = vec![];
        if let Some(store) = self.mutexes.get() {
            locks.extend(store.state().iter().map(|m| {
                let lock = Lock {
                    kind: "Mutex".into(),
                    namespace: m.namespace().unwrap_or_default(),
                    name: m.name_any(),
                };
                (lock, gauges(m.status.as_ref()))
            }));
        }
        if let Some(store) = self.cluster_mutexes.get() {
            locks.extend(store.state().iter().map(|c| {
                let lock = Lock {
                    kind: "ClusterMutex".into(),
                    namespace: String::new(),
                    name: c.name_any(),
                };
                (lock, gauges(c.status.as_ref()))
            }));
        }
        let mut family = encoder.encode_descriptor(
            "tekton_mutex_oldest_waiter_age_seconds",
            "How long the oldest waiter of a lock object has waited, per lock with waiters",
            None,
            MetricType::Gauge,
        )?;
        for (lock, (age, _)) in &locks {
            if let Some(age) = *age {
                ConstGauge::new(age).encode(family.encode_family(lock)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "tekton_mutex_waiters_held_by_window",
            "Waiters a scheduled window (spec.windows) keeps from a grant, per lock with any",
            None,
            MetricType::Gauge,
        )?;
        for (lock, (_, held)) in &locks {
            if let Some(held) = *held {
                ConstGauge::new(held).encode(family.encode_family(lock)?)?;
            }
        }
        Ok(())
    }
}

/// A lock's per-lock gauges: its oldest waiter's age, the waiters a window holds back.
type LockGaugeValues = (Option<f64>, Option<i64>);

/// How many waiters a closed window holds back, when one does and there are any.
fn held_by_window(status: Option<&MutexStatus>) -> Option<i64> {
    let s = status?;
    (s.closed_by_window.is_some() && !s.queue.is_empty()).then_some(s.queue.len() as i64)
}

/// Seconds since the longest waiting entry of `status` started waiting (its PipelineRun's
/// creation when the status predates `waitingSince`); none without waiters.
fn oldest_wait(status: Option<&MutexStatus>, now: Timestamp) -> Option<f64> {
    let since = status?
        .queue
        .iter()
        .map(|w| w.waiting_since.unwrap_or(w.age.created))
        .min()?;
    Some(now.duration_since(since).as_secs_f64().max(0.0))
}

/// Test hook: the writes announced on this thread and not yet matched to a
/// request, oldest first, while a test records them (see controller/tests/sieve).
/// Release builds have no such hook.
#[cfg(test)]
pub(crate) mod write_sites {
    use std::cell::RefCell;
    use std::panic::Location;

    /// One announced write: where `api_write` was called, and what it said.
    #[derive(Clone, Debug)]
    pub struct Announced {
        pub site: &'static Location<'static>,
        pub verb: String,
        pub resource: String,
    }

    thread_local! {
        static PENDING: RefCell<Option<Vec<Announced>>> = const { RefCell::new(None) };
    }

    pub(super) fn announce(site: &'static Location<'static>, verb: &str, resource: &str) {
        PENDING.with_borrow_mut(|p| {
            if let Some(p) = p {
                p.push(Announced {
                    site,
                    verb: verb.into(),
                    resource: resource.into(),
                });
            }
        });
    }

    /// Start recording on this thread (from empty).
    pub fn record() {
        PENDING.with_borrow_mut(|p| *p = Some(Vec::new()));
    }

    /// The oldest announcement not yet matched, taken.
    pub fn take_oldest() -> Option<Announced> {
        PENDING.with_borrow_mut(|p| {
            let p = p.as_mut()?;
            (!p.is_empty()).then(|| p.remove(0))
        })
    }

    /// The announcements not yet matched, left in place.
    pub fn pending() -> Vec<Announced> {
        PENDING.with_borrow(|p| p.clone().unwrap_or_default())
    }

    #[test]
    fn a_write_is_announced_from_its_call_site_once_recording() {
        let metrics = super::Metrics::new();
        metrics.api_write("create", "events");
        assert!(take_oldest().is_none(), "not recorded yet");
        record();
        let line = line!() + 1;
        metrics.api_write("patch", "mutexes");
        let pending = pending();
        assert_eq!(pending.len(), 1);
        let a = take_oldest().expect("announced");
        assert_eq!((a.site.file(), a.site.line()), (file!(), line));
        assert_eq!((a.verb.as_str(), a.resource.as_str()), ("patch", "mutexes"));
        assert!(take_oldest().is_none());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mutex::{Age, Holder, RunKind, RunRef, Supersede, Waiter};

    fn run(uid: &str) -> RunRef {
        RunRef {
            kind: RunKind::CustomRun,
            name: uid.into(),
            uid: uid.into(),
        }
    }

    fn age() -> Age {
        Age {
            sequence: None,
            created: Timestamp::UNIX_EPOCH,
            name: "p".into(),
        }
    }

    fn holder(uid: &str, waited: i64) -> Holder {
        Holder {
            run: run(uid),
            pipeline_run: None,
            pipeline_run_uid: None,
            token: 1,
            since: Timestamp::UNIX_EPOCH,
            waited_seconds: waited,
            group: "g".into(),
            age: age(),
            supersede: Supersede::None,
        }
    }

    fn waiter(uid: &str) -> Waiter {
        Waiter {
            run: run(uid),
            pipeline_run: None,
            pipeline_run_uid: None,
            group: "g".into(),
            age: age(),
            priority: 0,
            supersede: Supersede::None,
            waiting_since: None,
        }
    }

    #[test]
    fn grants_count_waits_and_handovers() {
        let m = Metrics::new();
        let empty = MutexStatus::default();
        let a_holds = MutexStatus {
            holders: vec![holder("a", 0)],
            queue: vec![waiter("b")],
            ..Default::default()
        };
        let b_holds = MutexStatus {
            holders: vec![holder("b", 7)],
            ..Default::default()
        };
        m.status_written("ns", "k", &empty, &a_holds, Timestamp::now());
        m.status_written("ns", "k", &a_holds, &b_holds, Timestamp::now());
        let text = m.render();
        for line in [
            "tekton_mutex_grants_total{namespace=\"ns\"} 2",
            "tekton_mutex_wait_seconds_count{namespace=\"ns\"} 2",
            "tekton_mutex_wait_seconds_sum{namespace=\"ns\"} 7.0",
            "tekton_mutex_handover_seconds_count{namespace=\"ns\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn a_release_with_nobody_waiting_is_no_handover() {
        let m = Metrics::new();
        let a_holds = MutexStatus {
            holders: vec![holder("a", 0)],
            ..Default::default()
        };
        m.status_written(
            "ns",
            "k",
            &a_holds,
            &MutexStatus::default(),
            Timestamp::now(),
        );
        m.status_written(
            "ns",
            "k",
            &MutexStatus::default(),
            &a_holds,
            Timestamp::now(),
        );
        assert!(!m.render().contains("tekton_mutex_handover_seconds_count{"));
    }

    /// Every param of the one table is a reason of its own.
    #[test]
    fn every_param_is_a_reason() {
        for name in params::PARAMS
            .iter()
            .map(|d| d.name)
            .chain(params::RUN_SPEC_FIELDS.iter().copied())
        {
            let message = format!("param \"{name}\" has invalid value \"x\"");
            assert_eq!(reason_of(&message), name);
        }
    }

    #[test]
    fn invalid_params_are_counted_by_reason() {
        for (message, reason) in [
            ("param \"wait\" has invalid value \"x\"", "wait"),
            ("spec.timeout \"soon\" is not a duration: bad", "timeout"),
            ("key \"A\" is not a valid name", "key"),
            (
                "unknown param \"colour\": allowed params are key",
                "unknown-param",
            ),
            ("param \"colour\" is given more than once", "other"),
            ("something odd", "other"),
        ] {
            assert_eq!(reason_of(message), reason, "{message}");
        }
        let m = Metrics::new();
        m.invalid("ns", "param \"priority\" must be an integer, got \"x\"");
        let text = m.render();
        assert!(
            text.contains(
                "tekton_mutex_invalid_params_total{namespace=\"ns\",reason=\"priority\"} 1"
            ),
            "{text}"
        );
    }
}

#[cfg(test)]
mod oldest_waiter_tests {
    use super::*;
    use crate::model::mutex::{Age, RunKind, RunRef, Supersede, Waiter};
    use kube::runtime::{reflector, watcher};

    fn waiting(name: &str, since: Option<i64>, created: i64) -> Waiter {
        Waiter {
            run: RunRef {
                kind: RunKind::CustomRun,
                name: name.into(),
                uid: name.into(),
            },
            pipeline_run: None,
            pipeline_run_uid: None,
            group: "g".into(),
            age: Age {
                sequence: None,
                created: Timestamp::from_second(created).unwrap(),
                name: name.into(),
            },
            priority: 0,
            supersede: Supersede::None,
            waiting_since: since.map(|s| Timestamp::from_second(s).unwrap()),
        }
    }

    #[test]
    fn the_oldest_wait_is_the_earliest_start_and_none_without_waiters() {
        let now = Timestamp::from_second(1_000).unwrap();
        let mut st = MutexStatus::default();
        assert_eq!(oldest_wait(Some(&st), now), None);
        assert_eq!(oldest_wait(None, now), None);
        // The second entry predates waitingSince: its creation stands in.
        st.queue = vec![waiting("a", Some(900), 100), waiting("b", None, 700)];
        assert_eq!(oldest_wait(Some(&st), now), Some(300.0));
    }

    #[test]
    fn a_lock_with_waiters_is_a_series_named_by_kind_namespace_and_name() {
        let metrics = Metrics::new();
        let (store, mut writer) = reflector::store::<Mutex>();
        let mut busy = Mutex::new("deploy", Default::default());
        busy.metadata.namespace = Some("team".into());
        busy.status = Some(MutexStatus {
            queue: vec![waiting("w", Some(0), 0)],
            ..Default::default()
        });
        let mut idle = Mutex::new("idle", Default::default());
        idle.metadata.namespace = Some("team".into());
        writer.apply_watcher_event(&watcher::Event::Apply(busy));
        writer.apply_watcher_event(&watcher::Event::Apply(idle));
        metrics.watch_mutexes(store);
        let text = metrics.render();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("tekton_mutex_oldest_waiter_age_seconds{"))
            .collect();
        assert_eq!(series.len(), 1, "{text}");
        assert!(
            series[0].contains(r#"kind="Mutex",namespace="team",name="deploy""#),
            "{}",
            series[0]
        );
    }

    #[test]
    fn waiters_held_by_a_window_are_counted_per_lock_only_while_one_holds_them() {
        let metrics = Metrics::new();
        let (store, mut writer) = reflector::store::<Mutex>();
        let lock = |name: &str, window: Option<&str>, waiters: usize| {
            let mut m = Mutex::new(name, Default::default());
            m.metadata.namespace = Some("team".into());
            m.status = Some(MutexStatus {
                queue: (0..waiters)
                    .map(|i| waiting(&format!("{name}-{i}"), Some(0), 0))
                    .collect(),
                closed_by_window: window.map(String::from),
                ..Default::default()
            });
            m
        };
        let freeze = Some("deny window freeze until Mon 08:00 UTC");
        for m in [
            lock("held", freeze, 2),
            lock("open", None, 3),
            lock("quiet", freeze, 0),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(m));
        }
        metrics.watch_mutexes(store);
        let text = metrics.render();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("tekton_mutex_waiters_held_by_window{"))
            .collect();
        assert_eq!(
            series,
            [r#"tekton_mutex_waiters_held_by_window{kind="Mutex",namespace="team",name="held"} 2"#],
            "{text}"
        );
    }
}
