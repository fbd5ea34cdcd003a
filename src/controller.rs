//! Wiring: two controllers over shared caches, optionally behind a leader Lease.
//!
//! - `intake` reconciles each Mutex run: it rejects bad input and makes sure
//!   the Mutex object for the run's key exists.
//! - `sync` reconciles each Mutex object (one per key): it reads the key's runs,
//!   asks the pure decision core what to do, and applies it. It is triggered by
//!   changes to the Mutex, to its runs, to their PipelineRuns and to those
//!   PipelineRuns' live pods, so a holder's end (its last pod gone) hands the
//!   slot over straight from the watch event.
//! - `leader` holds the Lease: every replica keeps its caches warm, only the
//!   holder's reconcilers act. Correctness never rests on it: every grant is
//!   a compare-and-swap on the Mutex status.

mod api_client;
mod apply;
mod backoff;
mod cache;
mod cluster_wiring;
mod context;
mod crd_wait;
mod leader;
mod ledger_batch;
mod lock_object;
mod queued_wiring;
mod reconcile;
mod recorder;
#[cfg(test)]
mod tests;
mod undelivered;
mod wake;
mod wiring;

pub use api_client::connect;
pub use context::{Error, Fault};
pub use leader::LeaderElection;
pub use reconcile::token_floor::CLUSTER_LEDGER_NAMESPACE;
pub use wiring::{Options, run};
