//! Canonical resourceVersions. Only their equality matters (a write carries
//! the version it read; the object's own is always the newest), so two states
//! that differ only in how many writes led there are one: versions are
//! renumbered by rank among all that the state still refers to.

use crate::world::{State, Write};

pub fn canonical(s: &mut State) {
    for k in 0..s.api.mutexes.len() {
        let ranks = ranks(mutex_rvs(s, k));
        for_each_mutex_rv(s, k, |rv| *rv = rank(&ranks, *rv));
    }
    for i in 0..s.api.runs.len() {
        let mut seen = Vec::new();
        for_each_run_rv(s, i, |rv| seen.push(u16::from(*rv)));
        let ranks = ranks(seen);
        for_each_run_rv(s, i, |rv| *rv = rank(&ranks, u16::from(*rv)) as u8);
    }
}

/// A version no reference to key `k`'s Mutex uses: for a Mutex created again
/// (a stale write for the one that went must not match it).
pub fn fresh_mutex_rv(s: &State, k: usize) -> u16 {
    mutex_rvs(s, k).into_iter().max().map_or(0, |m| m + 1)
}

fn mutex_rvs(s: &State, k: usize) -> Vec<u16> {
    let mut seen: Vec<u16> = s.api.mutexes[k].iter().map(|m| m.rv).collect();
    for r in &s.replicas {
        seen.extend(r.cache.mutexes[k].iter().map(|m| m.rv));
        let writes = r
            .sync
            .iter()
            .filter(|x| x.key as usize == k)
            .flat_map(|x| &x.writes);
        seen.extend(writes.filter_map(|w| match w {
            Write::CheckCurrent { rv }
            | Write::Protect { rv }
            | Write::Status { rv, .. }
            | Write::Unprotect { rv, .. } => Some(*rv),
            _ => None,
        }));
    }
    seen
}

fn ranks(mut v: Vec<u16>) -> Vec<u16> {
    v.sort_unstable();
    v.dedup();
    v
}

fn rank(ranks: &[u16], rv: u16) -> u16 {
    ranks.binary_search(&rv).map_or(rv, |r| r as u16)
}

fn for_each_mutex_rv(s: &mut State, k: usize, mut f: impl FnMut(&mut u16)) {
    if let Some(m) = &mut s.api.mutexes[k] {
        f(&mut m.rv);
    }
    for r in &mut s.replicas {
        if let Some(m) = &mut r.cache.mutexes[k] {
            f(&mut m.rv);
        }
        let Some(sync) = r.sync.as_mut().filter(|x| x.key as usize == k) else {
            continue;
        };
        for w in &mut sync.writes {
            match w {
                Write::CheckCurrent { rv }
                | Write::Protect { rv }
                | Write::Status { rv, .. }
                | Write::Unprotect { rv, .. } => f(rv),
                _ => {}
            }
        }
    }
}

fn for_each_run_rv(s: &mut State, i: usize, mut f: impl FnMut(&mut u8)) {
    f(&mut s.api.runs[i].rv);
    for r in &mut s.replicas {
        f(&mut r.cache.runs[i].rv);
        for w in r.sync.iter_mut().flat_map(|x| x.writes.iter_mut()) {
            match w {
                Write::Commit { run, run_rv, .. }
                | Write::Revoke { run, run_rv, .. }
                | Write::Tell { run, run_rv, .. }
                    if *run as usize == i =>
                {
                    f(run_rv)
                }
                _ => {}
            }
        }
    }
}
