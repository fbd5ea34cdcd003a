//! `tkn mutex list [-A | --cluster] [-o json|yaml]`: one line per key, or the
//! objects as a `List`.

use super::lock::Lock;
use super::output::{Format, age, formatted, table};
use super::target::{Failure, Result, Target, api_failure};
use clap::Args;
use jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

#[derive(Args)]
pub struct ListArgs {
    /// List the keys of every namespace.
    #[arg(short = 'A', long)]
    all_namespaces: bool,
    /// Print the Mutexes (or ClusterMutexes) as a List in JSON or YAML instead of the table.
    #[arg(short = 'o', long, value_enum)]
    output: Option<Format>,
}

pub async fn run(target: &Target, args: ListArgs) -> Result<()> {
    let locks = read(target, args.all_namespaces).await?;
    if let Some(format) = args.output {
        // Empty or not, as `kubectl get -o json` prints it: a script reads one shape.
        print!("{}", formatted(&list_object(&locks)?, format)?);
        return Ok(());
    }
    if locks.is_empty() {
        match (target.cluster, args.all_namespaces) {
            (true, _) => eprintln!("No clustermutexes found"),
            (false, true) => eprintln!("No mutexes found"),
            (false, false) => eprintln!("No mutexes found in namespace {}", target.namespace),
        }
        return Ok(());
    }
    let all_namespaces = args.all_namespaces && !target.cluster;
    print!("{}", render(&locks, all_namespaces, Timestamp::now()));
    Ok(())
}

/// The ClusterMutexes, or the Mutexes of the namespace (or of all).
async fn read(target: &Target, all_namespaces: bool) -> Result<Vec<Lock>> {
    let params = ListParams::default();
    let failed = |e| {
        api_failure(
            target,
            &format!("list {}es", target.kind().to_lowercase()),
            e,
        )
    };
    if target.cluster {
        let list = target.clusters().list(&params).await.map_err(failed)?;
        return Ok(list.items.into_iter().map(Lock::Cluster).collect());
    }
    let api: Api<_> = match all_namespaces {
        true => Api::all(target.client.clone()),
        false => target.mutexes(),
    };
    let list = api.list(&params).await.map_err(failed)?;
    Ok(list.items.into_iter().map(Lock::Mutex).collect())
}

/// The objects as kubectl's `get -o json` prints several: a `v1` `List`.
pub fn list_object(locks: &[Lock]) -> Result<Value> {
    let items = locks
        .iter()
        .map(Lock::object)
        .collect::<serde_json::Result<Vec<_>>>()
        .map_err(|e| Failure(format!("could not format the output: {e}")))?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": items,
    }))
}

/// The table: holders with their age, queue length, last token, capacity, frozen.
pub fn render(locks: &[Lock], all_namespaces: bool, now: Timestamp) -> String {
    let mut headers = vec![
        "KEY",
        "HOLDERS",
        "WAITING",
        "LAST TOKEN",
        "CAPACITY",
        "FROZEN",
        "WINDOW",
    ];
    if all_namespaces {
        headers.insert(0, "NAMESPACE");
    }
    let rows: Vec<Vec<String>> = locks
        .iter()
        .map(|m| {
            let st = m.status();
            let holders: Vec<String> = st
                .holders
                .iter()
                .map(|h| {
                    let name = h.pipeline_run.as_deref().unwrap_or(&h.run.name);
                    format!("{name} ({})", age(Some(h.since), now))
                })
                .collect();
            let mut row = vec![
                m.name(),
                match holders.is_empty() {
                    true => "---".into(),
                    false => holders.join(", "),
                },
                st.queue.len().to_string(),
                st.last_token.to_string(),
                m.spec().capacity.to_string(),
                match m.spec().frozen {
                    true => "yes".into(),
                    false => "no".into(),
                },
                crate::windows::now_line(m.spec(), now).unwrap_or_else(|| "---".into()),
            ];
            if all_namespaces {
                row.insert(0, m.namespace().unwrap_or_default());
            }
            row
        })
        .collect();
    table(&headers, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mutex::{
        Age, Holder, LockSpec, Mutex, MutexSpec, MutexStatus, RunKind, RunRef, Supersede,
    };
    use crate::model::window::{Window, WindowKind, WindowOverride};
    use jiff::SignedDuration;

    fn mutex(name: &str, holders: &[(&str, i64)], frozen: bool, now: Timestamp) -> Lock {
        let mut m = Mutex::new(
            name,
            MutexSpec {
                lock: LockSpec {
                    frozen,
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        m.metadata.namespace = Some("ci".into());
        let holders = holders
            .iter()
            .map(|(pr, mins)| Holder {
                run: RunRef {
                    kind: RunKind::CustomRun,
                    name: format!("{pr}-lock"),
                    uid: "u".into(),
                },
                pipeline_run: Some(pr.to_string()),
                pipeline_run_uid: None,
                token: 7,
                since: now - SignedDuration::from_mins(*mins),
                waited_seconds: 0,
                group: "g".into(),
                age: Age {
                    sequence: None,
                    created: now,
                    name: pr.to_string(),
                },
                supersede: Supersede::None,
            })
            .collect();
        m.status = Some(MutexStatus {
            holders,
            last_token: 7,
            ..Default::default()
        });
        Lock::Mutex(m)
    }

    #[test]
    fn list_takes_dash_o() {
        use crate::cli::{Cli, ClusterCommand, Command};
        use clap::Parser;
        let output = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["tkn-mutex", "list"], args].concat()).unwrap();
            match cli.command {
                Command::Cluster(ClusterCommand::List(a)) => a.output,
                _ => unreachable!("parsed as list"),
            }
        };
        assert_eq!(output(&["-o", "json"]), Some(Format::Json));
        assert_eq!(output(&["-A", "--output=yaml"]), Some(Format::Yaml));
        assert_eq!(output(&[]), None, "the table");
    }

    #[test]
    fn the_json_is_a_list_of_the_objects_as_kubectl_prints_it() {
        let now = Timestamp::now();
        let mut lock = mutex("staging", &[("deploy-3", 5)], false, now);
        if let Lock::Mutex(m) = &mut lock {
            m.metadata.managed_fields = Some(vec![Default::default()]);
        }
        let list = list_object(&[lock]).unwrap();
        assert_eq!(list["kind"], "List");
        assert_eq!(list["apiVersion"], "v1");
        let item = &list["items"][0];
        assert_eq!(item["kind"], "Mutex");
        assert_eq!(item["apiVersion"], "tekton-mutex.dev/v1alpha1");
        assert_eq!(item["metadata"]["name"], "staging");
        assert_eq!(item["status"]["holders"][0]["pipelineRun"], "deploy-3");
        assert!(item["metadata"].get("managedFields").is_none());
        let yaml = formatted(&list, Format::Yaml).unwrap();
        assert!(yaml.starts_with("apiVersion: v1\n"), "{yaml}");
        let empty = formatted(&list_object(&[]).unwrap(), Format::Json).unwrap();
        let empty: Value = serde_json::from_str(&empty).unwrap();
        assert_eq!(empty["items"], json!([]));
    }

    #[test]
    fn a_row_per_key_with_holder_ages() {
        let now = Timestamp::now();
        let text = render(
            &[
                mutex("staging", &[("deploy-3", 5)], false, now),
                mutex("prod", &[], true, now),
            ],
            true,
            now,
        );
        assert_eq!(
            text,
            "NAMESPACE   KEY       HOLDERS                    WAITING   LAST TOKEN   CAPACITY   FROZEN   WINDOW\n\
             ci          staging   deploy-3 (5 minutes ago)   0         7            1          no       ---\n\
             ci          prod      ---                        0         7            1          yes      ---\n"
        );
    }

    #[test]
    fn the_window_column_says_what_the_controller_would() {
        let window_column = |spec: &LockSpec, now| crate::windows::now_line(spec, now).unwrap();
        let friday_evening: Timestamp = "2026-12-04T18:30:00+01:00[Europe/Berlin]"
            .parse::<jiff::Zoned>()
            .unwrap()
            .timestamp();
        let freeze = Window {
            name: "weekend-freeze".into(),
            kind: WindowKind::Deny,
            schedule: "0 18 * * fri".into(),
            duration: "62h".into(),
            time_zone: Some("Europe/Berlin".into()),
        };
        let mut spec = LockSpec {
            windows: vec![freeze],
            ..Default::default()
        };
        assert_eq!(
            window_column(&spec, friday_evening),
            "closed: deny window weekend-freeze until Mon 08:00 Europe/Berlin"
        );
        let thursday = friday_evening - jiff::SignedDuration::from_hours(24);
        assert_eq!(
            window_column(&spec, thursday),
            "open until Fri 18:00 Europe/Berlin (deny window weekend-freeze)"
        );
        spec.window_override = Some(WindowOverride {
            until: "2026-12-04T20:00:00Z".into(),
            reason: "hotfix".into(),
        });
        assert_eq!(
            window_column(&spec, friday_evening),
            "open: deny window weekend-freeze until Mon 08:00 Europe/Berlin, overridden until \
             Fri 2026-12-04 20:00 UTC: hotfix"
        );
        spec.windows[0].time_zone = Some("Mars/Olympus".into());
        assert!(window_column(&spec, friday_evening).starts_with("closed: invalid window"));
    }
}
