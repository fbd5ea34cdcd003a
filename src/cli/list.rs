//! `tkn mutex list [-A | --cluster]`: one line per key.

use super::lock::Lock;
use super::output::{age, table};
use super::target::{Result, Target, api_failure};
use clap::Args;
use jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;

#[derive(Args)]
pub struct ListArgs {
    /// List the keys of every namespace.
    #[arg(short = 'A', long)]
    all_namespaces: bool,
}

pub async fn run(target: &Target, args: ListArgs) -> Result<()> {
    let locks = read(target, args.all_namespaces).await?;
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

/// The table: holders with their age, queue length, last token, capacity, frozen.
pub fn render(locks: &[Lock], all_namespaces: bool, now: Timestamp) -> String {
    let mut headers = vec![
        "KEY",
        "HOLDERS",
        "WAITING",
        "LAST TOKEN",
        "CAPACITY",
        "FROZEN",
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
            "NAMESPACE   KEY       HOLDERS                    WAITING   LAST TOKEN   CAPACITY   FROZEN\n\
             ci          staging   deploy-3 (5 minutes ago)   0         7            1          no\n\
             ci          prod      ---                        0         7            1          yes\n"
        );
    }
}
