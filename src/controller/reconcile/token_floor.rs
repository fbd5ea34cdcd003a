//! Tokens continue across a Mutex's deletion. The finalizer keeps a Mutex in use, but once it is
//! empty it goes, and the runs that showed its last tokens may be gone too (deleted with their
//! PipelineRuns). Then a new Mutex rebuilt from the runs alone would hand out token 1 again, and a
//! deploy fenced by tokens would see a token it has seen before. So the replica that lets a Mutex
//! go remembers its `lastToken`, and the key's next Mutex continues above it. (A controller
//! restarted in between has forgotten it; then the runs' tokens are all there is.)

use std::collections::HashMap;
use std::sync::Mutex;

/// The `lastToken` of the Mutexes this replica let go, by namespace and key, with the uid of the
/// last one that went.
#[derive(Debug, Default)]
pub struct TokenFloors(Mutex<HashMap<(String, String), (String, i64)>>);

impl TokenFloors {
    /// A Mutex of this key (uid `gone`) went with this `lastToken`.
    pub fn remember(&self, ns: &str, key: &str, gone: &str, last_token: i64) {
        let mut floors = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let floor = floors.entry((ns.into(), key.into())).or_default();
        *floor = (gone.to_string(), floor.1.max(last_token));
    }

    /// The token the key's Mutex (uid `uid`) must not go below, given the `lastToken` it has now.
    /// Forgotten once a new Mutex has caught up: the API server keeps `lastToken` from going
    /// down. The Mutex that went, still seen in a cache or read late, is not a new one: it must
    /// not make the floor forgotten before its successor has passed it.
    pub fn floor(&self, ns: &str, key: &str, uid: Option<&str>, last_token: i64) -> i64 {
        let mut floors = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let id = (ns.to_string(), key.to_string());
        match floors.get(&id) {
            Some((gone, floor)) if Some(gone.as_str()) == uid => *floor,
            Some((_, floor)) if *floor > last_token => *floor,
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

    const NEW: Option<&str> = Some("uid-new");

    #[test]
    fn a_floor_holds_until_the_new_mutex_is_past_it() {
        let floors = TokenFloors::default();
        assert_eq!(floors.floor("ns", "k", NEW, 0), 0);
        floors.remember("ns", "k", "uid-a", 7);
        floors.remember("ns", "k", "uid-b", 5);
        assert_eq!(floors.floor("ns", "other", NEW, 0), 0);
        assert_eq!(floors.floor("other", "k", NEW, 0), 0);
        assert_eq!(floors.floor("ns", "k", NEW, 0), 7);
        assert_eq!(floors.floor("ns", "k", NEW, 7), 0, "caught up: forgotten");
        assert_eq!(floors.floor("ns", "k", NEW, 0), 0);
    }

    /// The fencing violation of chaos seed 303: a sync of the Mutex that had just gone (still
    /// in the cache, `lastToken` 1) made the floor forgotten, and its successor granted token 1
    /// again.
    #[test]
    fn the_mutex_that_went_does_not_make_the_floor_forgotten() {
        let floors = TokenFloors::default();
        floors.remember("ns", "k", "uid-old", 1);
        assert_eq!(floors.floor("ns", "k", Some("uid-old"), 1), 1);
        assert_eq!(
            floors.floor("ns", "k", NEW, 0),
            1,
            "the new Mutex continues above it"
        );
        assert_eq!(floors.floor("ns", "k", NEW, 2), 0);
    }
}
