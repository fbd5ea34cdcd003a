//! Per-object exponential backoff for failed reconciles: one object that keeps
//! failing (a denied write, a namespace being deleted) is retried ever more
//! rarely, up to a cap, so thousands of them cannot crowd out the other keys.
//! A success forgets the object's failures.
//!
//! The cap is also how long a key may sit after whatever failed its syncs is over: a write
//! refused for a while, an API server throttling or restarting fails every sync of a busy key,
//! and nothing tells the controller when that ends. At 5 minutes, the chaos campaign saw waiters
//! of an idle key wait 2 to 4 minutes behind a holder long gone (issue 49: seed 805772346 after
//! a watch expiry, seed 289357642 after a refusal, the retry 128 s and 256 s away).

use kube::Resource;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

const FIRST: Duration = Duration::from_millis(500);
const CAP: Duration = Duration::from_secs(30);
/// Objects remembered at most. A success forgets an object, but one deleted while failing is
/// never reconciled again: beyond this many, one is forgotten (it retries sooner, once).
const LIMIT: usize = 10_000;

#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// The delay before retrying `object` after one more failure: 0.5 s, 1 s,
    /// 2 s, ... up to 30 s (a watch's own backoff goes as far).
    pub fn failed(&self, object: String) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= LIMIT && !failures.contains_key(&object) {
            let any = failures.keys().next().cloned();
            any.map(|k| failures.remove(&k));
        }
        let n = failures.entry(object).or_default();
        let delay = FIRST.saturating_mul(2u32.saturating_pow(*n)).min(CAP);
        *n = n.saturating_add(1);
        delay
    }

    pub fn succeeded(&self, object: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(object);
    }
}

/// Which object a failure counts against: kind, namespace and name.
pub fn backoff_key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_per_object_up_to_the_cap_and_resets_on_success() {
        let b = Backoff::default();
        let delays: Vec<_> = (0..4).map(|_| b.failed("a".into())).collect();
        assert_eq!(delays, [0.5, 1.0, 2.0, 4.0].map(Duration::from_secs_f64));
        assert_eq!(b.failed("b".into()), FIRST, "another object starts afresh");
        for _ in 0..100 {
            b.failed("a".into());
        }
        assert_eq!(b.failed("a".into()), CAP);
        b.succeeded("a");
        assert_eq!(b.failed("a".into()), FIRST);
    }

    /// A key whose syncs failed all through a long outage (every one refused, say) is retried
    /// within 30 s of its end: its waiters wait no longer than that for a holder long gone.
    #[test]
    fn a_key_that_failed_through_an_outage_is_retried_soon_after() {
        let b = Backoff::default();
        let outage: Duration = (0..12).map(|_| b.failed("Mutex/ns/k2".into())).sum();
        assert!(outage > Duration::from_secs(120), "{outage:?}");
        assert!(b.failed("Mutex/ns/k2".into()) <= Duration::from_secs(30));
    }

    #[test]
    fn objects_that_never_succeed_again_are_bounded() {
        let b = Backoff::default();
        for i in 0..LIMIT + 100 {
            b.failed(format!("deleted-{i}"));
        }
        assert_eq!(b.failures.lock().unwrap().len(), LIMIT);
        assert_eq!(b.failed("deleted-last".into()), FIRST);
        assert_eq!(
            b.failed("deleted-last".into()),
            FIRST * 2,
            "the newest is kept"
        );
    }
}
