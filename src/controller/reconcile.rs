//! The reconcilers: intake of each run, and the one lock engine ([`lock`]) that
//! syncs every Mutex and ClusterMutex through `LockObject` (see lock_kinds).

pub mod cluster_admission;
pub mod deadlocks;
pub mod finalizer;
pub mod idle_deletion;
pub mod intake;
pub mod lock;
pub mod lock_kinds;
pub mod members;
pub mod pipeline_runs;
pub mod queued_intake;
pub mod release_after_progress;
pub mod selection;
pub mod token_floor;
pub mod windows;
