//! Walks the model: every scenario with every rule on (each property must hold), then each
//! rule switched off in the scenario that shows its hole (a counterexample must be found).
//!
//! `cargo run --release -p zklock-model -- [--deep] [--threads N]`; `--deep` allows one more of
//! every fault (a crash, a term, a late write, a cut, a deletion) in every scenario.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use zklock_model::{check, shown_by, Rule, Rules, Scenario};

fn main() -> ExitCode {
    let mut deep = false;
    let mut threads = 2;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--deep" => deep = true,
            "--threads" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => threads = n,
                None => return usage("--threads takes a number of threads"),
            },
            other => return usage(&format!("unknown argument {other:?}")),
        }
    }
    let mut failed = false;
    println!("every rule on{}:", if deep { " (deep)" } else { "" });
    for scenario in Scenario::ALL {
        let report = check(scenario, Rules::all(), deep, threads, None);
        println!(
            "  {:?}: {} states ({} unique), depth {}, {:.1} s",
            scenario,
            report.states,
            report.unique_states,
            report.max_depth,
            report.elapsed.as_secs_f64()
        );
        for property in report.violated() {
            failed = true;
            println!("    VIOLATED {property}: {}", report.trace(property).unwrap_or_default());
        }
    }
    println!("each rule off, in the scenario that shows its hole:");
    for rule in Rule::ALL {
        let (scenario, property) = shown_by(rule);
        let report = check(scenario, Rules::all().without(rule), deep, threads, Some(property));
        let found = report.trace(property);
        println!(
            "  {rule} off ({:?}, {} unique states, {:.1} s): {}",
            scenario,
            report.unique_states,
            report.elapsed.as_secs_f64(),
            if found.is_some() { "counterexample" } else { "NO COUNTEREXAMPLE" }
        );
        match found {
            Some(trace) => println!("    {property}:\n    {trace}"),
            None => failed = true,
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("zklock-model: {why}\nusage: zklock-model [--deep] [--threads N]");
    ExitCode::from(2)
}
