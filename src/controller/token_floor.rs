//! Tokens continue across a Mutex's deletion. The finalizer keeps a Mutex in use, but once it is
//! empty it goes, and the runs that showed its last tokens may be gone too (deleted with their
//! PipelineRuns). Then a new Mutex rebuilt from the runs alone would hand out token 1 again, and a
//! deploy fenced by tokens would see a token it has seen before. So the replica that lets a Mutex
//! go remembers its `lastToken`, and the key's next Mutex continues above it. (A controller
//! restarted in between has forgotten it; then the runs' tokens are all there is.)

use std::collections::HashMap;
use std::sync::Mutex;

/// The `lastToken` of each Mutex this replica let go, by namespace and key.
#[derive(Debug, Default)]
pub struct TokenFloors(Mutex<HashMap<(String, String), i64>>);

impl TokenFloors {
    /// A Mutex of this key went with this `lastToken`.
    pub fn remember(&self, ns: &str, key: &str, last_token: i64) {
        let mut floors = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let floor = floors.entry((ns.into(), key.into())).or_default();
        *floor = (*floor).max(last_token);
    }

    /// The token the key's Mutex must not go below, given the `lastToken` it has now. Forgotten
    /// once the Mutex has caught up: the API server keeps `lastToken` from going down.
    pub fn floor(&self, ns: &str, key: &str, last_token: i64) -> i64 {
        let mut floors = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let id = (ns.to_string(), key.to_string());
        match floors.get(&id).copied() {
            Some(floor) if floor > last_token => floor,
            Some(_) => {
                floors.remove(&id);
                0
            }
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_holds_until_the_new_mutex_is_past_it() {
        let floors = TokenFloors::default();
        assert_eq!(floors.floor("ns", "k", 0), 0);
        floors.remember("ns", "k", 7);
        floors.remember("ns", "k", 5);
        assert_eq!(floors.floor("ns", "other", 0), 0);
        assert_eq!(floors.floor("other", "k", 0), 0);
        assert_eq!(floors.floor("ns", "k", 0), 7);
        assert_eq!(floors.floor("ns", "k", 7), 0, "caught up: forgotten");
        assert_eq!(floors.floor("ns", "k", 0), 0);
    }
}
