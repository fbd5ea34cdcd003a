//! The lock's promise, stated once. A *section* is one PipelineRun's work under a grant of a
//! key: it starts when the work starts and lasts until the work's pods have ended. Three rules
//! judge sections:
//! - **Exclusion:** per key, at no instant more distinct PipelineRuns with a live section
//!   than the key's capacity;
//! - **Fencing:** per key, each section's token is above every token a section of the key
//!   started with before it (so none is reused);
//! - **Supersede:** per group, no section starts for a run older than one already granted.
//!
//! The model checker (`verify/`) applies the rules to every grant of every state it explores;
//! the fault campaign (`tests/chaos/`) replays each round's recorded history through
//! [`replay`]. One definition of "correct" serves both.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

/// Exclusion: `live` distinct PipelineRuns hold live sections of a key of `capacity`.
pub fn exclusion(live: usize, capacity: usize) -> Result<(), String> {
    if live > capacity {
        return Err(format!(
            "{live} sections alive at once (capacity {capacity})"
        ));
    }
    Ok(())
}

/// Fencing for one key: the highest token a section of it started with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fence {
    top: i64,
}

impl Fence {
    /// A section starts with `token`: it must be positive and above every token before it.
    pub fn admit(&mut self, token: i64) -> Result<(), String> {
        let top = self.top;
        self.top = top.max(token);
        if token <= 0 {
            return Err(format!("a section started without a token ({token})"));
        }
        if token <= top {
            return Err(format!("token {token} is not above {top}, given before"));
        }
        Ok(())
    }
}

/// Supersede for one group: the newest run granted so far, by the group's own age order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Newest<A> {
    newest: Option<A>,
}

impl<A> Default for Newest<A> {
    fn default() -> Self {
        Newest { newest: None }
    }
}

impl<A: Ord + Clone + Debug> Newest<A> {
    /// A run of age `age` is granted: no newer run of the group may have been granted before.
    pub fn admit(&mut self, age: &A) -> Result<(), String> {
        let before = self.newest.clone();
        if before.as_ref().is_none_or(|n| n < age) {
            self.newest = Some(age.clone());
        }
        match before {
            Some(n) if &n > age => Err(format!("{age:?} granted after the newer {n:?}")),
            _ => Ok(()),
        }
    }
}

/// A section as a history records it. Instants are any monotonic clock (ms, steps).
#[derive(Clone, Debug)]
pub struct Section<A> {
    pub pipeline_run: String,
    pub key: String,
    pub token: i64,
    pub start: u64,
    pub end: u64,
    /// Its supersede group and age, where supersede is on for it.
    pub supersede: Option<(String, A)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    Exclusion,
    Fencing,
    Supersede,
}

/// A rule a history breaks: on which key, at which instant, and how.
#[derive(Clone, Debug)]
pub struct Broken {
    pub rule: Rule,
    pub key: String,
    pub at: u64,
    pub detail: String,
}

/// Replays the sections of one key, in the order they start, through the three rules.
///
/// Fencing and Supersede are rules of *grant* order. A history sees start order, which is grant
/// order only when one section at a time can run: with a larger capacity the history checks only
/// that no token is shared, and Supersede is left to the capacity-1 keys.
pub fn replay<A: Ord + Clone + Debug>(
    key: &str,
    capacity: usize,
    sections: &[&Section<A>],
) -> Vec<Broken> {
    let mut out = exclusion_over_time(key, capacity, sections);
    let mut sorted = sections.to_vec();
    sorted.sort_by_key(|s| s.start);
    let mut fence = Fence::default();
    let mut owners: BTreeMap<i64, &str> = BTreeMap::new();
    let mut newest: BTreeMap<&str, Newest<A>> = BTreeMap::new();
    for s in sorted {
        let broken = |rule, detail: String| Broken {
            rule,
            key: key.into(),
            at: s.start,
            detail: format!("{}: {detail}", s.pipeline_run),
        };
        let owner = owners.insert(s.token, &s.pipeline_run);
        if let Some(other) = owner.filter(|o| *o != s.pipeline_run) {
            out.push(broken(
                Rule::Fencing,
                format!("token {} also {other}'s", s.token),
            ));
        } else if owner.is_none() {
            let verdict = match capacity {
                1 => fence.admit(s.token),
                _ => Fence::default().admit(s.token), // only "has a token"
            };
            out.extend(verdict.err().map(|d| broken(Rule::Fencing, d)));
        }
        if let Some((group, age)) = s.supersede.as_ref().filter(|_| capacity == 1) {
            let verdict = newest.entry(group).or_default().admit(age);
            out.extend(verdict.err().map(|d| broken(Rule::Supersede, d)));
        }
    }
    out
}

/// Exclusion over time: the first instant each excess begins (an end and a start at the same
/// instant do not overlap).
fn exclusion_over_time<A>(key: &str, capacity: usize, sections: &[&Section<A>]) -> Vec<Broken> {
    let mut edges: Vec<(u64, bool, &str)> = sections
        .iter()
        .flat_map(|s| {
            [
                (s.start, true, &*s.pipeline_run),
                (s.end, false, &*s.pipeline_run),
            ]
        })
        .collect();
    edges.sort_by_key(|&(at, is_start, _)| (at, is_start));
    let mut live: BTreeMap<&str, usize> = BTreeMap::new();
    let mut over = false;
    let mut out = Vec::new();
    for (at, is_start, pr) in edges {
        let count = live.entry(pr).or_default();
        if is_start {
            *count += 1;
        } else {
            *count = count.saturating_sub(1);
        }
        live.retain(|_, n| *n > 0);
        let verdict = exclusion(live.len(), capacity);
        if let (Err(d), false, true) = (&verdict, over, is_start) {
            let names: BTreeSet<&str> = live.keys().copied().collect();
            let names: Vec<&str> = names.into_iter().collect();
            out.push(Broken {
                rule: Rule::Exclusion,
                key: key.into(),
                at,
                detail: format!("{d}: {}", names.join(", ")),
            });
        }
        over = verdict.is_err();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(pr: &str, token: i64, start: u64, end: u64, age: Option<i64>) -> Section<i64> {
        Section {
            pipeline_run: pr.into(),
            key: "k".into(),
            token,
            start,
            end,
            supersede: age.map(|a| ("g".to_string(), a)),
        }
    }

    fn rules(capacity: usize, sections: &[Section<i64>]) -> Vec<Rule> {
        let refs: Vec<&Section<i64>> = sections.iter().collect();
        replay("k", capacity, &refs)
            .into_iter()
            .map(|b| b.rule)
            .collect()
    }

    #[test]
    fn a_clean_handover_keeps_every_rule() {
        let h = [
            section("a", 1, 0, 10, Some(1)),
            section("b", 2, 10, 20, Some(2)),
        ];
        assert!(rules(1, &h).is_empty());
    }

    #[test]
    fn an_overlap_breaks_exclusion_once() {
        let h = [section("a", 1, 0, 10, None), section("b", 2, 5, 20, None)];
        assert_eq!(rules(1, &h), [Rule::Exclusion]);
        assert!(rules(2, &h).is_empty());
    }

    #[test]
    fn two_sections_of_one_pipelinerun_are_one_holder() {
        let h = [section("a", 1, 0, 10, None), section("a", 1, 2, 8, None)];
        assert!(rules(1, &h).is_empty());
    }

    #[test]
    fn a_lower_or_shared_token_breaks_fencing() {
        let lower = [section("a", 2, 0, 10, None), section("b", 1, 10, 20, None)];
        assert_eq!(rules(1, &lower), [Rule::Fencing]);
        let shared = [section("a", 1, 0, 10, None), section("b", 1, 0, 10, None)];
        assert_eq!(rules(2, &shared), [Rule::Fencing]);
        let none = [section("a", 0, 0, 10, None)];
        assert_eq!(rules(1, &none), [Rule::Fencing]);
    }

    #[test]
    fn an_older_run_after_a_newer_one_breaks_supersede() {
        let h = [
            section("b", 1, 0, 10, Some(2)),
            section("a", 2, 10, 20, Some(1)),
        ];
        assert_eq!(rules(1, &h), [Rule::Supersede]);
    }

    #[test]
    fn the_rules_alone() {
        assert!(exclusion(2, 2).is_ok() && exclusion(3, 2).is_err());
        let mut f = Fence::default();
        assert!(f.admit(1).is_ok() && f.admit(3).is_ok());
        assert!(f.admit(2).is_err() && f.admit(4).is_ok());
        let mut n = Newest::default();
        assert!(n.admit(&5).is_ok() && n.admit(&5).is_ok() && n.admit(&4).is_err());
    }
}
