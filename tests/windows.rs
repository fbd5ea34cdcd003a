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
use serde_json::json;
use support::locks::{Kind, Lock};
use support::pipelines::*;
use support::*;

for_both_kinds! {
    a_deny_window_holds_a_run_until_it_closes => deny_window_case;
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
