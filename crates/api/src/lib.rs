//! The objects: the Mutex and ClusterMutex custom resources, and the Tekton
//! kinds the controller reads. Types and their own small rules only; nothing
//! here imports the core or the controller.

pub mod cluster_mutex;
pub mod lock_kind;
pub mod mutex;
pub mod null_fields;
pub mod requests;
pub mod selector;
pub mod tekton;
pub mod window;
