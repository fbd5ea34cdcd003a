//! What Tekton does to a PipelineRun in the model, whoever asked: a cancel passed on to its lock
//! runs, and the end of a PipelineRun whose lock run ended without a grant.

use crate::config::Config;
use crate::world::{Api, Pod, PrPhase};

/// cancel_pipeline_run: PipelineRun p, if it still runs or waits Pending, is asked to stop, and
/// Tekton passes the cancel on to each of its lock runs that has not finished.
pub fn cancel_pr(cfg: &Config, api: &mut Api, p: usize) {
    if !matches!(api.prs[p].phase, PrPhase::Running | PrPhase::Pending) {
        return;
    }
    api.prs[p].phase = PrPhase::Stopping;
    // spec.status is a stop now: whoever started it, it is no longer "started" for the lock.
    api.prs[p].started_by_tenant = false;
    for i in cfg.runs_of_pr(p) {
        let r = &mut api.runs[i];
        if r.live() && !r.done() && !r.cancel {
            r.cancel = true;
            r.bump();
        }
    }
}

/// Tekton fails a running PipelineRun whose lock run i ended without a grant or
/// was deleted while waiting; a pending one told an end is cancelled in the same
/// patch and ends unstarted (at once: the states in between change nothing). A
/// queued one its tenant started (`StartedWithoutGrant`) runs: that cancel stops it.
pub fn fail(cfg: &Config, api: &mut Api, i: usize) {
    let p = cfg.pr_of(i);
    let pr = &mut api.prs[p];
    let unstarted = matches!(pr.phase, PrPhase::Running | PrPhase::Pending);
    if unstarted && pr.pod == Pod::None {
        pr.phase = PrPhase::Done;
    } else if cfg.runs[i].pending {
        cancel_pr(cfg, api, p);
    }
}
