//! The run statuses this controller has just written, until its cache shows them.
//!
//! A sync woken before the cache has our own last patch of a run would patch it
//! again from the old version: a write the API server refuses (409, the patch is
//! a compare-and-swap) and that costs as much as one it accepts. The patch's own
//! watch event wakes the key again once the cache has it.

use std::collections::HashMap;
use std::sync::Mutex;

/// Beyond this many runs patched and not yet seen back, the memo starts over
/// (it only saves writes; forgetting costs at most one refused patch each).
const LIMIT: usize = 10_000;

#[derive(Default)]
pub struct Told {
    /// Run uid -> the resourceVersion our last patch of it was made against.
    patched_from: Mutex<HashMap<String, String>>,
}

impl Told {
    /// Was the run patched from exactly this version (so the cache has not caught up)?
    pub fn pending(&self, uid: &str, resource_version: Option<&str>) -> bool {
        let mut m = self.patched_from.lock().unwrap_or_else(|e| e.into_inner());
        match (m.get(uid), resource_version) {
            (Some(from), Some(rv)) if from == rv => true,
            (Some(_), _) => {
                m.remove(uid);
                false
            }
            _ => false,
        }
    }

    pub fn patched(&self, uid: &str, from: Option<&str>) {
        let Some(rv) = from else { return };
        let mut m = self.patched_from.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= LIMIT {
            m.clear();
        }
        m.insert(uid.to_string(), rv.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_is_pending_until_the_cache_shows_another_version() {
        let t = Told::default();
        assert!(!t.pending("u", Some("5")));
        t.patched("u", Some("5"));
        assert!(
            t.pending("u", Some("5")),
            "the cache still shows the old version"
        );
        assert!(!t.pending("u", Some("6")), "the cache has caught up");
        assert!(!t.pending("u", Some("5")), "forgotten once caught up");
    }
}
