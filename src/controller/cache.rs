//! The shared caches: one watch per kind, read by every reconciler, indexed
//! by key, stripped to what the controller reads, tolerant of objects its
//! types cannot read, and the memos of writes not yet seen back.

pub mod index;
pub mod shared;
pub mod strip;
pub mod told;
pub mod tolerant;
pub mod triggers;
