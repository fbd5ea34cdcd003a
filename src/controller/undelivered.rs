//! Grants the API server refused to deliver for good (issue 49 item 2). A grant is written in
//! the lock's status first, then told to its run; when that tell is refused for a reason no
//! retry cures (an admission policy, a size limit, an invalid object), the run would hold the
//! key without ever learning it. Such refusals are noted here, by the run's uid, and the next
//! sync of the lock takes the slot back (`decide`'s `revoke_undelivered`); so are tells that keep
//! failing for errors a retry could cure, once they have failed for [`GIVE_UP_AFTER`]. In memory
//! only: after a restart the run waits again, is granted again, and is refused again, at the cost
//! of a grant.

use jiff::{SignedDuration, Timestamp};
use std::collections::{BTreeMap, HashMap};

/// How long a grant's tell may keep failing with errors a retry could cure (a throttle, an API
/// server that errs or is unreachable, conflicts) before the grant is taken back anyway: the run
/// would hold the key without knowing it, and every waiter behind it would wait.
pub const GIVE_UP_AFTER: SignedDuration = SignedDuration::from_mins(5);

#[derive(Default)]
pub struct Undelivered(std::sync::Mutex<HashMap<String, Noted>>);

enum Noted {
    /// For good: the grant is taken back, for this reason.
    Refused(String),
    /// Failing since then.
    Failing(Timestamp),
}

impl Undelivered {
    /// Notes that `uid`'s grant could not be told, with `error`, at `now`: for good if no retry
    /// can cure it, or once it has failed for [`GIVE_UP_AFTER`].
    pub fn note(&self, uid: &str, error: &kube::Error, now: Timestamp) {
        let mut noted = self.lock();
        let refused = match (incurable(error), noted.get(uid)) {
            (Some(why), _) => why,
            (None, Some(Noted::Refused(_))) => return,
            (None, Some(Noted::Failing(since))) if now.duration_since(*since) >= GIVE_UP_AFTER => {
                format!(
                    "no write reached it for {} minutes; the last error: {error}",
                    GIVE_UP_AFTER.as_mins()
                )
            }
            (None, Some(Noted::Failing(_))) => return,
            (None, None) => {
                noted.insert(uid.to_string(), Noted::Failing(now));
                return;
            }
        };
        noted.insert(uid.to_string(), Noted::Refused(refused));
    }

    /// `uid`'s grant was told: any failing before is over.
    pub fn delivered(&self, uid: &str) {
        let mut noted = self.lock();
        if matches!(noted.get(uid), Some(Noted::Failing(..))) {
            noted.remove(uid);
        }
    }

    /// The refusals that stand for the live members `live` (by uid); a note of a run that is
    /// no longer live among `members` is forgotten.
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
                (Some(Noted::Refused(why)), true) => {
                    standing.insert(uid.to_string(), why.clone());
                }
                (Some(_), false) => {
                    noted.remove(uid);
                }
                _ => {}
            }
        }
        standing
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Noted>> {
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
        let t0 = Timestamp::UNIX_EPOCH;
        for code in [409, 429, 404, 500] {
            u.note("a", &api(code), t0);
        }
        assert!(u.of([("a", true)].into_iter()).is_empty());
        u.note("a", &api(403), t0);
        let standing = u.of([("a", true), ("b", true)].into_iter());
        assert_eq!(standing.keys().collect::<Vec<_>>(), ["a"]);
        assert!(standing["a"].contains("refused 403"), "{standing:?}");
        assert!(u.of([("a", false)].into_iter()).is_empty());
        assert!(
            u.of([("a", true)].into_iter()).is_empty(),
            "forgotten once it ended"
        );
    }

    /// Errors a retry could cure take a grant back only once they have lasted
    /// [`GIVE_UP_AFTER`]; a tell that gets through in between starts the clock again.
    #[test]
    fn a_grant_that_keeps_failing_is_taken_back_after_a_bounded_time() {
        let u = Undelivered::default();
        let t0 = Timestamp::UNIX_EPOCH;
        let at = |mins: i64| t0 + SignedDuration::from_mins(mins);
        u.note("a", &api(500), at(0));
        u.note("a", &api(429), at(4));
        assert!(u.of([("a", true)].into_iter()).is_empty(), "not yet");
        u.delivered("a");
        u.note("a", &api(500), at(5));
        assert!(
            u.of([("a", true)].into_iter()).is_empty(),
            "the clock started again"
        );
        u.note("a", &api(503), at(10));
        let standing = u.of([("a", true)].into_iter());
        assert!(
            standing["a"].contains("5 minutes") && standing["a"].contains("refused 503"),
            "{standing:?}"
        );
    }
}
