//! The pure decision core: no I/O, no clock, no client. Params and
//! annotations are read into a run's config (`params`), objects are observed
//! (`observe`) and viewed as the facts a decision needs (`view`), and
//! `decide` turns those facts into the lock's next state and what to tell each
//! run. `run_status` says how a decision is written on a run.

pub mod deadlock;
pub mod decide;
pub mod duration;
pub mod key_name;
pub mod model;
pub mod observe;
pub mod params;
pub mod ready;
pub mod release_after;
pub mod requests;
pub mod run_status;
pub mod scope;
pub mod selection;
pub mod view;
pub mod window;
