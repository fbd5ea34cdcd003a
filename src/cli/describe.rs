//! `tkn mutex describe KEY [-o json|yaml]`: holders, the queue in grant order,
//! the last supersede per group, recent requests and Events.

use super::lock::{Lock, locate};
use super::output::{Format, age, formatted, or_dashes, parse_time, table};
use super::target::{Result, Target, api_failure};
use crate::core::requests::ObservedRequest;
use crate::model::mutex::{RunKind, Waiter};
use crate::model::selector::{RunSelector, ValueFrom};
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::pipelinerun::PipelineRun;
use crate::model::tekton::run::Run;
use clap::Args;
use jiff::Timestamp;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Serialize;
use std::collections::HashMap;

/// How many of the key's most recent Events describe shows.
const RECENT_EVENTS: usize = 10;

#[derive(Args)]
pub struct DescribeArgs {
    /// The key (the Mutex's name).
    key: String,
    /// Print for scripts instead of the text: the data below as JSON or YAML.
    #[arg(short = 'o', long, value_enum)]
    output: Option<Format>,
}

/// Everything describe shows, as `-o json|yaml` prints it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Described {
    pub key: String,
    /// `Mutex` or `ClusterMutex`.
    pub kind: String,
    /// A Mutex's namespace; none for a ClusterMutex (its runs are named `namespace/name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub capacity: u32,
    pub order: String,
    pub max_queue: u32,
    pub frozen: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen_reason: Option<String>,
    /// Its scheduled windows, one line each ("deny weekend-freeze: 0 18 * * fri for 62h ...").
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<String>,
    /// What its windows say now ("open until ...", "closed: ...", "open: ... overridden ..."),
    /// judged from the spec as the controller judges it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub windows_now: Option<String>,
    pub last_token: i64,
    /// What its `spec.selector` takes by itself, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selects: Option<Selects>,
    pub holders: Vec<HolderRow>,
    /// In the order they will be granted.
    pub queue: Vec<WaiterRow>,
    pub supersede_marks: Vec<MarkRow>,
    pub requests: Vec<ObservedRequest>,
    pub events: Vec<EventRow>,
}

/// A lock's selector, and where it reads a selected run's key and sequence.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Selects {
    pub selector: RunSelector,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_from: Option<ValueFrom>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_from: Option<ValueFrom>,
}

impl Selects {
    fn of(lock: &Lock) -> Option<Selects> {
        let (selector, key_from, sequence_from) = match lock {
            Lock::Mutex(m) => (&m.spec.selector, &m.spec.key_from, &m.spec.sequence_from),
            Lock::Cluster(c) => (&c.spec.selector, &None, &c.spec.sequence_from),
        };
        Some(Selects {
            selector: selector.clone()?,
            key_from: key_from.clone(),
            sequence_from: sequence_from.clone(),
        })
    }

    /// One line: `pipelines promote; labels env=staging; key from param environment`.
    fn line(&self) -> String {
        let s = &self.selector;
        let mut parts = Vec::new();
        if !s.pipelines.is_empty() {
            parts.push(format!("pipelines {}", s.pipelines.join(",")));
        }
        let mut labels: Vec<String> = s
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        labels.extend(
            s.match_expressions
                .iter()
                .map(|e| match e.values.is_empty() {
                    true => format!("{} {:?}", e.key, e.operator),
                    false => format!("{} {:?} ({})", e.key, e.operator, e.values.join(",")),
                }),
        );
        if !labels.is_empty() {
            parts.push(format!("labels {}", labels.join(", ")));
        }
        let from = |what: &str, f: &ValueFrom| match (&f.param, &f.label) {
            (Some(p), _) => format!("{what} from param {p}"),
            (None, Some(l)) => format!("{what} from label {l}"),
            (None, None) => format!("{what} from nothing"),
        };
        parts.extend(self.key_from.as_ref().map(|f| from("key", f)));
        parts.extend(self.sequence_from.as_ref().map(|f| from("sequence", f)));
        parts.join("; ")
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderRow {
    pub pipeline_run: Option<String>,
    pub lock_run: String,
    pub token: i64,
    pub since: Timestamp,
    /// The PipelineRun's Succeeded reason (e.g. Running), `Gone` if deleted.
    pub state: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaiterRow {
    pub position: usize,
    pub pipeline_run: Option<String>,
    /// A PipelineRun queued as a whole (created Pending), not a lock task's run.
    pub pending_pipeline_run: bool,
    pub lock_run: String,
    pub group: String,
    pub sequence: Option<i64>,
    pub priority: i64,
    pub promoted: bool,
    pub waiting_since: Option<Timestamp>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MarkRow {
    pub group: String,
    pub newest: String,
    pub granted: Option<Timestamp>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRow {
    pub time: Option<Timestamp>,
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub object: String,
    pub note: String,
}

pub async fn run(target: &Target, args: DescribeArgs) -> Result<()> {
    let lock = target.lock(&args.key).await?;
    let d = gather(target, &lock).await?;
    let text = match args.output {
        Some(format) => formatted(&d, format)?,
        None => render(&d, Timestamp::now()),
    };
    print!("{text}");
    Ok(())
}

/// Read what the status names: the holders' PipelineRuns, the waiters' lock runs, Events.
async fn gather(target: &Target, lock: &Lock) -> Result<Described> {
    let st = lock.status();
    let mut holders = Vec::new();
    for h in &st.holders {
        let state = match &h.pipeline_run {
            Some(pr) => pipeline_run_state(target, pr, h.pipeline_run_uid.as_deref()).await?,
            None => "standalone".into(),
        };
        holders.push(HolderRow {
            pipeline_run: h.pipeline_run.clone(),
            lock_run: h.run.name.clone(),
            token: h.token,
            since: h.since,
            state,
        });
    }
    let starts = start_times(target, &st.queue).await?;
    let queue = st
        .queue
        .iter()
        .enumerate()
        .map(|(i, w)| WaiterRow {
            position: i + 1,
            pipeline_run: w.pipeline_run.clone(),
            pending_pipeline_run: w.run.kind == RunKind::PipelineRun,
            lock_run: w.run.name.clone(),
            group: w.group.clone(),
            sequence: w.age.sequence,
            priority: w.priority,
            promoted: st.promoted.contains(&w.run.uid),
            waiting_since: starts.get(&w.run.uid).copied(),
        })
        .collect::<Vec<_>>();
    let marks = st.groups.iter().map(|g| MarkRow {
        group: g.group.clone(),
        newest: g.pipeline_run.clone().unwrap_or(g.newest.name.clone()),
        granted: g.granted,
    });
    let mut names: Vec<String> = Vec::new();
    names.extend(holders.iter().filter_map(|h| h.pipeline_run.clone()));
    names.extend(queue.iter().filter_map(|w| w.pipeline_run.clone()));
    names.extend(st.holders.iter().map(|h| h.run.name.clone()));
    names.extend(st.queue.iter().map(|w| w.run.name.clone()));
    let spec = lock.spec();
    Ok(Described {
        key: lock.name(),
        kind: target.kind(),
        namespace: lock.namespace(),
        capacity: spec.capacity,
        order: spec.order.as_str().into(),
        max_queue: spec.max_queue,
        frozen: spec.frozen,
        frozen_reason: spec.frozen_reason.clone(),
        windows: spec.windows.iter().map(window_line).collect(),
        windows_now: crate::windows::now_line(spec, jiff::Timestamp::now()),
        last_token: st.last_token,
        selects: Selects::of(lock),
        holders,
        queue,
        supersede_marks: marks.collect(),
        requests: st.observed_requests.clone(),
        events: events(target, &lock.name(), &names).await?,
    })
}

async fn pipeline_run_state(target: &Target, name: &str, uid: Option<&str>) -> Result<String> {
    let (ns, local) = locate(target, name);
    let api: Api<PipelineRun> = Api::namespaced(target.client.clone(), ns);
    let pr = api
        .get_opt(local)
        .await
        .map_err(|e| api_failure(target, &format!("read PipelineRun {name}"), e))?
        .filter(|p| uid.is_none() || p.uid().as_deref() == uid);
    Ok(match pr {
        None => "Gone".into(),
        Some(p) => p
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Succeeded"))
            .and_then(|c| c.reason)
            .unwrap_or_else(|| "Started".into()),
    })
}

/// When each waiting lock run started waiting (its current attempt's start), by
/// uid: one list per kind in the queue, not one read per waiter.
async fn start_times(target: &Target, queue: &[Waiter]) -> Result<HashMap<String, Timestamp>> {
    let has = |kind| queue.iter().any(|w| w.run.kind == kind);
    let mut starts = Vec::new();
    if has(RunKind::CustomRun) {
        let api: Api<CustomRun> = runs_api(target);
        let list = api.list(&ListParams::default()).await;
        let list = list.map_err(|e| api_failure(target, "list CustomRuns", e))?;
        starts.extend(
            list.items
                .into_iter()
                .map(|r| (r.uid(), r.status.and_then(|s| s.start_time))),
        );
    }
    if has(RunKind::Run) {
        let api: Api<Run> = runs_api(target);
        let list = api.list(&ListParams::default()).await;
        let list = list.map_err(|e| api_failure(target, "list Runs", e))?;
        starts.extend(
            list.items
                .into_iter()
                .map(|r| (r.uid(), r.status.and_then(|s| s.start_time))),
        );
    }
    if has(RunKind::PipelineRun) {
        // Queued as a whole: it waits from its creation (it has not started).
        let api: Api<PipelineRun> = runs_api(target);
        let list = api.list(&ListParams::default()).await;
        let list = list.map_err(|e| api_failure(target, "list PipelineRuns", e))?;
        starts.extend(list.items.into_iter().map(|p| {
            let created = p.creation_timestamp().map(|t| t.0.to_string());
            (p.uid(), created)
        }));
    }
    Ok(starts
        .into_iter()
        .filter_map(|(uid, t)| Some((uid?, parse_time(t.as_deref())?)))
        .collect())
}

/// Where the lock's runs live: the namespace of a Mutex, every namespace for a ClusterMutex.
fn runs_api<K>(target: &Target) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match target.cluster {
        true => Api::all(target.client.clone()),
        false => Api::namespaced(target.client.clone(), &target.namespace),
    }
}

/// The most recent Events about the lock, its holders and waiters (theirs and
/// their lock runs'); `names` as the lock's status writes them.
async fn events(target: &Target, lock: &str, names: &[String]) -> Result<Vec<EventRow>> {
    let api: Api<Event> = runs_api(target);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| api_failure(target, "list events", e))?;
    let wanted: Vec<(&str, &str)> = names.iter().map(|n| locate(target, n)).collect();
    let about = |ns: Option<&str>, kind: Option<&str>, name: &str| {
        let the_lock = name == lock && kind == Some(target.kind().as_str());
        the_lock
            || wanted
                .iter()
                .any(|(n, l)| *l == name && ns.is_none_or(|ns| ns == *n))
    };
    // Events mirrored from core/v1 (Tekton's) have no eventTime: their last timestamp counts.
    let time = |e: &Event| -> Option<Timestamp> {
        let last = e.series.as_ref().map(|s| &s.last_observed_time);
        match (last, &e.event_time, &e.deprecated_last_timestamp) {
            (Some(t), _, _) => Some(t.0),
            (None, Some(t), _) => Some(t.0),
            (None, None, Some(t)) => Some(t.0),
            (None, None, None) => e.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    };
    let mut rows: Vec<EventRow> = list
        .items
        .iter()
        .filter_map(|e| {
            let r = e.regarding.as_ref()?;
            let name = r.name.clone()?;
            let ns = e.metadata.namespace.as_deref();
            about(ns, r.kind.as_deref(), &name).then(|| EventRow {
                time: time(e),
                type_: e.type_.clone().unwrap_or_default(),
                reason: e.reason.clone().unwrap_or_default(),
                object: format!("{}/{name}", r.kind.clone().unwrap_or_default()),
                note: e.note.clone().unwrap_or_default(),
            })
        })
        .collect();
    rows.sort_by_key(|r| r.time);
    let skip = rows.len().saturating_sub(RECENT_EVENTS);
    Ok(rows.split_off(skip))
}

/// A window as one line: "deny weekend-freeze: 0 18 * * fri for 62h (Europe/Berlin)".
fn window_line(w: &crate::model::window::Window) -> String {
    let zone = w.time_zone.as_deref().unwrap_or("UTC");
    let (kind, name, schedule, duration) = (w.kind.as_str(), &w.name, &w.schedule, &w.duration);
    format!("{kind} {name}: {schedule} for {duration} ({zone})")
}

/// The text: a header, then one table per section.
pub fn render(d: &Described, now: Timestamp) -> String {
    let frozen = match (&d.frozen, &d.frozen_reason) {
        (false, _) => "no".to_string(),
        (true, None) => "yes".into(),
        (true, Some(r)) => format!("yes: {r}"),
    };
    let namespace = match &d.namespace {
        Some(ns) => format!("Namespace:    {ns}\n"),
        None => String::new(),
    };
    let mut out = format!(
        "Name:         {}\nKind:         {}\n{namespace}Capacity:     {}\nOrder:        {}\nMax queue:    {}\nLast token:   {}\nFrozen:       {frozen}\n",
        d.key, d.kind, d.capacity, d.order, d.max_queue, d.last_token
    );
    if let Some(selects) = &d.selects {
        out.push_str(&format!("Selects:      {}\n", selects.line()));
    }
    if !d.windows.is_empty() {
        let now = d.windows_now.as_deref().unwrap_or("open");
        out.push_str(&format!("Windows:      {now}\n"));
        for w in &d.windows {
            out.push_str(&format!("              {w}\n"));
        }
    }
    let headers = ["PIPELINERUN", "LOCK RUN", "TOKEN", "SINCE", "STATE"];
    section(&mut out, "Holders", &headers, &holder_rows(d, now));
    let headers = [
        "POSITION",
        "PIPELINERUN",
        "GROUP",
        "SEQUENCE",
        "PRIORITY",
        "WAITING SINCE",
    ];
    section(
        &mut out,
        "Queue (in grant order)",
        &headers,
        &queue_rows(d, now),
    );
    let marks: Vec<Vec<String>> = d
        .supersede_marks
        .iter()
        .map(|m| vec![m.group.clone(), m.newest.clone(), age(m.granted, now)])
        .collect();
    let headers = ["GROUP", "NEWEST", "GRANTED"];
    section(&mut out, "Last supersede per group", &headers, &marks);
    let headers = ["AGE", "ACTION", "BY", "RESULT", "MESSAGE"];
    section(
        &mut out,
        "Requests (most recent first)",
        &headers,
        &request_rows(d, now),
    );
    let events: Vec<Vec<String>> = d
        .events
        .iter()
        .map(|e| {
            let (t, r) = (e.type_.clone(), e.reason.clone());
            vec![age(e.time, now), t, r, e.object.clone(), e.note.clone()]
        })
        .collect();
    let headers = ["AGE", "TYPE", "REASON", "OBJECT", "MESSAGE"];
    section(&mut out, "Events", &headers, &events);
    out
}

fn holder_rows(d: &Described, now: Timestamp) -> Vec<Vec<String>> {
    d.holders
        .iter()
        .map(|h| {
            vec![
                or_dashes(h.pipeline_run.clone()),
                h.lock_run.clone(),
                h.token.to_string(),
                age(Some(h.since), now),
                h.state.clone(),
            ]
        })
        .collect()
}

fn queue_rows(d: &Described, now: Timestamp) -> Vec<Vec<String>> {
    d.queue
        .iter()
        .map(|w| {
            let promoted = if w.promoted { " (promoted)" } else { "" };
            let pending = if w.pending_pipeline_run {
                " (pending)"
            } else {
                ""
            };
            vec![
                format!("{}{promoted}", w.position),
                format!("{}{pending}", or_dashes(w.pipeline_run.clone())),
                w.group.clone(),
                or_dashes(w.sequence.map(|s| s.to_string())),
                w.priority.to_string(),
                age(w.waiting_since, now),
            ]
        })
        .collect()
}

fn request_rows(d: &Described, now: Timestamp) -> Vec<Vec<String>> {
    d.requests
        .iter()
        .rev()
        .map(|r| {
            vec![
                age(Some(r.at), now),
                r.action.map_or("?", |a| a.as_str()).into(),
                or_dashes(Some(r.by.clone())),
                format!("{:?}", r.verdict),
                r.message.clone(),
            ]
        })
        .collect()
}

fn section(out: &mut String, title: &str, headers: &[&str], rows: &[Vec<String>]) {
    out.push_str(&format!("\n{title}\n"));
    if rows.is_empty() {
        out.push_str(" No entries\n");
        return;
    }
    for line in table(headers, rows).lines() {
        out.push_str(&format!(" {line}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;

    #[test]
    fn describe_takes_dash_o() {
        use crate::cli::{Cli, ClusterCommand, Command};
        use clap::Parser;
        let parsed = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["tkn-mutex", "describe"], args].concat()).unwrap();
            match cli.command {
                Command::Cluster(ClusterCommand::Describe(a)) => (a.key, a.output),
                _ => unreachable!("parsed as describe"),
            }
        };
        assert_eq!(
            parsed(&["staging", "-o", "json"]),
            ("staging".into(), Some(Format::Json))
        );
        assert_eq!(parsed(&["-o", "yaml", "prod"]).1, Some(Format::Yaml));
        assert_eq!(parsed(&["staging"]).1, None);
    }

    #[test]
    fn a_selecting_lock_says_what_it_takes_in_one_line() {
        let m: crate::model::mutex::Mutex = serde_json::from_value(serde_json::json!({
            "apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
            "metadata": {"name": "envs", "namespace": "jx"},
            "spec": {"selector": {"pipelines": ["promote"], "matchLabels": {"team": "web"},
                                  "matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
                     "keyFrom": {"param": "environment"}, "sequenceFrom": {"label": "build"}},
        }))
        .unwrap();
        let line = Selects::of(&Lock::Mutex(m)).unwrap().line();
        assert_eq!(
            line,
            "pipelines promote; labels team=web, skip DoesNotExist; key from param environment; \
             sequence from label build"
        );
        let plain: crate::model::mutex::Mutex = serde_json::from_value(serde_json::json!({
            "apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
            "metadata": {"name": "k", "namespace": "jx"}, "spec": {},
        }))
        .unwrap();
        assert!(Selects::of(&Lock::Mutex(plain)).is_none());
    }

    /// Mutex staging, frozen: deploy-4 holds; deploy-7 (promoted), deploy-5 and the queued
    /// PipelineRun promote-9 wait.
    fn frozen_staging_with_a_queue(now: Timestamp) -> Described {
        let waiter = |position: usize, pr: &str, promoted: bool| WaiterRow {
            position,
            pipeline_run: Some(pr.into()),
            pending_pipeline_run: false,
            lock_run: format!("{pr}-lock"),
            group: "deploy".into(),
            sequence: None,
            priority: 0,
            promoted,
            waiting_since: Some(now - SignedDuration::from_mins(2)),
        };
        Described {
            key: "staging".into(),
            kind: "Mutex".into(),
            namespace: Some("ci".into()),
            capacity: 1,
            order: "oldest-first".into(),
            max_queue: 1000,
            frozen: true,
            frozen_reason: Some("release freeze".into()),
            windows: vec!["deny weekend-freeze: 0 18 * * fri for 62h (Europe/Berlin)".into()],
            windows_now: Some(
                "closed: deny window weekend-freeze until Mon 08:00 Europe/Berlin".into(),
            ),
            last_token: 4,
            selects: None,
            holders: vec![HolderRow {
                pipeline_run: Some("deploy-4".into()),
                lock_run: "deploy-4-lock".into(),
                token: 4,
                since: now - SignedDuration::from_hours(1),
                state: "Running".into(),
            }],
            queue: vec![
                waiter(1, "deploy-7", true),
                waiter(2, "deploy-5", false),
                WaiterRow {
                    pending_pipeline_run: true,
                    ..waiter(3, "promote-9", false)
                },
            ],
            supersede_marks: vec![],
            requests: vec![],
            events: vec![],
        }
    }

    #[test]
    fn the_text_lists_holders_and_the_queue_in_grant_order() {
        let now = Timestamp::now();
        let d = frozen_staging_with_a_queue(now);
        let text = render(&d, now);
        assert!(
            text.contains("Frozen:       yes: release freeze\n")
                && text.contains(
                    "Windows:      closed: deny window weekend-freeze until Mon 08:00 Europe/Berlin\n              deny weekend-freeze: 0 18 * * fri for 62h (Europe/Berlin)\n"
                ),
            "{text}"
        );
        assert!(text.contains(
            "\nHolders\n PIPELINERUN   LOCK RUN        TOKEN   SINCE        STATE\n deploy-4      deploy-4-lock   4       1 hour ago   Running\n"
        ), "{text}");
        let queue = text.split("Queue (in grant order)\n").nth(1).unwrap();
        let order: Vec<&str> = queue
            .lines()
            .skip(1)
            .take(2)
            .map(|l| {
                l.split_whitespace()
                    .nth(if l.contains("promoted") { 2 } else { 1 })
                    .unwrap()
            })
            .collect();
        assert_eq!(order, ["deploy-7", "deploy-5"]);
        assert!(
            queue.contains(" promote-9 (pending) "),
            "a queued PipelineRun is marked: {queue}"
        );
        assert!(text.contains("Last supersede per group\n No entries\n"));
        assert!(!text.contains('\x1b'), "no colour");
        let json = formatted(&d, Format::Json).unwrap();
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(json["queue"][0]["pipelineRun"], "deploy-7", "{json}");
        assert_eq!(json["holders"][0]["state"], "Running");
        let yaml = formatted(&d, Format::Yaml).unwrap();
        assert!(yaml.contains("key: staging\n"), "{yaml}");
    }
}
