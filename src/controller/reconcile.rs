//! The reconcilers: intake of each run, and the sync of each lock.

pub mod cluster_feeds;
pub mod cluster_lock;
pub mod finalizer;
pub mod intake;
pub mod lock;
pub mod pipeline_runs;
pub mod release_after_progress;
pub mod token_floor;
