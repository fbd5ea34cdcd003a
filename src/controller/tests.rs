//! The controller's test harnesses, built for tests only and kept out of the product's modules:
//! `mocked_api` pins the reconcilers' control flow against a mocked API server (as kube-rs's
//! controller-rs does); `sieve` is the Sieve-style fault suite over the real reconcilers.

mod mocked_api;
mod sieve;
