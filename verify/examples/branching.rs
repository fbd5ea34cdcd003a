//! Measuring aid: along random walks, how many enabled actions of each kind.
use std::collections::BTreeMap;
use verify::action::Action;
use verify::config::Config;
use verify::model::LockModel;

fn kind(a: &Action) -> String {
    match a {
        Action::Env(e) => format!("{e:?}").split('(').next().unwrap().to_string(),
        Action::Sync { fresh, .. } => format!("Sync{fresh}"),
        other => format!("{other:?}").split(' ').next().unwrap().to_string(),
    }
}

fn main() {
    let m = LockModel::new(Config::a());
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let mut seed = 12345u64;
    for _ in 0..200 {
        let mut s = m.init();
        for _ in 0..30 {
            let mut acts = Vec::new();
            m.candidates(&s, &mut acts);
            let next: Vec<_> = acts
                .iter()
                .filter_map(|a| m.apply(&s, a).map(|n| (a.clone(), n)))
                .collect();
            if next.is_empty() {
                break;
            }
            for (a, _) in &next {
                *tally.entry(kind(a)).or_default() += 1;
            }
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s = next[(seed >> 33) as usize % next.len()].1.clone();
        }
    }
    for (k, v) in tally {
        println!("{k:>14} {v}");
    }
}
