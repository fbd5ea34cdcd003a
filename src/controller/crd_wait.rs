//! Waiting at start for the CRDs to be served. Applied in one `kubectl apply` with the
//! Deployment, or with Tekton installed just after, a CRD can come a little after the pod:
//! exiting at once would only crash-loop it until then, with a growing restart delay.

use super::context::Error;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;

const FIRST_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(30);

/// The pause after the `attempt`-th failed check (from 0): 1 s, 2 s, 4 s, ... up to 30 s.
pub fn delay(attempt: u32) -> Duration {
    FIRST_DELAY
        .saturating_mul(2u32.saturating_pow(attempt))
        .min(MAX_DELAY)
}

/// Runs `check` until it finds no CRD missing, for up to `bound` (zero: once).
/// Any other error ends the wait at once: only a missing CRD is worth waiting for.
pub async fn wait_for<T, F, Fut>(bound: Duration, mut check: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let start = Instant::now();
    let mut attempt = 0;
    loop {
        let (kind, fix) = match check().await {
            Err(Error::MissingCrd(kind, fix)) => (kind, fix),
            other => return other,
        };
        let waited = start.elapsed();
        if waited >= bound {
            let fix = match bound.is_zero() {
                true => fix,
                false => format!("{fix} (waited {} s for it)", waited.as_secs()),
            };
            return Err(Error::MissingCrd(kind, fix));
        }
        let pause = delay(attempt).min(bound - waited);
        attempt += 1;
        warn!(
            attempt,
            retry_in_seconds = pause.as_secs_f64(),
            "the {kind} CRD is not served yet; waiting up to {} s in all: {fix}",
            bound.as_secs()
        );
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn missing() -> Error {
        Error::MissingCrd("Mutex", "install it".into())
    }

    #[test]
    fn pauses_double_up_to_the_cap() {
        let pauses: Vec<u64> = (0..7).map(|a| delay(a).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(delay(u32::MAX), MAX_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_with_backoff_until_the_crd_is_served() {
        let start = Instant::now();
        let mut checks = 0;
        let served = wait_for(Duration::from_secs(300), || {
            checks += 1;
            let result = if checks < 5 {
                Err(missing())
            } else {
                Ok(checks)
            };
            async move { result }
        })
        .await;
        assert_eq!(served.unwrap(), 5);
        assert_eq!(start.elapsed(), Duration::from_secs(1 + 2 + 4 + 8));
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_at_the_bound_with_the_fix() {
        let start = Instant::now();
        let mut at = Vec::new();
        let result = wait_for(Duration::from_secs(100), || {
            at.push(start.elapsed().as_secs());
            async { Err::<(), _>(missing()) }
        })
        .await;
        // The last pause is cut short so that the last check falls on the bound.
        assert_eq!(at, [0, 1, 3, 7, 15, 31, 61, 91, 100]);
        let message = result.unwrap_err().to_string();
        assert_eq!(
            message,
            "the Mutex CRD is not installed: install it (waited 100 s for it)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_and_a_zero_bound_end_the_wait_at_once() {
        let start = Instant::now();
        let conflict = wait_for(Duration::from_secs(300), || async {
            Err::<(), _>(Error::Conflict)
        });
        assert!(matches!(conflict.await, Err(Error::Conflict)));
        let once = wait_for(Duration::ZERO, || async { Err::<(), _>(missing()) }).await;
        let message = once.unwrap_err().to_string();
        assert_eq!(message, "the Mutex CRD is not installed: install it");
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
