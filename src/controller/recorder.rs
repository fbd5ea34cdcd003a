//! kube's Event recorder, renewed once its memory of Events has expired.
//!
//! kube's `Recorder` remembers every Event it sent for 6 minutes, so that a repeat becomes a
//! series on the first one. Its memory is a hash map that keeps the capacity of its busiest
//! moment: a burst of 10,000 keys leaves a table of tens of MiB (a whole Event inline per
//! bucket) for the life of the process, empty once the Events expire. A recorder renewed after
//! those 6 minutes drops the table with the Events: what is lost is that a repeat sent across
//! the renewal starts a new Event instead of counting on the old one. The renewal happens at the
//! next publish, or on a timer when none comes.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};
use std::sync::{Arc, Mutex};
use std::time::Duration;
// tokio's clock, so that a test can move it.
use tokio::time::Instant;

/// How long kube's recorder remembers an Event (its private `CACHE_TTL`).
const RENEW_EVERY: Duration = Duration::from_secs(6 * 60);

/// The longest Event note the API server takes, in bytes: it refuses a longer one (422), and
/// the Event is lost. A note can quote a person's words (a clear's reason, up to 1,024 bytes
/// itself) or an API server's message.
const NOTE_LIMIT: usize = 1024;

/// A note past [`NOTE_LIMIT`], cut on a character boundary and ending `...`; None if it fits.
fn bounded_note(note: &str) -> Option<String> {
    if note.len() <= NOTE_LIMIT {
        return None;
    }
    let cut = (0..=NOTE_LIMIT - 3)
        .rev()
        .find(|i| note.is_char_boundary(*i))
        .unwrap_or(0);
    Some(format!("{}...", &note[..cut]))
}

/// Sends Events as kube's `Recorder` does; cheap to clone (all clones share one recorder).
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    reporter: Reporter,
    current: Arc<Mutex<Current>>,
}

struct Current {
    recorder: Recorder,
    since: Instant,
    /// How many times the recorder was renewed (for the tests).
    renewals: u64,
}

impl EventRecorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        let recorder = Recorder::new(client.clone(), reporter.clone());
        let current = Current {
            recorder,
            since: Instant::now(),
            renewals: 0,
        };
        EventRecorder {
            client,
            reporter,
            current: Arc::new(Mutex::new(current)),
        }
    }

    /// Publish an Event on `reference` (kube's `Recorder::publish`), its note cut to what
    /// the API server takes.
    pub async fn publish(&self, ev: &Event, reference: &ObjectReference) -> kube::Result<()> {
        let recorder = self.recorder_at(Instant::now());
        match ev.note.as_deref().and_then(bounded_note) {
            Some(note) => {
                let bounded = Event {
                    type_: ev.type_,
                    reason: ev.reason.clone(),
                    note: Some(note),
                    action: ev.action.clone(),
                    secondary: ev.secondary.clone(),
                };
                recorder.publish(&bounded, reference).await
            }
            None => recorder.publish(ev, reference).await,
        }
    }

    /// Renews the recorder on a timer as well, so that a controller that goes quiet after a
    /// burst drops the burst's table without waiting for its next Event. Runs until dropped.
    pub async fn renew_while_quiet(self) {
        loop {
            // A period, not a synchronization: renewal is checked six times per lifetime.
            tokio::time::sleep(RENEW_EVERY / 6).await;
            self.recorder_at(Instant::now());
        }
    }

    /// The recorder to send with at `now`: a new one once the current one's Events expired.
    fn recorder_at(&self, now: Instant) -> Recorder {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if now.saturating_duration_since(current.since) >= RENEW_EVERY {
            current.recorder = Recorder::new(self.client.clone(), self.reporter.clone());
            current.since = now;
            current.renewals += 1;
        }
        current.recorder.clone()
    }

    #[cfg(test)]
    fn renewals(&self) -> u64 {
        self.current.lock().unwrap().renewals
    }

    /// A recorder over a mocked API that answers nothing (for the tests).
    #[cfg(test)]
    pub(crate) fn unconnected() -> Self {
        let (service, _handle) = tower_test::mock::pair::<
            ::http::Request<kube::client::Body>,
            ::http::Response<kube::client::Body>,
        >();
        let reporter = Reporter {
            controller: "t".into(),
            instance: None,
        };
        EventRecorder::new(Client::new(service, "ns"), reporter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37: a clear's reason at its bound (1,024 bytes) made every Event quoting it
    /// longer than the API server takes, and each was refused and lost.
    #[test]
    fn a_note_past_the_limit_is_cut_on_a_character_boundary() {
        assert_eq!(bounded_note(&"a".repeat(NOTE_LIMIT)), None, "at the limit");
        let long = format!("the queue was cleared by admin: {}", "é".repeat(NOTE_LIMIT));
        let cut = bounded_note(&long).unwrap();
        assert!(
            cut.len() <= NOTE_LIMIT && cut.len() >= NOTE_LIMIT - 4,
            "{}",
            cut.len()
        );
        assert!(cut.starts_with("the queue was cleared by admin: é") && cut.ends_with("é..."));
    }

    #[tokio::test]
    async fn the_recorder_is_renewed_once_its_events_expired_and_not_before() {
        let r = EventRecorder::unconnected();
        let t0 = r.current.lock().unwrap().since;
        r.recorder_at(t0 + RENEW_EVERY - Duration::from_secs(1));
        assert_eq!(r.renewals(), 0);
        r.recorder_at(t0 + RENEW_EVERY);
        assert_eq!(r.renewals(), 1);
        // The next period counts from the renewal.
        r.recorder_at(t0 + RENEW_EVERY + Duration::from_secs(60));
        assert_eq!(r.renewals(), 1);
        r.clone().recorder_at(t0 + RENEW_EVERY * 2);
        assert_eq!(r.renewals(), 2, "clones share one recorder");
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_recorder_is_renewed_on_its_timer() {
        let r = EventRecorder::unconnected();
        tokio::spawn(r.clone().renew_while_quiet());
        tokio::time::sleep(RENEW_EVERY - Duration::from_secs(1)).await;
        assert_eq!(r.renewals(), 0, "not before its Events expired");
        tokio::time::sleep(RENEW_EVERY / 6).await;
        assert_eq!(r.renewals(), 1, "renewed with no publish");
    }
}
