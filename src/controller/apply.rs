//! Every write to the API server, and the Events that report them.

pub mod acknowledge;
pub mod events;
pub mod lock_meta;
pub mod multi_key_commit;
pub mod writes;
