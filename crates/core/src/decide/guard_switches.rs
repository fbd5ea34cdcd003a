//! Guards of the decision core that a test may remove, so that the model checker
//! (verify/) shows it would catch their loss. Only in builds with the test-only
//! `guard-switches` feature, and only flipped in process: no setting reaches them.

use std::sync::atomic::{AtomicBool, Ordering};

static ONE_HOLD_OFF: AtomicBool = AtomicBool::new(false);

/// Off: each lock run's hold is judged alone, not with its PipelineRun's other lock runs
/// (the bug of issue 23 item 1).
pub fn set_one_hold_per_pipeline_run(on: bool) {
    ONE_HOLD_OFF.store(!on, Ordering::SeqCst);
}

pub(in crate::decide) fn one_hold_off() -> bool {
    ONE_HOLD_OFF.load(Ordering::Relaxed)
}

static RECORDS_TRUSTED: AtomicBool = AtomicBool::new(false);

/// On: a queued PipelineRun's record (an annotation its author can write) is believed as
/// written, not as the lock's status vouches for it (the bug of issue 37 items 1 to 4).
pub fn set_queued_records_trusted(on: bool) {
    RECORDS_TRUSTED.store(on, Ordering::SeqCst);
}

pub(in crate::decide) fn records_trusted() -> bool {
    RECORDS_TRUSTED.load(Ordering::Relaxed)
}
