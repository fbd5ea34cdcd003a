//! Scheduled deploy windows on the real Tekton controller (issue 48), on both kinds. A deny
//! window opened while a run holds the key: the holder keeps it (a window never takes the key),
//! the lock says the window is closed (`status.closedByWindow`, `Ready` reason `WindowClosed`),
//! a PipelineRun arriving waits, saying which window and until when (reason `WindowClosed`),
//! still waits when the holder is done, and is granted once the window closes, at the time the
//! window said.

mod support;

use anyhow::{Result, ensure};
use jiff::tz::TimeZone;
use jiff::{RoundMode, SignedDuration, Timestamp, ToSpan, Unit, ZonedRound};
use k8s_openapi::api::events::v1::Event;
use serde_json::json;
use support::locks::{Kind, Lock};
use support::pipelines::*;
use support::*;

for_both_kinds! {
    a_deny_window_holds_a_run_until_it_closes => deny_window_case;
    an_operators_override_lets_runs_through_a_closed_window => override_case;
}

/// A deny window that opened this minute (UTC) and stays open two: it closes 60 to 120 s from
/// now (a window's shortest duration is one minute, so the end cannot be placed closer without
/// risking a close before the test has seen the run held back). The lock's spec, and when it
/// closes.
fn window_opened_now() -> Result<(serde_json::Value, Timestamp)> {
    let now = Timestamp::now().to_zoned(TimeZone::UTC);
    let opened = now.round(
        ZonedRound::new()
            .smallest(Unit::Minute)
            .mode(RoundMode::Trunc),
    )?;
    let closes = opened.checked_add(2.minutes())?.timestamp();
    let schedule = format!("{} {} * * *", opened.minute(), opened.hour());
    let window = json!({"name": "freeze", "kind": "deny", "schedule": schedule, "duration": "2m"});
    Ok((json!({"spec": {"windows": [window]}}), closes))
}

async fn deny_window_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("window").await?;
    let lock = Lock::new(kind, &ns).await?;
    let opts = lock.opts(Opts {
        lock_params: &[("supersede", "none")],
        ..Default::default()
    });
    ns.apply(&pipeline("deploy", &opts)).await?;
    ns.apply(&pipeline_run("h", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("h"), "Acquired", slow()).await?;

    let (patch, closes) = window_opened_now()?;
    let patch = patch.to_string();
    ns.kubectl(&["patch", &lock.kubectl_ref(), "--type=merge", "-p", &patch])?;
    let st = wait_until("the lock to say its window is closed", slow(), || async {
        let st = lock.status(&ns).await?;
        Ok(st.closed_by_window.is_some().then_some(st))
    })
    .await?;
    let closed = st.closed_by_window.clone().unwrap_or_default();
    ensure!(closed.starts_with("deny window freeze until "), "{closed}");
    ensure!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True" && c.reason == "WindowClosed"),
        "{:?}",
        st.conditions
    );
    ensure!(
        st.holders
            .iter()
            .any(|h| h.pipeline_run.as_deref() == Some(lock.name_of("h").as_str())),
        "the window took the key from its holder: {st:?}"
    );

    ns.apply(&pipeline_run("a", "deploy", &[])).await?;
    let waiting = wait_reason(&ns, &lock_run("a"), "WindowClosed", slow()).await?;
    let said = waiting.message.unwrap_or_default();
    ensure!(
        said.contains("deny window freeze until ") && said.contains("held by"),
        "{said}"
    );
    release(&ns, "h").await?;
    succeeded(&ns, "h").await?;
    let still = condition_of(&ns, &lock_run("a"))
        .await?
        .and_then(|c| c.reason);
    ensure!(
        Timestamp::now() < closes,
        "the window closed before the free key could be seen held back; the test proves nothing"
    );
    ensure!(still.as_deref() == Some("WindowClosed"), "a: {still:?}");

    wait_reason(&ns, &lock_run("a"), "Acquired", secs(240)).await?;
    let granted = Timestamp::now();
    // Granted once the window closed (the sync wakes at its end), not before.
    ensure!(
        granted >= closes && granted.duration_since(closes) < SignedDuration::from_secs(60),
        "granted at {granted}, the window closed at {closes}"
    );
    release(&ns, "a").await?;
    succeeded(&ns, "a").await
}

/// A deny window open for a month from every midnight: closed whenever the test runs.
fn always_closed_spec() -> serde_json::Value {
    let window =
        json!({"name": "freeze", "kind": "deny", "schedule": "@daily", "duration": "744h"});
    json!({"windows": [window]})
}

/// Waits for an Event with `reason` about the lock object (a ClusterMutex's are in `default`).
async fn lock_event(lock: &Lock, reason: &str) -> Result<Event> {
    let api: kube::Api<Event> = kube::Api::all(client().await?);
    let name = lock.kubectl_ref();
    let name = name
        .split_once('/')
        .map(|(_, n)| n.to_string())
        .unwrap_or(name);
    wait_until(&format!("a {reason} Event on the lock"), slow(), || {
        let (api, name) = (api.clone(), name.clone());
        async move {
            let events = api.list(&Default::default()).await?;
            Ok(events.items.into_iter().find(|e| {
                let about = e.regarding.as_ref();
                e.reason.as_deref() == Some(reason)
                    && about.and_then(|r| r.name.as_deref()) == Some(name.as_str())
                    && about
                        .and_then(|r| r.kind.as_deref())
                        .is_some_and(|k| k.ends_with("Mutex"))
            }))
        }
    })
    .await
}

/// An operator lets a key through its closed window with `tkn mutex override-window`: the
/// waiting run is granted, the lock says why (`Ready` reason `WindowOverridden`, an Event);
/// `--clear` closes it again for the next run. A schedule the API server can judge is refused
/// there, with the field named.
async fn override_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("window-override").await?;
    let lock = Lock::with_spec(kind, &ns, always_closed_spec()).await?;
    let opts = lock.opts(Opts {
        lock_params: &[("supersede", "none")],
        ..Default::default()
    });
    ns.apply(&pipeline("deploy", &opts)).await?;
    ns.apply(&pipeline_run("h", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("h"), "WindowClosed", slow()).await?;
    lock_event(&lock, "WindowClosed").await?;

    let key = lock.kubectl_ref();
    let key = key.split_once('/').map(|(_, n)| n).unwrap_or_default();
    // `tkn mutex ARGS -n NS`, with `--cluster` for a ClusterMutex.
    let tkn = |args: &[&str]| {
        let mut all = [args, &["-n", ns.name()]].concat();
        if kind == Kind::ClusterMutex {
            all.push("--cluster");
        }
        support::cli::tkn_mutex(&all)
    };
    let out = tkn(&[
        "override-window",
        key,
        "--for",
        "30m",
        "--reason",
        "hotfix INC-42",
    ])?
    .stdout()?;
    ensure!(out.contains("overridden until"), "{out}");
    wait_reason(&ns, &lock_run("h"), "Acquired", slow()).await?;
    let st = lock.status(&ns).await?;
    let said = st.window_override.clone().unwrap_or_default();
    ensure!(
        said.starts_with("deny window freeze until ") && said.ends_with(": hotfix INC-42"),
        "{st:?}"
    );
    let listed = tkn(&["list"])?.stdout()?;
    ensure!(
        listed.contains("open: deny window freeze until ") && listed.contains("hotfix INC-42"),
        "{listed}"
    );
    let event = lock_event(&lock, "WindowOverridden").await?;
    ensure!(
        event
            .note
            .as_deref()
            .is_some_and(|n| n.contains("hotfix INC-42")),
        "{event:?}"
    );

    let cleared = tkn(&["override-window", key, "--clear"])?;
    ensure!(cleared.ok(), "{cleared:?}");
    ns.apply(&pipeline_run("a", "deploy", &[])).await?;
    release(&ns, "h").await?;
    succeeded(&ns, "h").await?;
    wait_reason(&ns, &lock_run("a"), "WindowClosed", slow()).await?;

    refuses_a_bad_schedule(&ns, &lock)
}

/// What the API server can judge of a window, it refuses, naming the field.
fn refuses_a_bad_schedule(ns: &TestNamespace, lock: &Lock) -> Result<()> {
    let bad = json!({"spec": {"windows": [{"name": "w", "kind": "deny", "schedule": "0 18 * fri", "duration": "62h"}]}});
    let refused = ns.kubectl(&[
        "patch",
        &lock.kubectl_ref(),
        "--type=merge",
        "-p",
        &bad.to_string(),
    ]);
    let e = format!("{:?}", refused.err());
    ensure!(e.contains("schedule") && e.contains("should match"), "{e}");
    Ok(())
}
