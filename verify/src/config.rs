//! The bounds of a check and the guards it runs with.

/// One lock run: which keys it takes, its supersede group, and whose it is. Run i is the lock
/// run of PipelineRun i, unless it is a second lock task of another's (`sibling_of`).
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub keys: Vec<u8>,
    pub group: u8,
    /// `supersede: pending` (the default) or `none`.
    pub supersede: bool,
    /// A second lock task of PipelineRun `p`, on the same keys (its pipeline's, not a PipelineRun
    /// of its own): the two share one hold (issue 23 item 1).
    pub sibling_of: Option<u8>,
    /// `release-after` a task of its PipelineRun: its own section may end before the
    /// PipelineRun's (Env::SectionEnds).
    pub release_after: bool,
    /// A PipelineRun created `PipelineRunPending` with the key annotation, queued
    /// as a whole (issue 26): no lock run, the PipelineRun is its own member.
    pub pending: bool,
}

impl RunSpec {
    pub fn new(keys: Vec<u8>, group: u8, supersede: bool) -> RunSpec {
        RunSpec {
            keys,
            group,
            supersede,
            sibling_of: None,
            release_after: false,
            pending: false,
        }
    }

    /// A PipelineRun queued as a whole on `keys` (one key: the annotation names one).
    pub fn pending(keys: Vec<u8>, group: u8, supersede: bool) -> RunSpec {
        RunSpec {
            pending: true,
            ..RunSpec::new(keys, group, supersede)
        }
    }
}

/// A guard of the real code, removed in the model's I/O layer (test-only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// The Mutex status write ignores the resourceVersion read (no 409).
    StatusCas,
    /// The pod check before release: a holder's ended PipelineRun counts as
    /// having no live pod (sync.rs's mark_draining_holders skipped).
    PodCheck,
    /// The token floor: the API server's `lastToken >= oldSelf` rule (so a
    /// status wipe resets it) and the floor kept after a Mutex goes.
    TokenFloor,
    /// One hold per PipelineRun: the real decide's `release_ended_holders` judges
    /// each lock run alone (the switch behind the root crate's test-only feature).
    OneHold,
    /// The record of a PipelineRun queued as a whole is believed as its author wrote it
    /// (members.rs's vouching by the lock's status skipped).
    TrustRecord,
    /// The admission policies of a cluster install are missing (config/401 and 402): a tenant
    /// may start its own queued PipelineRun (clear its `spec.status`) and lower or remove its
    /// namespace's token ledger entries. Only the tenant's own writes change: the controller
    /// still cancels a queued run that started without its grant (`StartedWithoutGrant`).
    NoAdmission,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub name: &'static str,
    pub keys: u8,
    pub capacity: u32,
    pub replicas: u8,
    pub runs: Vec<RunSpec>,
    /// Disturbing user actions per trace (cancel, delete run/PipelineRun/Mutex,
    /// wipe the status, a timeout).
    pub disrupt: u8,
    /// Controller crashes per trace.
    pub crashes: u8,
    /// Syncs on a lagging cache per trace.
    pub lags: u8,
    /// Lease lapses per trace (both replicas act at once until one steps down).
    pub lapses: u8,
    /// Which user actions exist at all.
    pub users: Users,
    pub broken: Option<Broken>,
    /// Check No lost waiter (its calm continuation costs a few decisions per state).
    pub liveness: bool,
    /// Explore traces of at most this many steps (None: all of them).
    pub max_depth: Option<usize>,
}

#[derive(Clone, Copy, Debug)]
pub struct Users {
    pub cancel: bool,
    pub delete_run: bool,
    pub delete_pr: bool,
    /// Delete only PipelineRuns that are done with every pod ended (a pruner).
    pub prune_only: bool,
    pub delete_mutex: bool,
    pub wipe: bool,
    pub timeout: bool,
    /// A tenant writes a record on its own queued PipelineRun claiming a grant with the
    /// largest token (it may edit its PipelineRuns' annotations).
    pub forge: bool,
    /// A tenant clears `spec.status` on its own queued PipelineRun while it waits: policy 401
    /// refuses it unless `Broken::NoAdmission`.
    pub start_own: bool,
    /// A tenant writes its namespace's token ledger ConfigMap: raising an entry is allowed,
    /// lowering or removing one is refused by policy 402 unless `Broken::NoAdmission`.
    pub ledger: bool,
}

impl Users {
    pub const ALL: Users = Users {
        cancel: true,
        delete_run: true,
        delete_pr: true,
        prune_only: false,
        delete_mutex: true,
        wipe: true,
        timeout: true,
        forge: true,
        // The tenant's writes that only admission limits: the configurations of issue 46 alone.
        start_own: false,
        ledger: false,
    };

    /// No user action at all (Tekton and the pods still move).
    pub const NONE: Users = Users {
        cancel: false,
        delete_run: false,
        delete_pr: false,
        prune_only: false,
        delete_mutex: false,
        wipe: false,
        timeout: false,
        forge: false,
        start_own: false,
        ledger: false,
    };
}

impl Config {
    /// Config A: 2 replicas, 1 key of capacity 1, 3 PipelineRuns of one
    /// supersede group (run i is older than run i + 1).
    pub fn a() -> Config {
        let run = |group| RunSpec::new(vec![0], group, true);
        Config {
            name: "A",
            keys: 1,
            capacity: 1,
            replicas: 2,
            runs: vec![run(0), run(0), run(0)],
            disrupt: 1,
            crashes: 1,
            lags: 1,
            lapses: 1,
            users: Users::ALL,
            broken: None,
            liveness: true,
            max_depth: None,
        }
    }

    /// Config B: 2 replicas, 2 keys, a run of key 0, a run of key 1 and a run
    /// of both. Users delete only finished PipelineRuns, no lock run, and
    /// cancel nothing. A multi-key run's slot kept as a reservation was given up
    /// without the pod check when its run was deleted (issue 23 item 5, see
    /// [`Config::b_delete_reserved`]) or its PipelineRun stopped (found by
    /// this model, see [`Config::b_cancel_reserved`]); both are fixed.
    pub fn b() -> Config {
        let run = |keys: Vec<u8>, group| RunSpec::new(keys, group, false);
        Config {
            name: "B",
            keys: 2,
            capacity: 1,
            replicas: 2,
            runs: vec![run(vec![0], 0), run(vec![0, 1], 1), run(vec![1], 2)],
            disrupt: 1,
            crashes: 1,
            lags: 1,
            lapses: 1,
            users: Users {
                cancel: false,
                delete_run: false,
                prune_only: true,
                ..Users::ALL
            },
            broken: None,
            liveness: true,
            max_depth: None,
        }
    }

    /// The token floor's own check: config A where users prune finished
    /// PipelineRuns and wipe the status (two such acts), and nothing else.
    pub fn a_floor() -> Config {
        let users = Users {
            cancel: false,
            delete_run: false,
            delete_mutex: false,
            timeout: false,
            prune_only: true,
            ..Users::ALL
        };
        // A pure queue: a wiped status with the newer run pruned forgets the
        // group's supersede mark too (a limit, shown by `a_marks_wiped`).
        let runs = Config::a()
            .runs
            .into_iter()
            .map(|r| RunSpec {
                supersede: false,
                ..r
            })
            .collect();
        Config {
            name: "A-floor",
            disrupt: 2,
            users,
            runs,
            ..Config::a()
        }
    }

    /// A limit: wipe the status and prune the newest granted PipelineRun, and
    /// nothing remembers that an older run of its group is stale.
    pub fn a_marks_wiped() -> Config {
        let runs = Config::a().runs;
        Config {
            name: "A-marks-wiped",
            runs,
            crashes: 0,
            lapses: 0,
            ..Config::a_floor()
        }
    }

    /// Issue 23 item 6 (known): prune a finished PipelineRun and delete the
    /// Mutex; the floor kept in one replica's memory is lost on failover.
    pub fn a_floor_failover() -> Config {
        let users = Users {
            wipe: false,
            ..Config::a_floor().users
        };
        Config {
            name: "A-floor-failover",
            users: Users {
                delete_mutex: true,
                ..users
            },
            ..Config::a_floor()
        }
    }

    /// Issue 23 item 5 (fixed): config B where a user may delete a lock run.
    pub fn b_delete_reserved() -> Config {
        let users = Users {
            delete_run: true,
            ..Config::b().users
        };
        Config {
            name: "B-delete-reserved",
            users,
            crashes: 0,
            lags: 0,
            lapses: 0,
            ..Config::b()
        }
    }

    /// Found by this model: config B where a user may cancel a PipelineRun.
    pub fn b_cancel_reserved() -> Config {
        let users = Users {
            cancel: true,
            ..Config::b().users
        };
        Config {
            name: "B-cancel-reserved",
            users,
            crashes: 0,
            lags: 0,
            lapses: 0,
            ..Config::b()
        }
    }

    /// Issue 23 item 1: pr-0 takes the key through two lock tasks: run-0 has
    /// `release-after` a task that ends while pr-0 still runs, and run-2 guards
    /// the rest; pr-1 waits. 2 replicas, capacity 1, no supersede, a crash and a
    /// lagging sync.
    pub fn a_sibling() -> Config {
        let section = RunSpec {
            release_after: true,
            ..RunSpec::new(vec![0], 0, false)
        };
        let sibling = RunSpec {
            sibling_of: Some(0),
            ..RunSpec::new(vec![0], 0, false)
        };
        Config {
            name: "A-sibling",
            runs: vec![section, RunSpec::new(vec![0], 1, false), sibling],
            disrupt: 0,
            lapses: 0,
            ..Config::a()
        }
    }

    /// Issue 26: config A where pr-0 and pr-2 are PipelineRuns queued as a whole
    /// (created Pending, guarded by annotations) and pr-1 takes the key through a
    /// lock task, all of one supersede group: the two kinds exclude each other in
    /// both orders, a newer run supersedes an older one of the other kind, and a
    /// grant starts a pending PipelineRun only as it was read.
    ///
    /// Issue 37: a tenant may also write any record on its own queued PipelineRuns
    /// (`forge`). A status wipe is left out: the lock's status is the only record of
    /// a queued PipelineRun's grant that its author cannot write, so a wipe forgets it
    /// (a limit, shown by `a_pending_wipe`).
    pub fn a_pending() -> Config {
        let pending = || RunSpec::pending(vec![0], 0, true);
        Config {
            name: "A-pending",
            runs: vec![pending(), RunSpec::new(vec![0], 0, true), pending()],
            users: Users {
                wipe: false,
                ..Users::ALL
            },
            ..Config::a()
        }
    }

    /// A limit: a status wiped by hand while a queued PipelineRun holds the key
    /// forgets that hold (its record, an annotation, is not believed).
    pub fn a_pending_wipe() -> Config {
        let users = Users {
            cancel: false,
            delete_run: false,
            delete_pr: false,
            delete_mutex: false,
            timeout: false,
            forge: false,
            ..Users::ALL
        };
        Config {
            name: "A-pending-wipe",
            users,
            crashes: 0,
            lags: 0,
            lapses: 0,
            liveness: false,
            ..Config::a_pending()
        }
    }

    /// Found by this model: a status wipe while a deposed leader still has a
    /// grant's `Acquired` write in flight (config A, a wipe and a lease lapse).
    pub fn a_wipe_race() -> Config {
        let users = Users {
            cancel: false,
            delete_run: false,
            delete_pr: false,
            delete_mutex: false,
            timeout: false,
            ..Users::ALL
        };
        Config {
            name: "A-wipe-race",
            users,
            crashes: 0,
            lags: 0,
            liveness: false,
            ..Config::a()
        }
    }

    /// Found by this model: a status wipe, then a sync whose run cache lags
    /// behind a fresh multi-key commit (config B, one replica).
    pub fn b_wipe_stale_cache() -> Config {
        let users = Users {
            cancel: false,
            delete_run: false,
            delete_pr: false,
            delete_mutex: false,
            timeout: false,
            ..Users::ALL
        };
        Config {
            name: "B-wipe-stale-cache",
            users,
            crashes: 0,
            lapses: 0,
            liveness: false,
            ..Config::b()
        }
    }

    /// Issue 46: config A-pending's tenant as the admission policies limit it, and no more. It
    /// may start its own queued PipelineRuns (policy 401 refuses that), write its namespace's
    /// token ledger (policy 402 lets an entry rise, never fall) and delete the Mutex, after
    /// which the ledger's floor is what keeps tokens from repeating: two such acts per trace.
    pub fn a_tenant() -> Config {
        let users = Users {
            start_own: true,
            ledger: true,
            delete_mutex: true,
            ..Users::NONE
        };
        Config {
            name: "A-tenant",
            users,
            disrupt: 2,
            crashes: 0,
            lags: 0,
            lapses: 0,
            ..Config::a_pending()
        }
    }

    /// What hack/verify.sh checks: each configuration exhaustively, with the
    /// fault kinds it names at one each (the full product of all of them in
    /// one configuration is beyond 10 minutes here). Every one passes on the
    /// real code; the combinations left out are the known bugs above.
    pub fn suite() -> Vec<Config> {
        let a = Config::a();
        let b = Config::b();
        let no_wipe = Users {
            wipe: false,
            ..Users::ALL
        };
        vec![
            Config {
                name: "A[users,crash]",
                lags: 0,
                lapses: 0,
                ..a.clone()
            },
            Config {
                name: "A[crash,lapse,lag]",
                disrupt: 0,
                ..a.clone()
            },
            // The largest: No lost waiter is left to the others (its calm continuation
            // costs a few decisions per state), the invariants are checked in full.
            Config {
                name: "A[users-but-wipe,lapse]",
                users: no_wipe,
                crashes: 0,
                lags: 0,
                liveness: false,
                ..a.clone()
            },
            Config {
                name: "B[users-but-wipe,lag]",
                users: Users {
                    wipe: false,
                    ..b.users
                },
                crashes: 0,
                lapses: 0,
                ..b.clone()
            },
            Config {
                name: "B[crash,lapse]",
                disrupt: 0,
                lags: 0,
                ..b
            },
            Config::b_cancel_reserved(),
            Config::b_delete_reserved(),
            Config::a_sibling(),
            Config {
                name: "A-pending[users,crash]",
                lags: 0,
                lapses: 0,
                ..Config::a_pending()
            },
            Config {
                name: "A-pending[lapse,lag]",
                disrupt: 0,
                crashes: 0,
                ..Config::a_pending()
            },
            Config {
                name: "A-floor-failover[no lag, no lapse]",
                lags: 0,
                lapses: 0,
                ..Config::a_floor_failover()
            },
            Config {
                name: "A-floor[prune+wipe,lag]",
                crashes: 0,
                lapses: 0,
                ..Config::a_floor()
            },
            // A crash and a lag apart: together, with the Mutex deleted, they find the Supersede
            // counterexample that A-pending[users,crash] finds with a lag added (the new leader's
            // lagging cache of lock runs hides the newer grant whose mark went with the Mutex).
            Config {
                name: "A-tenant[tenant,crash]",
                crashes: 1,
                ..Config::a_tenant()
            },
            Config {
                name: "A-tenant[tenant,lag]",
                lags: 1,
                ..Config::a_tenant()
            },
        ]
    }

    pub fn with_broken(mut self, b: Broken) -> Config {
        self.broken = Some(b);
        self
    }

    pub fn guarded(&self, b: Broken) -> bool {
        self.broken != Some(b)
    }

    /// The PipelineRun lock run `i` belongs to.
    pub fn pr_of(&self, i: usize) -> usize {
        self.runs[i].sibling_of.map_or(i, usize::from)
    }

    /// Is index `i` a PipelineRun of its own (not a sibling lock run)?
    pub fn is_pr(&self, i: usize) -> bool {
        self.runs[i].sibling_of.is_none()
    }

    /// The lock runs of PipelineRun `p`.
    pub fn runs_of_pr(&self, p: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.runs.len()).filter(move |&i| self.pr_of(i) == p)
    }

    pub fn runs_of(&self, key: u8) -> impl Iterator<Item = usize> + '_ {
        (0..self.runs.len()).filter(move |&i| self.runs[i].keys.contains(&key))
    }

    pub fn groups(&self) -> usize {
        self.runs
            .iter()
            .map(|r| r.group as usize + 1)
            .max()
            .unwrap_or(0)
    }
}
