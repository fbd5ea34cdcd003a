//! The stateright model: initial state, the actions enabled in a state, and
//! the step each takes.

use crate::action::Action;
use crate::config::Config;
use crate::controller;
use crate::env;
use crate::props::{self, EXCLUSION, FENCING, NO_LOST_WAITER, SUPERSEDE};
use crate::world::{Api, Ghost, State};
use stateright::{Model, Property};
use tekton_mutex_promise::{Fence, Newest};

pub struct LockModel {
    pub cfg: Config,
}

impl LockModel {
    pub fn new(cfg: Config) -> Self {
        LockModel { cfg }
    }

    pub fn init(&self) -> State {
        let cfg = &self.cfg;
        let n = cfg.runs.len();
        let api = Api {
            mutexes: vec![None; cfg.keys as usize],
            next_uid: 0,
            runs: vec![Default::default(); n],
            prs: vec![Default::default(); n],
            timed_out: vec![false; n],
            ledger: vec![0; cfg.keys as usize],
        };
        let mut s = State {
            api,
            replicas: (0..cfg.replicas)
                .map(|_| controller::fresh_replica(cfg))
                .collect(),
            ghost: Ghost {
                fences: vec![Fence::default(); cfg.keys as usize],
                newest_granted: vec![Newest::default(); cfg.groups()],
                broken: None,
            },
            disrupt_left: cfg.disrupt,
            crashes_left: cfg.crashes,
            lags_left: cfg.lags,
            leaders: 1,
            lapses_left: cfg.lapses,
        };
        for k in 0..cfg.keys as usize {
            crate::exec::create_mutex(&mut s, k);
        }
        for r in 0..s.replicas.len() {
            controller::relist(&mut s, r);
        }
        s
    }

    /// Apply `a` to a copy of `s`; None if it is not enabled or changes nothing.
    pub fn apply(&self, s: &State, a: &Action) -> Option<State> {
        let mut n = self.apply_raw(s, a)?;
        crate::canon::canonical(&mut n);
        Some(n)
    }

    /// As [`apply`](Self::apply), with the resourceVersions as they come (for traces).
    pub fn apply_raw(&self, s: &State, a: &Action) -> Option<State> {
        let cfg = &self.cfg;
        let mut n = s.clone();
        let ok = match *a {
            Action::Env(e) if e.disturbs() && n.disrupt_left == 0 => false,
            Action::Env(e) => {
                let ok = env::apply(cfg, &mut n, e);
                if ok && e.disturbs() {
                    n.disrupt_left -= 1;
                }
                ok
            }
            Action::Sync { rep, key, fresh } => {
                let r = &n.replicas[rep as usize];
                let lead = n.leaders & (1 << rep) != 0;
                let ready = lead && r.listed && r.sync.is_none() && (fresh == 7 || n.lags_left > 0);
                ready && {
                    if fresh != 7 {
                        n.lags_left -= 1;
                    }
                    for (b, obj) in controller::KINDS.into_iter().enumerate() {
                        if fresh & (1 << b) != 0 {
                            controller::deliver(cfg, &mut n, rep as usize, obj);
                        }
                    }
                    controller::sync(cfg, &mut n, rep as usize, key)
                }
            }
            Action::Write { rep, then_crash } => {
                let last = n.replicas[rep as usize]
                    .sync
                    .as_ref()
                    .is_some_and(|x| x.writes.len() == 1);
                crate::exec::step(cfg, &mut n, rep as usize);
                !then_crash
                    || (last && n.crashes_left > 0 && {
                        crash(cfg, &mut n, rep);
                        true
                    })
            }
            Action::Crash { rep }
                if n.crashes_left > 0 && n.replicas[rep as usize].sync.is_some() =>
            {
                crash(cfg, &mut n, rep);
                true
            }
            Action::Crash { .. } => false,
            Action::Lapse { key } => {
                n.lapses_left > 0 && cfg.replicas > 1 && n.replicas.iter().all(|r| r.listed) && {
                    n.lapses_left -= 1;
                    let old = n.leaders.trailing_zeros() as usize;
                    n.leaders = ((1u8 << cfg.replicas) - 1) & !n.leaders;
                    if n.replicas[old].sync.is_none() {
                        for obj in controller::KINDS {
                            controller::deliver(cfg, &mut n, old, obj);
                        }
                        controller::sync(cfg, &mut n, old, key);
                    }
                    true
                }
            }
            Action::Relist { rep } => {
                !n.replicas[rep as usize].listed && {
                    controller::relist(&mut n, rep as usize);
                    true
                }
            }
            Action::Ensure { rep, key } => {
                n.replicas[rep as usize].listed && n.leaders & (1 << rep) != 0 && {
                    for obj in controller::KINDS {
                        controller::deliver(cfg, &mut n, rep as usize, obj);
                    }
                    controller::ensure(cfg, &mut n, rep as usize, key)
                }
            }
        };
        (ok && n != *s).then_some(n)
    }

    pub fn candidates(&self, s: &State, out: &mut Vec<Action>) {
        let cfg = &self.cfg;
        let mut envs = Vec::new();
        env::candidates(cfg, &mut envs);
        out.extend(envs.into_iter().map(Action::Env));
        out.extend((0..cfg.keys).map(|key| Action::Lapse { key }));
        for rep in 0..cfg.replicas {
            let r = &s.replicas[rep as usize];
            if !r.listed {
                out.push(Action::Relist { rep });
                continue;
            }
            if r.sync.is_some() {
                out.push(Action::Write {
                    rep,
                    then_crash: false,
                });
                out.push(Action::Write {
                    rep,
                    then_crash: true,
                });
            } else {
                for key in 0..cfg.keys {
                    // Only kinds whose cache is behind make a different sync.
                    let behind: Vec<usize> = (0..3)
                        .filter(|&b| controller::stale(cfg, s, rep as usize, controller::KINDS[b]))
                        .collect();
                    // Every cache fresh, or one kind lagging: a sync on caches that
                    // all lag is a sync made earlier, except for its API reads.
                    for (mask, lagging) in [(7u8, None), (6, Some(0)), (5, Some(1)), (3, Some(2))] {
                        if lagging.is_none_or(|b| behind.contains(&b) && s.lags_left > 0) {
                            out.push(Action::Sync {
                                rep,
                                key,
                                fresh: mask,
                            });
                        }
                    }
                }
            }
            out.push(Action::Crash { rep });
            out.extend((0..cfg.keys).map(|key| Action::Ensure { rep, key }));
        }
    }
}

/// Two replicas are alike: a state and its replicas swapped are one (for the
/// depth-first check with symmetry reduction).
pub fn representative(s: &State) -> State {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
    let mut s = s.clone();
    if h.hash_one(&s.replicas[1]) < h.hash_one(&s.replicas[0]) {
        s.replicas.swap(0, 1);
        // The lease bits follow their replicas.
        s.leaders = (s.leaders & 1) << 1 | (s.leaders >> 1) & 1;
    }
    s
}

/// A restart: its lease, if it had it alone, goes to the other replica.
fn crash(cfg: &Config, n: &mut State, rep: u8) {
    n.crashes_left -= 1;
    controller::crash(cfg, n, rep as usize);
    // It restarts and lists at once: when it lists changes nothing until it leads.
    controller::relist(n, rep as usize);
    n.leaders &= !(1 << rep);
    if n.leaders == 0 {
        n.leaders = ((1u8 << cfg.replicas) - 1) & !(1 << rep);
    }
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.init()]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        self.candidates(s, actions);
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        self.apply(s, &a)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties()
    }

    /// A safety net against unbounded resourceVersions (a write loop): such
    /// states are not explored further (and would show in the state count).
    fn within_boundary(&self, s: &State) -> bool {
        s.api.mutexes.iter().flatten().all(|m| m.rv < 60) && s.api.runs.iter().all(|r| r.rv < 60)
    }

    fn format_action(&self, a: &Action) -> String {
        a.describe()
    }
}

/// The four properties, each judged by its function in [`props`].
fn properties() -> Vec<Property<LockModel>> {
    vec![
        Property::always(EXCLUSION, |m, s| props::over_capacity(&m.cfg, s).is_none()),
        Property::always(FENCING, |_, s| !props::broke(s, FENCING)),
        Property::always(SUPERSEDE, |_, s| !props::broke(s, SUPERSEDE)),
        Property::always(NO_LOST_WAITER, |m, s| {
            !m.cfg.liveness || props::lost_waiter(&m.cfg, s).is_none()
        }),
    ]
}
