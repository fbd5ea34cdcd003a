//! tekton-mutex: a Tekton custom task that lets a pipeline say "one at a time here".
#![forbid(unsafe_code)]

pub mod decide;
pub mod duration;
pub mod mutex;
pub mod params;
pub mod tekton;
