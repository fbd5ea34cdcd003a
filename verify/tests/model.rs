//! The model checks (issue 25): no counterexample with the real guards, and one
//! for each guard removed in the model's I/O layer.

use verify::check;
use verify::config::{Broken, Config};
use verify::props;

fn threads() -> usize {
    2
}

#[test]
fn config_a_has_no_counterexample() {
    let r = check::run(Config::a(), threads(), false);
    println!("{}", r.line());
    for (_, t) in &r.violations {
        println!("{t}");
    }
    assert!(r.violations.is_empty(), "{}", r.line());
    assert!(r.states > 1000, "the model explores more than a handful of states");
}

#[test]
fn config_b_has_no_counterexample() {
    let r = check::run(Config::b(), threads(), false);
    println!("{}", r.line());
    for (_, t) in &r.violations {
        println!("{t}");
    }
    assert!(r.violations.is_empty(), "{}", r.line());
}

/// With guard `b` removed, the checker (stopping at the first broken property)
/// finds a counterexample to one of `expected`, in config A.
fn must_break(b: Broken, expected: &[&str]) {
    let r = check::run(Config::a().with_broken(b), threads(), true);
    println!("{}", r.line());
    let found = r.violations.iter().find(|v| expected.contains(&v.0));
    let Some((_, trace)) = found else {
        panic!("no counterexample to {expected:?} with {b:?} removed: {}", r.line());
    };
    println!("{trace}");
    assert!(trace.contains("Counterexample"));
}

#[test]
fn without_the_status_cas_exclusion_breaks() {
    must_break(Broken::StatusCas, &[props::EXCLUSION, props::FENCING]);
}

#[test]
fn without_the_pod_check_exclusion_breaks() {
    must_break(Broken::PodCheck, &[props::EXCLUSION]);
}

#[test]
fn without_the_token_floor_fencing_breaks() {
    must_break(Broken::TokenFloor, &[props::FENCING]);
}
