//! `cargo run -p verify --release -- [A|B|A-floor|A-floor-failover|A-sibling|A-pending|A-tenant|...|suite|all] [--broken status-cas|pod-check|token-floor|one-hold|trust-record|no-admission] [--threads N]`
//! `--first`: stop at the first counterexample (breadth-first, for the shortest trace).
//! Prints one `<N> states` line per configuration and every counterexample;
//! exits 1 if any property is broken.

use verify::check;
use verify::config::{Broken, Config};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut configs = Vec::new();
    let (mut broken, mut threads, mut max) = (None, 2, None);
    let (mut liveness, mut depth) = (true, None);
    let mut budgets: Vec<(String, u8)> = Vec::new();
    let mut first = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "A" => configs.push(Config::a()),
            "B" => configs.push(Config::b()),
            "A-floor" => configs.push(Config::a_floor()),
            "A-floor-failover" => configs.push(Config::a_floor_failover()),
            "B-delete-reserved" => configs.push(Config::b_delete_reserved()),
            "B-cancel-reserved" => configs.push(Config::b_cancel_reserved()),
            "A-sibling" => configs.push(Config::a_sibling()),
            "A-pending" => configs.push(Config::a_pending()),
            "A-pending-wipe" => configs.push(Config::a_pending_wipe()),
            "A-tenant" => configs.push(Config::a_tenant()),
            "A-marks-wiped" => configs.push(Config::a_marks_wiped()),
            "A-wipe-race" => configs.push(Config::a_wipe_race()),
            "B-wipe-stale-cache" => configs.push(Config::b_wipe_stale_cache()),
            "suite" => configs.extend(Config::suite()),
            "all" => configs.extend([Config::a(), Config::b(), Config::a_floor()]),
            "--broken" => broken = it.next().map(|g| guard(g)),
            "--threads" => threads = it.next().and_then(|n| n.parse().ok()).unwrap_or(2),
            "--no-liveness" => liveness = false,
            "--first" => first = true,
            "--disrupt" | "--crashes" | "--lags" | "--lapses" => {
                let n: u8 = it.next().and_then(|n| n.parse().ok()).expect("a number");
                budgets.push((a.clone(), n));
            }
            "--depth" => depth = it.next().and_then(|n| n.parse().ok()),
            "--max" => max = it.next().and_then(|n| n.parse().ok()),
            other => panic!("unknown argument {other}"),
        }
    }
    if configs.is_empty() {
        configs.extend([Config::a(), Config::b()]);
    }
    let (mut failed, mut total, start) = (false, 0, std::time::Instant::now());
    for mut cfg in configs {
        cfg.broken = broken;
        cfg.liveness = liveness;
        cfg.max_depth = depth;
        for (b, n) in &budgets {
            match b.as_str() {
                "--disrupt" => cfg.disrupt = *n,
                "--crashes" => cfg.crashes = *n,
                "--lags" => cfg.lags = *n,
                _ => cfg.lapses = *n,
            }
        }
        let r = check::run_bounded(cfg, threads, first || broken.is_some(), max);
        println!("{}", r.line());
        for (_, t) in &r.violations {
            println!("{t}");
        }
        failed |= !r.violations.is_empty();
        total += r.states;
    }
    println!(
        "summary: {total} states in {:.0} s, {}",
        start.elapsed().as_secs_f64(),
        if failed {
            "a property is violated"
        } else {
            "no property violated"
        }
    );
    std::process::exit(i32::from(failed));
}

fn guard(name: &str) -> Broken {
    match name {
        "status-cas" => Broken::StatusCas,
        "pod-check" => Broken::PodCheck,
        "token-floor" => Broken::TokenFloor,
        "one-hold" => Broken::OneHold,
        "trust-record" => Broken::TrustRecord,
        "no-admission" => Broken::NoAdmission,
        other => panic!("unknown guard {other}"),
    }
}
