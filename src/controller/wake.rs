//! Wake-ups one lock's sync asks of another lock's controller: the lock that sees a deadlock
//! across keys may not be the one whose waiter must end (reconcile/deadlocks.rs).

use crate::core::deadlock::{LockId, LockScope};
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::Mutex;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use kube::runtime::reflector::ObjectRef;

/// The wake-ups a sync asks of other locks' controllers.
#[derive(Clone)]
pub struct Wake {
    mutexes: UnboundedSender<ObjectRef<Mutex>>,
    cluster_mutexes: UnboundedSender<ObjectRef<ClusterMutex>>,
}

/// What each controller reconciles on, beside its watches.
pub struct Woken {
    pub mutexes: UnboundedReceiver<ObjectRef<Mutex>>,
    pub cluster_mutexes: UnboundedReceiver<ObjectRef<ClusterMutex>>,
}

impl Wake {
    pub fn new() -> (Wake, Woken) {
        let (m_tx, m_rx) = unbounded();
        let (c_tx, c_rx) = unbounded();
        let wake = Wake {
            mutexes: m_tx,
            cluster_mutexes: c_tx,
        };
        let woken = Woken {
            mutexes: m_rx,
            cluster_mutexes: c_rx,
        };
        (wake, woken)
    }

    /// Ask for a sync of `lock` (dropped when no controller of its kind runs).
    pub fn lock(&self, lock: &LockId) {
        // A send fails only once that controller has stopped: nothing is left to wake.
        match &lock.scope {
            LockScope::Namespace(ns) => {
                let _ = (self.mutexes).unbounded_send(ObjectRef::new(&lock.name).within(ns));
            }
            LockScope::Cluster => {
                let _ = (self.cluster_mutexes).unbounded_send(ObjectRef::new(&lock.name));
            }
        }
    }
}

/// For a Context built without controllers (tests): wake-ups go nowhere.
impl Default for Wake {
    fn default() -> Self {
        Wake::new().0
    }
}
