//! The cancel of a run's PipelineRun, as a decision asks for it: beside the outcome a run is
//! told (superseded, deadlocked) or on its own (a holder asked to stop).

use crate::model::{Cancel, ParentState, Phase, RunView};

/// The cancel of a run's PipelineRun that goes beside the outcome it is told. A PipelineRun
/// queued as a whole is told by the patch that cancels it, with its record and
/// `cancel-reason` (issue 37 item 13): a separate cancel landing first would change it
/// under that patch, which then never lands.
pub(super) fn cancel_beside_outcome(r: &RunView, by: &str) -> Option<Cancel> {
    if r.run.kind == tekton_mutex_api::mutex::RunKind::PipelineRun {
        return None;
    }
    cancel_of(r, by)
}

/// Cancel this run's PipelineRun, unless it is already stopping or over.
pub(super) fn cancel_of(r: &RunView, by: &str) -> Option<Cancel> {
    if r.phase == Phase::Unlisted {
        return None; // never cancel a PipelineRun on behalf of a run it does not list
    }
    let p = r
        .parent
        .as_ref()
        .filter(|p| p.state == ParentState::Running)?;
    Some(Cancel {
        pipeline_run: p.name.clone(),
        pipeline_run_uid: p.uid.clone(),
        mode: r.cancel_mode,
        superseded_by: by.to_string(),
        group: r.group.clone(),
    })
}
