//! A model checker of the lock protocol (issue 25) over the real decision core:
//! an API server, two controller replicas with lagging caches that crash
//! between writes, Tekton, pods and users. See docs/model-counterexample.md.

pub mod action;
pub mod adapter;
pub mod canon;
pub mod check;
pub mod config;
pub mod controller;
pub mod env;
pub mod exec;
pub mod model;
pub mod plan;
pub mod props;
pub mod tekton;
pub mod trace;
pub mod view;
pub mod world;
