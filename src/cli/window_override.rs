//! `tkn mutex override-window KEY --for 2h --reason TEXT` and `--clear`: the lock spec's
//! `windowOverride` (GitOps can set it too), as Argo CD's manual sync inside a window. Until it
//! ends, a closed window grants as an open one; the controller says so in the lock's `Ready`
//! condition (reason `WindowOverridden`) and in an Event, and it ends by itself.

use super::target::{Failure, Result, Target};
use crate::core::duration::parse_go_duration;
use crate::core::window::MAX_DURATION;
use clap::Args;
use jiff::{SignedDuration, Timestamp};
use serde_json::json;

#[derive(Args)]
pub struct OverrideArgs {
    /// The key (the Mutex's name, or with --cluster the ClusterMutex's).
    key: String,
    /// How long from now: a Go duration (`30m`, `2h`), at most 31 days.
    #[arg(
        long = "for",
        value_name = "DURATION",
        required_unless_present = "clear"
    )]
    lasts: Option<String>,
    /// Why: shown in the lock's status, its Ready condition and its Event.
    #[arg(long, required_unless_present = "clear")]
    reason: Option<String>,
    /// End the override now: the windows hold again.
    #[arg(long, conflicts_with_all = ["lasts", "reason"])]
    clear: bool,
}

/// What the arguments alone can tell is wrong, before any connection.
pub fn check(a: &OverrideArgs) -> Result<()> {
    until(a, Timestamp::UNIX_EPOCH).map(|_| ())
}

/// When the override ends, from `now` (None: --clear).
fn until(a: &OverrideArgs, now: Timestamp) -> Result<Option<Timestamp>> {
    let Some(lasts) = &a.lasts else {
        return Ok(None);
    };
    let bad = |why: String| Failure(format!("--for {lasts:?}: {why}"));
    let d = parse_go_duration(lasts).map_err(bad)?;
    let d = SignedDuration::try_from(d).map_err(|e| bad(e.to_string()))?;
    if d <= SignedDuration::ZERO || d > MAX_DURATION {
        return Err(bad("from 1s to 744h (31 days)".into()));
    }
    now.checked_add(d).map(Some).map_err(|e| bad(e.to_string()))
}

pub async fn run(target: &Target, a: OverrideArgs) -> Result<()> {
    target.lock(&a.key).await?;
    let lock = target.describe_lock(&a.key);
    let Some(until) = until(&a, Timestamp::now())? else {
        let patch = json!({"spec": {"windowOverride": null}});
        target
            .patch_lock(&a.key, &patch, "end the window override")
            .await?;
        println!("{lock}: no window override; its windows hold again");
        return Ok(());
    };
    let until = until.round(jiff::Unit::Second).unwrap_or(until).to_string();
    let patch = json!({"spec": {"windowOverride": {"until": until, "reason": a.reason}}});
    target
        .patch_lock(&a.key, &patch, "override its windows")
        .await?;
    println!(
        "{lock}: its windows are overridden until {until}: a closed window grants as an open one"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(lasts: Option<&str>) -> OverrideArgs {
        OverrideArgs {
            key: "prod".into(),
            lasts: lasts.map(String::from),
            reason: Some("hotfix".into()),
            clear: lasts.is_none(),
        }
    }

    #[test]
    fn the_override_ends_when_asked_and_never_unbounded() {
        let now: Timestamp = "2026-12-07T10:00:00Z".parse().unwrap();
        let ends = until(&args(Some("2h")), now).unwrap();
        assert_eq!(ends, Some("2026-12-07T12:00:00Z".parse().unwrap()));
        assert_eq!(until(&args(None), now).unwrap(), None);
        for bad in ["0s", "800h", "soon", "-1h"] {
            let e = until(&args(Some(bad)), now).unwrap_err();
            assert!(e.0.contains(&format!("--for {bad:?}")), "{}", e.0);
        }
    }
}
