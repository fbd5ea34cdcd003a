//! One writer per token ledger at a time, writing every record that waits (token_floor.rs).
//!
//! Many keys go idle at once after a burst (a thousand pull requests merged, a thousand free-form
//! keys each used once). Each records its last token in its namespace's one ledger ConfigMap
//! before its finalizer comes off. Written one by one, each a read and a compare-and-swap, they
//! all raced for that one object: most writes were refused (409) and retried, and at a thousand
//! keys, keys took many minutes to go idle. Here the records wait in line, and whoever's turn it
//! is writes them all in one compare-and-swap: no sibling of this replica refuses it, and a burst
//! costs one write per batch, not per key.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

/// Records waiting for one ledger: entry -> the highest token to record for it.
pub type Records = BTreeMap<String, i64>;

#[derive(Default)]
struct Line {
    waiting: Mutex<Records>,
    /// Held by the one writing this ledger now.
    turn: tokio::sync::Mutex<()>,
}

impl Line {
    fn add(&self, entry: &str, token: i64) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let t = waiting.entry(entry.to_string()).or_insert(token);
        *t = (*t).max(token);
    }

    fn take(&self) -> Records {
        std::mem::take(&mut *self.waiting.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A batch that was not written waits again, for the next turn.
    fn put_back(&self, batch: Records) {
        for (entry, token) in batch {
            self.add(&entry, token);
        }
    }
}

/// The ledgers' lines, by a ledger's identity (its namespace and kind of lock: the ClusterMutexes'
/// ledger may share a namespace with Mutexes, and is not dropped with that namespace).
#[derive(Default)]
pub struct LedgerWrites {
    lines: Mutex<HashMap<String, Arc<Line>>>,
}

impl LedgerWrites {
    /// Records `token` for `entry` of `ledger`, through `write`, which gets every record waiting
    /// for that ledger (this one among them) and writes them at once. Returns once this record
    /// is written: by this call, or by the call whose turn came first. A failed write puts its
    /// batch back, so whoever waits next tries again, and returns its error.
    pub async fn record<F, Fut, E>(
        &self,
        ledger: &str,
        entry: &str,
        token: i64,
        write: F,
    ) -> Result<(), E>
    where
        F: FnOnce(Records) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let line = self.line(ledger);
        line.add(entry, token);
        let result = {
            let _turn = line.turn.lock().await;
            // Empty: a turn before this one wrote this record (a failed one would have put it back).
            let batch = line.take();
            if batch.is_empty() {
                Ok(())
            } else {
                let result = write(batch.clone()).await;
                if result.is_err() {
                    line.put_back(batch);
                }
                result
            }
        };
        self.leave(ledger, line);
        result
    }

    fn line(&self, ledger: &str) -> Arc<Line> {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        lines.entry(ledger.to_string()).or_default().clone()
    }

    /// Forgets a ledger's line once nobody waits in it: namespaces come and go.
    fn leave(&self, ledger: &str, line: Arc<Line>) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let alone = Arc::strong_count(&line) == 2; // the map's and ours
        let empty = line
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty();
        if alone && empty {
            lines.remove(ledger);
        }
    }

    #[cfg(test)]
    fn lines(&self) -> usize {
        self.lines.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A ledger in memory whose every write waits for the test's go.
    #[derive(Default)]
    struct Ledger {
        data: Mutex<Records>,
        writes: AtomicUsize,
        fail_next: Mutex<bool>,
    }

    impl Ledger {
        async fn write(&self, batch: Records, gate: &tokio::sync::Notify) -> Result<(), String> {
            gate.notified().await;
            self.writes.fetch_add(1, Ordering::SeqCst);
            if std::mem::take(&mut *self.fail_next.lock().unwrap()) {
                return Err("refused".into());
            }
            let mut data = self.data.lock().unwrap();
            for (e, t) in batch {
                let v = data.entry(e).or_insert(t);
                *v = (*v).max(t);
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn records_that_wait_are_written_together_and_none_is_lost() {
        let (lines, ledger) = (
            Arc::new(LedgerWrites::default()),
            Arc::new(Ledger::default()),
        );
        let gate = Arc::new(tokio::sync::Notify::new());
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let (lines, ledger, gate) = (lines.clone(), ledger.clone(), gate.clone());
                tokio::spawn(async move {
                    let write = |b| async move { ledger.write(b, &gate).await };
                    lines.record("ns", &format!("mutex.k{i}"), i, write).await
                })
            })
            .collect();
        // Let every task queue up, then open the gate for each write that comes.
        tokio::task::yield_now().await;
        while !tasks.iter().all(|t| t.is_finished()) {
            gate.notify_waiters();
            tokio::task::yield_now().await;
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let data = ledger.data.lock().unwrap().clone();
        assert_eq!(data.len(), 50, "every record written");
        assert!((0..50).all(|i| data[&format!("mutex.k{i}")] == i));
        let writes = ledger.writes.load(Ordering::SeqCst);
        assert!(
            writes < 50,
            "{writes} writes: the waiting records were batched"
        );
        assert_eq!(lines.lines(), 0, "no line is kept once nobody waits");
    }

    #[tokio::test]
    async fn a_failed_write_puts_its_batch_back_for_the_next_turn() {
        let (lines, ledger) = (LedgerWrites::default(), Ledger::default());
        let gate = tokio::sync::Notify::new();
        gate.notify_one();
        *ledger.fail_next.lock().unwrap() = true;
        let first = lines
            .record("ns", "mutex.a", 3, |b| ledger.write(b, &gate))
            .await;
        assert_eq!(first, Err("refused".into()));
        assert_eq!(lines.lines(), 1, "the unwritten record still waits");
        gate.notify_one();
        lines
            .record("ns", "mutex.b", 1, |b| ledger.write(b, &gate))
            .await
            .unwrap();
        let data = ledger.data.lock().unwrap().clone();
        assert_eq!(
            data,
            Records::from([("mutex.a".into(), 3), ("mutex.b".into(), 1)])
        );
        assert_eq!(lines.lines(), 0);
    }
}
