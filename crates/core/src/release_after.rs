//! `release-after`: hold the slot around a section of the PipelineRun, not the
//! whole of it. The param lists pipeline tasks of the run's own PipelineRun;
//! the slot goes free once each of them is done (succeeded, failed or skipped)
//! and no pod of theirs still runs. The rest of the PipelineRun runs without
//! the lock. The PipelineRun ending first releases too, as without the param.
//!
//! Pure: parsing, checking the names against the resolved pipeline, and which
//! children the controller must still look at. The controller
//! (src/controller/section.rs) reads those children and their pods.

use crate::model::ParentState;
use tekton_mutex_api::tekton::pipelinerun::{ChildReference, PipelineRun};

/// The param's name.
pub const PARAM: &str = "release-after";

/// The task names, comma-separated, each a pipeline task name (a DNS label).
pub fn parse(value: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Vec::new();
    for name in value.split(',').map(str::trim) {
        let valid = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid {
            return Err(format!(
                "param {PARAM:?} must list pipeline task names, comma-separated (such as \"deploy\" or \"deploy,migrate\"), got {value:?}"
            ));
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    Ok(names)
}

/// May a run use these `release-after` names with this PipelineRun? (Not a request's `Verdict`.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamesCheck {
    Fine,
    /// The PipelineRun has not recorded its resolved pipeline yet.
    NotYet,
    /// The message for an `InvalidParams` failure.
    Invalid(String),
}

/// A standalone run has no tasks to wait for, a name must be a task (or a
/// finally task) of the pipeline, and the lock's own task would release at once.
pub fn check(names: &[String], own_task: Option<&str>, parent: Option<&PipelineRun>) -> NamesCheck {
    if names.is_empty() {
        return NamesCheck::Fine;
    }
    let Some(pr) = parent else {
        return NamesCheck::Invalid(format!(
            "param {PARAM:?} names tasks of the run's PipelineRun, but this run has none: drop the param"
        ));
    };
    let Some(spec) = pr.status.as_ref().and_then(|s| s.pipeline_spec.as_ref()) else {
        return NamesCheck::NotYet;
    };
    let known: Vec<&str> = spec
        .tasks
        .iter()
        .chain(&spec.finally)
        .map(|t| t.name.as_str())
        .collect();
    if let Some(own) = own_task.filter(|own| names.iter().any(|n| n == own)) {
        return NamesCheck::Invalid(format!(
            "param {PARAM:?} names {own:?}, the lock task itself: name the tasks the lock protects"
        ));
    }
    let unknown: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| !known.contains(n))
        .collect();
    if unknown.is_empty() {
        return NamesCheck::Fine;
    }
    NamesCheck::Invalid(format!(
        "param {PARAM:?} names {} not in the pipeline: its tasks are {}",
        unknown.join(", "),
        known.join(", ")
    ))
}

/// What is left to look at before the section is over: `None` while a named
/// task has neither run nor been skipped; else the children (TaskRuns,
/// CustomRuns) of the named tasks, each of which must be done.
pub fn children<'a>(pr: &'a PipelineRun, names: &[String]) -> Option<Vec<&'a ChildReference>> {
    let status = pr.status.as_ref()?;
    let mut found = Vec::new();
    for name in names {
        let skipped = status.skipped_tasks.iter().any(|t| t.name == *name);
        let of_task: Vec<&ChildReference> = status
            .child_references
            .iter()
            .filter(|c| c.pipeline_task_name == *name)
            .collect();
        if of_task.is_empty() && !skipped {
            return None;
        }
        found.extend(of_task);
    }
    Some(found)
}

/// A running PipelineRun whose section is over holds nothing more.
pub fn state(parent: ParentState, section_done: bool) -> ParentState {
    match parent {
        ParentState::Running | ParentState::StopRequested if section_done => {
            ParentState::SectionDone
        }
        other => other,
    }
}

#[cfg(test)]
mod tests;
