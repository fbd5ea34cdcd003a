//! Grants the API server refused to deliver for good (issue 49 item 2). A grant is written in
//! the lock's status first, then told to its run; when that tell is refused for a reason no
//! retry cures (an admission policy, a size limit, an invalid object), the run would hold the
//! key without ever learning it. Such refusals are noted here, by the run's uid, and the next
//! sync of the lock takes the slot back (`decide`'s `revoke_undelivered`). In memory only: after
//! a restart the run waits again, is granted again, and is refused again, at the cost of a grant.

use std::collections::{BTreeMap, HashMap};

#[derive(Default)]
pub struct Undelivered(std::sync::Mutex<HashMap<String, String>>);

impl Undelivered {
    /// Notes that `uid`'s grant was refused with `error`, if no retry can cure it.
    pub fn note(&self, uid: &str, error: &kube::Error) {
        if let Some(why) = incurable(error) {
            self.lock().insert(uid.to_string(), why);
        }
    }

    /// The refusals that stand for the live members `live` (by uid); a refusal of a run that
    /// is no longer live among `members` is forgotten.
    pub fn of<'a>(
        &self,
        members: impl Iterator<Item = (&'a str, bool)>,
    ) -> BTreeMap<String, String> {
        let mut noted = self.lock();
        if noted.is_empty() {
            return BTreeMap::new();
        }
        let mut standing = BTreeMap::new();
        for (uid, live) in members {
            match (noted.get(uid), live) {
                (Some(why), true) => {
                    standing.insert(uid.to_string(), why.clone());
                }
                (Some(_), false) => {
                    noted.remove(uid);
                }
                (None, _) => {}
            }
        }
        standing
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The API's word for a refusal that retrying cannot cure: 400 (bad request), 403 (an
/// admission policy or webhook, RBAC), 413 (too large), 422 (invalid). A conflict, a
/// throttle, a vanished object or a transport failure is retried instead.
fn incurable(error: &kube::Error) -> Option<String> {
    let kube::Error::Api(e) = error else {
        return None;
    };
    matches!(e.code, 400 | 403 | 413 | 422).then(|| format!("{} ({})", e.message, e.code))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure(&format!("refused {code}"), "Refused").with_code(code),
        ))
    }

    #[test]
    fn only_a_refusal_no_retry_cures_is_noted_and_it_lasts_while_the_run_lives() {
        let u = Undelivered::default();
        for code in [409, 429, 404, 500] {
            u.note("a", &api(code));
        }
        assert!(u.of([("a", true)].into_iter()).is_empty());
        u.note("a", &api(403));
        let standing = u.of([("a", true), ("b", true)].into_iter());
        assert_eq!(standing.keys().collect::<Vec<_>>(), ["a"]);
        assert!(standing["a"].contains("refused 403"), "{standing:?}");
        assert!(u.of([("a", false)].into_iter()).is_empty());
        assert!(
            u.of([("a", true)].into_iter()).is_empty(),
            "forgotten once it ended"
        );
    }
}
