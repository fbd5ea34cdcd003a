//! The model checks (issue 25): no counterexample with the real guards, and one
//! for each guard removed in the model's I/O layer, each on a configuration
//! the real guards pass. The full bounds (hack/verify.sh, release build) are
//! too slow for a debug test build: these use one or two kinds of fault per
//! check; VERIFY_FULL=1 runs them at the full bounds instead.

use verify::check::{self, Report};
use verify::config::{Broken, Config, Users};
use verify::props;

const THREADS: usize = 2;

/// `cfg` with at most these budgets (disturbing user acts, crashes, syncs on a
/// lagging cache, lease lapses), unless VERIFY_FULL is set.
fn bounded(mut cfg: Config, disrupt: u8, crashes: u8, lags: u8, lapses: u8) -> Config {
    if std::env::var_os("VERIFY_FULL").is_none() {
        cfg.disrupt = cfg.disrupt.min(disrupt);
        cfg.crashes = cfg.crashes.min(crashes);
        cfg.lags = cfg.lags.min(lags);
        cfg.lapses = cfg.lapses.min(lapses);
    }
    cfg
}

fn show(r: &Report) {
    println!("{}", r.line());
    for (_, t) in &r.violations {
        println!("{t}");
    }
}

fn holds(cfg: Config) {
    let r = check::run(cfg, THREADS, false);
    show(&r);
    assert!(r.violations.is_empty(), "{}", r.line());
    assert!(
        r.states > 1000,
        "the model explores more than a handful of states"
    );
}

/// The checker (breadth-first, stopping at the first broken property) finds a
/// counterexample to one of `expected`.
fn breaks(cfg: Config, expected: &[&str]) -> String {
    let r = check::run(cfg, THREADS, true);
    show(&r);
    let found = r.violations.iter().find(|v| expected.contains(&v.0));
    let (_, trace) =
        found.unwrap_or_else(|| panic!("no counterexample to {expected:?}: {}", r.line()));
    assert!(trace.contains("broken:"), "the trace says what broke");
    trace.clone()
}

// The guards removed, each on a configuration that passes with it.

fn users_only() -> Config {
    bounded(Config::a(), 1, 0, 0, 0)
}

fn lease_lapse_only() -> Config {
    bounded(Config::a(), 0, 0, 1, 1)
}

fn floor_only() -> Config {
    bounded(Config::a_floor(), 2, 0, 1, 0)
}

#[test]
fn a_users_hold_with_the_real_guards() {
    holds(users_only());
}

#[test]
fn a_lease_lapse_holds_with_the_real_guards() {
    holds(lease_lapse_only());
}

#[test]
fn a_crashes_and_lapses_hold_with_the_real_guards() {
    holds(bounded(Config::a(), 0, 1, 0, 1));
}

#[test]
fn a_floor_holds_with_the_real_guards() {
    holds(floor_only());
}

#[test]
fn b_holds_with_the_real_guards() {
    holds(bounded(Config::b(), 1, 0, 0, 0));
}

#[test]
fn without_the_status_cas_two_replicas_grant_at_once() {
    breaks(
        lease_lapse_only().with_broken(Broken::StatusCas),
        &[props::EXCLUSION, props::FENCING],
    );
}

#[test]
fn without_the_pod_check_a_slot_frees_while_a_pod_runs() {
    breaks(
        users_only().with_broken(Broken::PodCheck),
        &[props::EXCLUSION],
    );
}

#[test]
fn without_the_token_floor_a_token_is_reused() {
    breaks(
        floor_only().with_broken(Broken::TokenFloor),
        &[props::FENCING],
    );
}

// Bugs of the real code the model finds (see docs/model-counterexample.md).

/// Found by the model, fixed: a multi-key run committed on every key, whose
/// PipelineRun is cancelled and done while its pod is in its grace period. The
/// key that still keeps its slot as a reservation converts and judges it in one
/// sync; the pod check now covers reserved runs (members.rs's may_hold).
#[test]
fn b_cancel_reserved_holds_with_the_real_guards() {
    holds(Config::b_cancel_reserved());
}

/// Issue 23 item 5: the same with the multi-key lock run deleted. It may have
/// been told `Acquired` by another key's commit before it went, so a slot kept
/// for it becomes a hold of its PipelineRun (members.rs's deleted_holders, the
/// core's `fate`), released once nothing of the PipelineRun can run.
#[test]
fn b_delete_reserved_holds_with_the_real_guards() {
    holds(Config::b_delete_reserved());
}

/// Issue 23 item 6 (fixed): the token floor of a Mutex that went lived in the
/// memory of the replica that let it go, and after a failover the new Mutex
/// started over. It now lives in the token ledger in the API server.
#[test]
fn the_token_floor_survives_a_failover_with_the_ledger() {
    holds(Config {
        lags: 0,
        lapses: 0,
        liveness: false,
        ..Config::a_floor_failover()
    });
}

/// Issue 23 item 1: two lock runs of one PipelineRun share one hold, one of
/// them with `release-after` (a sibling the lagging cache hides is read live).
#[test]
fn a_release_after_sibling_holds_with_the_real_guards() {
    holds(Config::a_sibling());
}

#[test]
fn without_one_hold_per_pipeline_run_a_release_after_section_frees_the_slot() {
    breaks(
        Config::a_sibling().with_broken(Broken::OneHold),
        &[props::EXCLUSION],
    );
}

/// A status wipe while a deposed leader's `Acquired` write is in flight: the
/// new leader sees neither the hold (wiped) nor the run's token (not yet
/// written) and grants another run; the stale write then lands too.
#[test]
fn known_bug_a_status_wipe_races_a_deposed_leaders_grant() {
    breaks(
        Config::a_wipe_race(),
        &[props::EXCLUSION, props::FENCING, props::SUPERSEDE],
    );
}

/// A status wipe, then a sync whose cache of runs has not seen a multi-key
/// run's commit yet: neither the status nor the cached run shows the grant.
#[test]
fn known_bug_a_status_wipe_and_a_lagging_run_cache_lose_a_grant() {
    breaks(
        Config::b_wipe_stale_cache(),
        &[props::EXCLUSION, props::FENCING],
    );
}

/// Issue 26: PipelineRuns queued as a whole (created Pending) beside a lock-task
/// PipelineRun on one key, one supersede group, with every kind of user action.
#[test]
fn a_pending_pipeline_runs_hold_with_the_real_guards() {
    holds(bounded(Config::a_pending(), 1, 1, 0, 0));
}

#[test]
fn a_pending_pipeline_runs_hold_through_lags_and_lapses() {
    holds(bounded(Config::a_pending(), 0, 0, 1, 1));
}

/// A granted pending PipelineRun is a holder like any other: cancelled while its
/// pod runs, its slot must wait for the pod.
#[test]
fn without_the_pod_check_a_started_pending_pipeline_run_overlaps() {
    let trace = breaks(
        bounded(Config::a_pending(), 1, 0, 0, 0).with_broken(Broken::PodCheck),
        &[props::EXCLUSION],
    );
    assert!(
        trace.contains("Pending"),
        "a pending PipelineRun is in the trace:\n{trace}"
    );
}

/// Issue 37: a tenant writes a record claiming a grant with the largest token on its
/// own queued PipelineRun. Believed, it holds the key for good and ends its tokens.
#[test]
fn without_the_status_vouching_a_tenants_record_wedges_the_key() {
    breaks(
        bounded(Config::a_pending(), 1, 0, 0, 0).with_broken(Broken::TrustRecord),
        &[
            props::EXCLUSION,
            props::FENCING,
            props::SUPERSEDE,
            props::NO_LOST_WAITER,
        ],
    );
}

/// The limit of issue 37's rule: the lock's status is the one record of a queued
/// PipelineRun's grant, so a status wiped by hand while it holds forgets the hold.
#[test]
fn known_limit_a_status_wipe_forgets_a_queued_pipeline_runs_hold() {
    breaks(
        Config::a_pending_wipe(),
        &[props::EXCLUSION, props::FENCING],
    );
}

// Issue 46: a tenant limited by the admission policies alone (config/401, config/402).

/// The tenant of config A-tenant that may only start its own queued PipelineRuns.
fn tenant_starts_own() -> Config {
    let users = Users {
        start_own: true,
        ..Users::NONE
    };
    Config {
        users,
        disrupt: 1,
        ..Config::a_tenant()
    }
}

/// The tenant of config A-tenant that may only write its token ledger and delete the Mutex.
fn tenant_writes_the_ledger() -> Config {
    let users = Users {
        ledger: true,
        delete_mutex: true,
        ..Users::NONE
    };
    Config {
        users,
        ..Config::a_tenant()
    }
}

#[test]
fn a_tenant_holds_with_the_admission_policies() {
    holds(bounded(Config::a_tenant(), 2, 0, 0, 0));
}

#[test]
fn a_tenant_starting_its_own_run_holds_with_the_admission_policies() {
    holds(tenant_starts_own());
}

#[test]
fn a_tenant_raising_its_ledger_holds_with_the_admission_policies() {
    holds(tenant_writes_the_ledger());
}

/// Without policy 401 a tenant starts its queued PipelineRun while another holds the key:
/// the controller cancels it (`StartedWithoutGrant`), but it ran beside the holder first.
#[test]
fn without_admission_a_tenant_starts_its_queued_run_beside_the_holder() {
    let trace = breaks(
        tenant_starts_own().with_broken(Broken::NoAdmission),
        &[props::EXCLUSION],
    );
    assert!(
        trace.contains("clears spec.status"),
        "the tenant starts it:\n{trace}"
    );
}

/// Without policy 402 a tenant removes the key's ledger entry and deletes the idle Mutex:
/// the new Mutex starts from a floor of 0 and hands out a token again.
#[test]
fn without_admission_a_lowered_ledger_repeats_a_token() {
    let trace = breaks(
        tenant_writes_the_ledger().with_broken(Broken::NoAdmission),
        &[props::FENCING],
    );
    assert!(
        trace.contains("removes k0's entry"),
        "the tenant lowers the ledger:\n{trace}"
    );
}
